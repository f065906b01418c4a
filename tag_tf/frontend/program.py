"""The user's graph and its compiled form.

`GraphInfo` tells which runs of a user graph train; `capture` snapshots the graph for the IR;
`Program` is the compiled graph, live in a tf.Graph, with name maps from the user's graph; a
`Runner` runs one user session's ops and tensors on it."""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from tag_tf.errors import CompileError, GraphError
from tag_tf.frontend.planning import Plan
from tag_tf.frontend.session_patch import original_do_run
from tag_tf.frontend.target import Target

if TYPE_CHECKING:
    from collections.abc import Callable

    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef
    from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

    from tag_tf.analysis import Analysis
    from tag_tf.compiler import Compiled
    from tag_tf.compiler.localize import TaskGraph
    from tag_tf.ir.graph import Graph

# Fed values by tensor name: what `BaseSession._do_run` receives (TensorFlow has made each an array).
Feeds = Mapping[str, np.ndarray]

# Ops that initialise state other than variables (replayed in the compiled session at migration).
_STATE_INIT_OPS = frozenset({"MakeIterator", "InitializeTable", "InitializeTableV2", "InitializeTableFromTextFile",
                             "InitializeTableFromTextFileV2", "InitializeTableFromDataset",
                             "LookupTableImport", "LookupTableImportV2"})
_BATCH_SOURCES = frozenset({"Placeholder", "IteratorGetNext"})
_COLLECTIONS = ("variables", "trainable_variables", "local_variables", "train_op", "losses", "global_step")


# =============================================================================================
# What is known about a user's graph (cached per graph version)
# =============================================================================================
@dataclasses.dataclass(frozen=True)
class GraphInfo:
    version: int
    updates: frozenset[str]            # training updates (opsets.training_updates)
    trains: frozenset[str]             # ops from which an update is reachable (fetching one trains)
    train_collection: frozenset[str]   # ops of the TRAIN_OP collection
    state_init: frozenset[str]         # ops that run an iterator/table initialiser
    queue: frozenset[str]              # ops that run an enqueue/dequeue (graphs with queue runners only)
    batch_dependent: frozenset[str] = frozenset()   # ops downstream of a batch source (inference runs)
    restores: frozenset[str] = frozenset()          # ops downstream of a checkpoint read (RestoreV2)
    restore_prefixes: frozenset[str] = frozenset()  # tensors naming the checkpoint a RestoreV2 reads
    saves: frozenset[str] = frozenset()             # ops downstream of a checkpoint write (SaveV2)

    @staticmethod
    def of(graph: tf.Graph) -> GraphInfo:
        import tensorflow as tf

        from tag_tf.ir import opsets

        ops = graph.get_operations()
        consumers: dict[str, list[str]] = {}
        for op in ops:
            for t in op.inputs:
                consumers.setdefault(t.op.name, []).append(op.name)
            for c in op.control_inputs:
                consumers.setdefault(c.name, []).append(op.name)

        def downstream(seeds: Iterable[str]) -> frozenset[str]:
            seen: set[str] = set()
            stack = list(seeds)
            while stack:
                name = stack.pop()
                if name not in seen:
                    seen.add(name)
                    stack.extend(consumers.get(name, ()))
            return frozenset(seen)

        updates = opsets.training_updates((op.name, op.type, [t.op.name for t in op.inputs]) for op in ops)
        collection = frozenset((x.op if isinstance(x, tf.Tensor) else x).name
                               for x in graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP))
        queue: frozenset[str] = frozenset()
        if updates and graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
            queue = downstream(op.name for op in ops if op.type.startswith(("QueueEnqueue", "QueueDequeue")))
        sources = (op.name for op in ops if op.type in _BATCH_SOURCES and op.outputs and op.outputs[0].shape.rank)
        restores = [op for op in ops if op.type in ("RestoreV2", "Restore", "RestoreSlice")]
        saves = (op.name for op in ops if op.type in ("SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints"))
        return GraphInfo(graph.version, updates, downstream(updates), collection,
                         downstream(op.name for op in ops if op.type in _STATE_INIT_OPS), queue,
                         downstream(sources), downstream(op.name for op in restores),
                         frozenset(op.inputs[0].name for op in restores), downstream(saves))

    def every_training_root(self, graph: tf.Graph, first: Sequence[str]) -> list[str]:
        """The training roots a program compiles: the first training run's, then every other op that
        trains and that no other training op runs after (a GAN's second optimizer, the apply op of
        gradients accumulated by separate runs), so that every later training run is one the
        program compiled."""
        sinks = [op.name for op in graph.get_operations() if op.name in self.trains
                 and not any(c.name in self.trains for t in op.outputs for c in t.consumers())
                 and not any(c.name in self.trains for c in op._control_outputs)]
        roots = list(first)
        covered = {op.name for op in self.upstream(graph, roots) if op.name in self.updates}
        for sink in sinks:       # only sinks that run updates the others do not (not a read after them)
            runs = {op.name for op in self.upstream(graph, [sink]) if op.name in self.updates}
            if runs - covered:
                roots.append(sink)
                covered |= runs
        return list(dict.fromkeys(roots))

    def training_roots(self, names: Sequence[str]) -> list[str]:
        """The fetched ops that make a run a training run (GraphError for a TRAIN_OP op that trains
        nothing)."""
        roots = [n for n in names if n in self.trains or n in self.train_collection]
        for n in roots:
            if n not in self.trains:
                raise GraphError(f"no train op found: {n!r} is in the TRAIN_OP collection but writes no "
                                 f"variable with a value computed from gradients (an optimizer's Apply* "
                                 f"op, or an assign of a gradient-derived value); tag_tf.distribute "
                                 f"distributes gradient-based training only")
        return list(dict.fromkeys(roots))

    @staticmethod
    def upstream(graph: tf.Graph, names: Sequence[str]) -> list[tf.Operation]:
        """The ops of live `graph` that running ops `names` runs (data and control inputs)."""
        seen: dict[str, tf.Operation] = {}
        stack = [graph.get_operation_by_name(n) for n in names]
        while stack:
            op = stack.pop()
            if op.name not in seen:
                seen[op.name] = op
                stack.extend(t.op for t in op.inputs)
                stack.extend(op.control_inputs)
        return list(seen.values())

    def inference_roots(self, targets: Sequence[str], fetches: Sequence[str]) -> list[str]:
        """The fetched ops of a prediction run: a graph that never trains, fetching only values
        computed from a batch input (never state-changing targets)."""
        if self.updates or targets or not fetches:
            return []
        if all(n in self.batch_dependent for n in fetches):
            return list(dict.fromkeys(fetches))
        return []


def capture(graph: tf.Graph, roots: Sequence[str], feeds: Feeds | None = None
            ) -> tuple[GraphDef, MetaGraphDef, str | None, dict[str, tuple[int, ...]]]:
    """(GraphDef, MetaGraphDef with the collections the IR reads, train op name, learned shapes) of a
    live graph.

    Several training roots are grouped under one NoOp added to the captured GraphDef (never to the
    user's graph, which may be finalized). A placeholder without a static rank (`tf.placeholder(
    "float")`) takes its shape from the value `feeds` gives it in the first training run: a scalar
    stays a scalar (fed whole to every replica, like a keep_prob or a learning rate), a value of rank
    >= 1 keeps its other dims and a dynamic first (batch) dim. Returns those learned shapes by tensor
    name (the runner checks later feeds against them)."""
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.python.framework import meta_graph

    gd = graph.as_graph_def()
    learned = _learn_placeholder_shapes(gd, feeds or {})
    meta = meta_graph_pb2.MetaGraphDef()
    for key in _COLLECTIONS:
        if graph.get_collection(key):
            meta_graph.add_collection_def(meta, key, graph=graph)
    if len(roots) <= 1:
        return gd, meta, (roots[0] if roots else None), learned
    names = {n.name for n in gd.node}
    name = "tag_tf/train"
    while name in names:
        name += "_"
    group = node_def_pb2.NodeDef(name=name, op="NoOp", input=[f"^{r}" for r in roots])
    gd.node.append(group)
    return gd, meta, name, learned


def _learn_placeholder_shapes(gd: GraphDef, feeds: Feeds) -> dict[str, tuple[int, ...]]:
    """Give every fed placeholder of unknown rank in `gd` the shape of its fed value (first dim
    dynamic); returns the shapes given, by tensor name."""
    learned: dict[str, tuple[int, ...]] = {}
    for node in gd.node:
        if node.op != "Placeholder" or not node.attr["shape"].shape.unknown_rank:
            continue
        name = f"{node.name}:0"
        if name not in feeds:
            continue
        shape = tuple(int(d) for d in np.shape(feeds[name]))
        if shape:
            shape = (-1,) + shape[1:]
        proto = node.attr["shape"].shape
        proto.unknown_rank = False
        del proto.dim[:]
        for d in shape:
            proto.dim.add().size = d
        learned[name] = shape
    return learned


def check_learned_shape(name: str, shape: tuple[int, ...], value: np.ndarray) -> None:
    """A feed of a placeholder whose shape was learned from its first fed value must fit that shape."""
    fed = tuple(np.shape(value))
    if len(fed) != len(shape) or any(s not in (-1, f) for s, f in zip(shape, fed)):
        want = "a scalar" if not shape else "shape [" + ", ".join("None" if s < 0 else str(s) for s in shape) + "]"
        raise CompileError(f"cannot feed {name!r} a value of shape {list(fed)}: it has no static shape in the graph, "
                           f"and tag_tf compiled it as {want} from the value the first training run fed; give the "
                           f"placeholder a shape (tf.placeholder(dtype, [None, ...])) to feed others")


# =============================================================================================
# A compiled graph, live in a tf.Graph, with name maps from the user's graph
# =============================================================================================
class Program:
    """The compiled form of one user graph: a live tf.Graph plus original -> compiled name maps.
    Fetches first seen after compilation get adapters added to the live graph (thread-safe)."""

    def __init__(self, ir: Graph, analysis: Analysis, compiled: Compiled, plan: Plan, target: Target):
        from tag_tf.compiler import Mode
        from tag_tf.runtime.sessions import import_graph
        from tag_tf.runtime.variables import VariableIO

        self.ir, self.analysis, self.compiled, self.plan, self.target = ir, analysis, compiled, plan, target
        self.graph = import_graph(compiled.graph_def)
        variables = ir.variables.values()
        self.io = VariableIO(self.graph, compiled.variables, {v.name: v.kind for v in variables},
                             {v.name: v.dtype for v in variables})
        self._all_updates = ir.training_updates()
        root = cast(str, ir.meta.train_op)      # the IR of a compiled graph names its train op
        self.updates = frozenset(n for n in ir.ancestors([root]) if n in self._all_updates)
        # A fed batch smaller than a replicated layout leaves replicas without samples (see check_batch).
        self.batch_inputs = frozenset(ir.meta.feeds)
        # Placeholders without a static shape in the user's graph: the shape the first fed value gave them.
        self.learned_shapes: dict[str, tuple[int, ...]] = {}
        self.replicas = max((lay.size for lay in compiled.placement.layouts.values()
                             if lay.mode is Mode.REPLICATED), default=1)
        self._tensors: dict[str, str] = dict(compiled.fetch_tensors)
        self._ops: dict[str, str] = dict(compiled.run_ops)
        self._covered: dict[frozenset[str], bool] = {}
        self._lock = threading.Lock()
        # The fetches and ops of the first training run, by original name (what every task's
        # between-graph part computes).
        self.first_run: tuple[list[str], list[str]] = ([], [])
        # In a cluster: whether tasks drive their own steps (None until the chief has decided), and
        # on another task, how many of its sessions run this program.
        self.between: bool | None = None
        # Run as written (TensorFlow's graph rewrites off): the profile found them slower for this program.
        self.as_written = False
        self.task_sessions = 0
        # In a between-graph run: the tasks holding a part of the plan (others only serve).
        self.part_tasks: tuple[int, ...] | None = None

    # -- names -------------------------------------------------------------------------------
    def _known(self, op: str, what: str) -> None:
        if op not in self.ir:
            raise CompileError(f"cannot {what}: {op!r} is not in the graph tag_tf compiled (it was created "
                               f"after training started); create it before the first training run")

    def tensor(self, name: str) -> str:
        """The compiled tensor holding the whole value of original tensor `name`."""
        found = self._tensors.get(name)
        if found is None:
            op = name.rpartition(":")[0]
            self._known(op, f"fetch {name!r}")
            found = self._extend(tensors=[name])[name]
        return found

    def op(self, name: str) -> str:
        """The compiled op running every instance of original op `name`."""
        found = self._ops.get(name)
        if found is None:
            self._known(name, f"run {name!r}")
            found = self._extend(ops=[name])[name]
        return found

    def feeds(self, name: str) -> list[str]:
        """The compiled tensors to feed for original tensor `name` (feeds keep their names): one, or
        every copy of a placeholder the plan replicates (a value that is not a batch: a keep_prob, a
        learning rate, a flag, fed whole to every replica)."""
        op, _, index = name.rpartition(":")
        self._known(op, f"feed {name!r}")
        instances = self.compiled.instances[op]
        if len(instances) != 1 and (self.ir.op(op).type not in ("Placeholder", "PlaceholderWithDefault")
                                    or name in self.batch_inputs):
            raise CompileError(f"cannot feed {name!r}: the plan runs its op on {len(instances)} devices; feed a "
                               f"placeholder (or a tensor computed once) instead")
        return [f"{i}:{index}" for i in instances]

    def check_batch(self, name: str, value: np.ndarray) -> None:
        """A dynamic batch smaller than the number of replicas would give some replicas no samples
        (and a NaN mean): refuse it by name rather than train on NaN (the front end runs such a step
        on one device before it gets here). A placeholder whose shape was learned from its first
        feed must be fed that shape."""
        if name in self.learned_shapes:
            check_learned_shape(name, self.learned_shapes[name], value)
        if self._too_small(name, value):
            raise CompileError(f"cannot feed {name!r} a batch of {np.shape(value)[0]} sample(s): the plan splits "
                               f"it over {self.replicas} replicas; feed at least {self.replicas} (e.g. drop "
                               f"the last partial batch)")

    def _too_small(self, name: str, value: np.ndarray) -> bool:
        """A fed batch with fewer samples than the plan's replicas."""
        return name in self.batch_inputs and bool(np.ndim(value)) and np.shape(value)[0] < self.replicas

    def one_device_reason(self, targets: Sequence[str], fetches: Sequence[str], feeds: Feeds,
                          training: bool) -> str | None:
        """Why a run cannot run on this program and runs on one device instead (the user's own session
        with the trained values): it fetches or runs ops created after training started, fetches what
        the distributed graph cannot provide, or feeds a batch smaller than the plan's replicas. None:
        it runs here."""
        for name in [*fetches, *targets, *feeds]:
            op = name.rpartition(":")[0] if ":" in name else name
            if op not in self.ir:
                return f"{name!r} was created after training started"
        for name, value in feeds.items():
            if self._too_small(name, value):
                return (f"it feeds {name!r} {np.shape(value)[0]} sample(s), fewer than the plan's {self.replicas} "
                        f"replicas")
        if not training:
            try:
                for t in fetches:
                    self.tensor(t)
                for o in targets:
                    self.op(o)
            except CompileError as e:
                return str(e)
        return None


    def covers(self, roots: Sequence[str]) -> bool:
        """Whether running `roots` only runs optimizer updates this program distributes (ops it does
        not know are left to `op`/`tensor`, which name them)."""
        key = frozenset(r for r in roots if r in self.ir)
        if key not in self._covered:
            self._covered[key] = all(n in self.updates for n in self.ir.ancestors(key) if n in self._all_updates)
        return self._covered[key]

    def _extend(self, tensors: Sequence[str] = (), ops: Sequence[str] = ()) -> dict[str, str]:
        with self._lock:
            try:
                nodes, names = self.compiled.extend(tensors=tensors, ops=ops)
            except CompileError as e:
                what = (list(tensors) + list(ops))[0]
                raise CompileError(f"cannot fetch {what!r} from the distributed graph: {e}") from None
            add_nodes(self.graph, nodes)
            self._tensors.update({t: names[t] for t in tensors})
            self._ops.update({o: names[o] for o in ops})
            return names


def graph_digest(ir: Graph, compiled: Compiled) -> str:
    """Content digest of a compiled GraphDef (tasks compare theirs with the chief's), without the
    values only variable initialisation reads (`Graph.initial_value_ops`: the chief loads every
    variable copy, and Keras seeds its initialisers differently in every process)."""
    import hashlib

    from tensorflow.core.framework import graph_pb2

    from tag_tf.ir.graph import without_initial_values

    initial = {i for op in ir.initial_value_ops() for i in compiled.instances.get(op, ())}
    gd = graph_pb2.GraphDef()
    gd.CopyFrom(compiled.graph_def)
    for i, node in enumerate(gd.node):
        if node.name in initial:
            gd.node[i].CopyFrom(without_initial_values(node))
    return hashlib.sha256(gd.SerializeToString(deterministic=True)).hexdigest()[:16]


def add_nodes(graph: tf.Graph, nodes: Sequence[NodeDef]) -> None:
    """Add compiler-made NodeDefs to a live graph, wired to its existing ops by name.
    (import_graph_def cannot remap control inputs on ops without outputs, so create ops directly.)"""
    from tag_tf.ir import TensorRef

    for node in nodes:
        inputs = [graph.get_tensor_by_name(TensorRef.parse(i).name) for i in node.input if not i.startswith("^")]
        control = [graph.get_operation_by_name(i[1:]) for i in node.input if i.startswith("^")]
        with graph.device(node.device), graph.control_dependencies(control):
            # A trailing "/" keeps the name exactly (the builder made it unique).
            graph.create_op(node.op, inputs, name=node.name + "/", attrs=dict(node.attr))


# =============================================================================================
# One user session running on a Program
# =============================================================================================
class TaskStep:
    """This task's own part of every training step (between-graph execution, `compiler.localize`):
    its graph, run by a session that sees this task's devices only. Every step also runs `always`,
    the cross-task sums the other tasks wait for."""

    def __init__(self, task_graph: TaskGraph, session_for: Callable[[tf.Graph], tf.compat.v1.Session],
                 atomic: bool = False):
        from tag_tf.compiler.atomic import atomic_step
        from tag_tf.runtime.sessions import import_graph

        self.task = task_graph.task
        # Elastic runs: every variable write waits for every collective, so a step lost in one
        # leaves this task's variables as they were (`compiler.atomic`).
        self.graph = import_graph(atomic_step(task_graph.graph_def) if atomic else task_graph.graph_def)
        self.session = session_for(self.graph)
        self.tensors, self.ops = task_graph.tensors, task_graph.ops
        self.always = [self.graph.get_operation_by_name(n) for n in task_graph.always]
        self._feedable = frozenset(n.name for n in task_graph.graph_def.node)
        self.tasks = task_graph.tasks
        self.batch_checked = False
        import tensorflow as tf

        # Elastic runs: the size of this task's queue of announced membership changes, read once the
        # step's collectives are done (so an announcement made before the chief's step is seen in it).
        self.change_pending = False
        self._change: tf.Tensor | None = None
        if atomic:
            from tag_tf.compiler.atomic import BARRIER, CHANGE_QUEUE

            names = {n.name for n in self.graph.as_graph_def().node}
            with self.graph.as_default(), tf.device(task_graph.cpu):
                queue = tf.queue.FIFOQueue(16, [tf.string], shapes=[[]], shared_name=CHANGE_QUEUE,
                                           name="tag/elastic/change")
                after = [self.graph.get_operation_by_name(BARRIER)] if BARRIER in names else []
                with tf.control_dependencies(after):
                    self._change = queue.size()
        with self.graph.as_default(), tf.device(task_graph.cpu):
            self._digest = tf.compat.v1.placeholder(tf.int64, [1], name="tag/batch_check/digest")
            self._digests = tf.raw_ops.CollectiveGatherV2(
                input=self._digest, group_size=len(task_graph.tasks), group_key=task_graph.group_key,
                instance_key=task_graph.check_key, ordering_token=[], name="tag/batch_check/gather")

    def check_same_batch(self, batch: Feeds) -> None:
        """Once, at the first training step: every task compares a digest of the batch it feeds. Each
        task trains on its shards of what it feeds, so the run equals single-device training only if
        they all feed the same batch; say so, naming the tasks, when they do not."""
        import hashlib
        import logging

        digest = hashlib.blake2b(digest_size=7)
        for name in sorted(batch):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(batch[name]).tobytes())
        mine = int.from_bytes(digest.digest(), "little")
        seen = self.session.run(self._digests, {self._digest: [mine]})
        self.batch_checked = True
        others = [t for t, d in zip(self.tasks, seen) if int(d) != mine]
        if others:
            logging.getLogger("tag_tf.distribute").warning(
                "tag_tf: task %d fed another first batch than task(s) %s: each task trains on its shards of what it "
                "feeds, so this run is not the single-device run unless every task feeds the same batches",
                self.task, ", ".join(map(str, others)))

    def run(self, targets: Sequence[str], fetches: Sequence[str], feeds: Feeds, options: object,
            run_metadata: object) -> list[object]:
        """Run compiled ops `targets`, fetch compiled tensors `fetches` (unique names), feed compiled
        tensors `feeds` (those this task's part does not read are left out)."""
        missing = [n for n in fetches if n not in self.tensors] + [o for o in targets if o not in self.ops]
        if missing:
            raise CompileError(f"between-graph execution: a training run fetches or runs {missing[0]!r} (compiled "
                               f"name), which the first training run did not; every task's step computes what the "
                               f"first training run fetched and ran (fetch it there too)")
        g = self.graph
        feed = {g.get_tensor_by_name(n).ref(): v for n, v in feeds.items() if n.rpartition(":")[0] in self._feedable}
        ops = list(dict.fromkeys([*(g.get_operation_by_name(o) for o in targets), *self.always]))
        tensors = [g.get_tensor_by_name(n) for n in fetches]
        if self._change is None:
            return original_do_run(self.session, None, ops, tensors, feed, options, run_metadata)
        values = original_do_run(self.session, None, ops, [*tensors, self._change], feed, options, run_metadata)
        self.change_pending = bool(values[-1])
        return values[:-1]

    def read_variables(self, copies: Mapping[str, Sequence[str]], kinds: Mapping[str, str],
                       dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
        """This task's own copy of each variable (`copies`: original name -> compiled copies), read
        through its own session: no collective and no other task, so it works after a peer was lost.
        CompileError naming a variable with no copy on this task."""
        from tag_tf.runtime.variables import VariableIO

        mine = {}
        for var, names in copies.items():
            here = [n for n in names if n in self._feedable]
            if not here:
                raise CompileError(f"elastic: variable {var!r} has no copy on task {self.task}, so its value "
                                   f"cannot be restored from this task")
            mine[var] = here[:1]
        return VariableIO(self.graph, mine, kinds, dtypes).read(self.session)

    def close(self) -> None:
        from tag_tf.runtime.sessions import close_within

        close_within(self.session.close, "this task's step session")


@dataclasses.dataclass(frozen=True)
class _Resolved:
    """One run signature (targets, fetches, fed names) resolved on the compiled graph."""
    names: tuple[str, ...]              # compiled tensor per fetch, in the user's order
    unique: tuple[str, ...]             # ... each once
    op_names: tuple[str, ...]
    ops: tuple[object, ...]             # tf.Operation per op name
    tensors: tuple[object, ...]         # tf.Tensor per unique name
    fed: tuple[tuple[str, tuple[str, ...], tuple[object, ...]], ...]   # (original, compiled names, their refs)


def lost_task_errors() -> tuple[type[Exception], ...]:
    """What a step reports when a peer task went away (a reset, a deadline, or a collective aborted
    by another's failure on the same server); `Runner.recover` checks that a task really was lost."""
    import tensorflow as tf

    return (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
            tf.errors.CancelledError, tf.errors.InternalError, tf.errors.FailedPreconditionError)


def _in_order(r: _Resolved, values: Sequence[object]) -> list[object]:
    """Values fetched once per compiled tensor (`r.unique`), in the user's order (`r.names`)."""
    if len(r.unique) == len(r.names):
        return list(values)
    by_name = dict(zip(r.unique, values))
    return [by_name[n] for n in r.names]


# Run signatures a Runner keeps resolved: a program that fetches ever other lists (a loop naming a
# step's tensors) resolves again past this many, rather than holding every one it ever ran.
RESOLVED_MAX = 64


class Runner:
    """Runs original ops/tensors of one user session on its compiled session; training runs on
    `step` when this task drives its own part of each step (between-graph execution).

    What a run's names are on the compiled graph is resolved once per signature (targets, fetches,
    fed names; a training loop repeats one): resolving them every run cost about 20 us (the mlp at
    batch 8 on one device and one core: 642 -> 624 us a step, 545 us without tag_tf). What depends
    on the fed values (a batch too small for the plan's replicas) is checked every run."""

    def __init__(self, program: Program, session: tf.compat.v1.Session, step: TaskStep | None = None):
        self.program = program
        self.session = session
        self.step = step
        self._resolved: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], _Resolved] = {}
        # Elastic runs (`frontend.elastic`): what to do when a step loses a task (None: name it and
        # stop), the training steps this runner completed and the last one's (targets, fetches, feeds).
        self.recover: Callable[[Runner, Exception | None], None] | None = None
        self.before_step: Callable[[Runner], None] | None = None     # the chief: announce a change
        self.completed = 0
        self.last: tuple[Sequence[str], Sequence[str], Feeds] | None = None
        self.current: tuple[Sequence[str], Sequence[str], Feeds] | None = None

    def replace(self, program: Program, session: tf.compat.v1.Session, step: TaskStep | None) -> None:
        """Run on `program` from now on (an elastic run's next generation); the old sessions are
        left to close in the background (their cluster has lost a task)."""
        from tag_tf.runtime.sessions import close_later

        old = [self.session.close, *([self.step.session.close] if self.step is not None else [])]
        self.program, self.session, self.step = program, session, step
        self._resolved.clear()
        for close in old:
            close_later(close)

    def _resolve(self, targets: Sequence[str], fetches: Sequence[str], feeds: Feeds) -> _Resolved:
        key = (tuple(targets), tuple(fetches), tuple(feeds))
        found = self._resolved.get(key)
        if found is None:
            p = self.program
            g = p.graph
            names = tuple(p.tensor(t) for t in fetches)
            unique = tuple(dict.fromkeys(names))          # tf.Tensors are not hashable: dedupe by name
            op_names = tuple(dict.fromkeys(p.op(o) for o in targets))
            compiled = {name: tuple(p.feeds(name)) for name in feeds}
            fed = tuple((name, cs, tuple(g.get_tensor_by_name(c).ref() for c in cs)) for name, cs in compiled.items())
            found = _Resolved(names, unique, op_names, tuple(g.get_operation_by_name(o) for o in op_names),
                              tuple(g.get_tensor_by_name(n) for n in unique), fed)
            if len(self._resolved) >= RESOLVED_MAX:         # the oldest signature goes first
                del self._resolved[next(iter(self._resolved))]
            self._resolved[key] = found
        return found

    def run(self, targets: Sequence[str], fetches: Sequence[str], feeds: Feeds, options: object = None,
            run_metadata: object = None, training: bool = False) -> list[object]:
        """Run original ops `targets` and fetch original tensors `fetches` (values in that order).

        `options`/`run_metadata` are the serialized buffers `BaseSession._do_run` receives: the
        compiled session's own `_do_run` fills the caller's RunMetadata."""
        import tensorflow as tf

        p = self.program
        r = self._resolve(targets, fetches, feeds)
        for name, value in feeds.items():
            p.check_batch(name, value)
        try:
            if training and self.step is not None:
                return self._train_step(r, targets, fetches, feeds, options, run_metadata)
            else:
                feed = {ref: feeds[n] for n, _, refs in r.fed for ref in refs}
                values = original_do_run(self.session, None, list(r.ops), list(r.tensors), feed, options, run_metadata)
        except tf.errors.OpError as e:
            if p.target.cluster is not None and isinstance(e, (tf.errors.UnavailableError,
                                                              tf.errors.DeadlineExceededError)):
                raise p.target.explain(e) from None
            raise
        return _in_order(r, values)

    def _train_step(self, r: _Resolved, targets: Sequence[str], fetches: Sequence[str], feeds: Feeds, options: object,
                    run_metadata: object) -> list[object]:
        """One training step on this task's part (between-graph), values in the user's order; in an
        elastic run, a step that loses a task runs again on the next generation (`recover`, its names
        resolved anew), and a change the chief announced is made after the step."""
        import tensorflow as tf

        assert self.step is not None
        self.current = (targets, fetches, feeds)
        try:
            if self.before_step is not None:
                self.before_step(self)
            if not self.step.batch_checked:
                self.step.check_same_batch({n: v for n, v in feeds.items() if n in self.program.batch_inputs})
            values = self.step.run(list(r.op_names), list(r.unique),
                                   {c: feeds[n] for n, compiled, _ in r.fed for c in compiled}, options, run_metadata)
        except tf.errors.OpError as e:
            if self.recover is None or not isinstance(e, lost_task_errors()):
                raise
            self.recover(self, e)          # a new generation: run this step again on it (names resolved anew)
            return self._train_step(self._resolve(targets, fetches, feeds), targets, fetches, feeds, options,
                                    run_metadata)
        self.completed += 1
        self.last = (targets, fetches, feeds)
        if self.step.change_pending and self.recover is not None:
            self.recover(self, None)       # the chief announced a change after this step
        return _in_order(r, values)

    def close(self) -> None:
        from tag_tf.runtime.sessions import close_within

        if self.step is not None:
            self.step.close()
        if self.program.target.cluster is None:
            self.session.close()
        else:       # never stuck on a dead task: a run that lost one has already named it
            close_within(self.session.close, "the compiled session")

