"""`tag_tf.distribute`: existing TF1-style training code trains distributed with one added line.

    with tag_tf.distribute():               # or @tag_tf.distribute(strategy="dp") on a function
        ...build the graph, tf.compat.v1.Session / MonitoredTrainingSession / Saver as before...

How it works. While a context is active, `BaseSession._do_run` (the step of `Session.run` that gets
the flattened fetches, targets and validated feeds, after TensorFlow has parsed the user's fetch
structure), `BaseSession.make_callable` and `BaseSession.close` are patched; on the last exit the
originals are put back. MonitoredSession, hooks, Saver and Estimator all end in a raw `Session.run`,
so they go through the patch too. Per session:

- Runs before the first training run (initialisers, restores) run on the user's own session. Runs
  that initialise iterators or lookup tables are remembered, to be replayed.
- The first *training run* (its fetches reach an optimizer update op, Apply*/ResourceApply*, or an op
  of the TRAIN_OP collection) captures the graph, analyses it, resolves the plan (cache, planner or
  the given strategy), compiles it and imports it into a session on the planned devices. There the
  remembered iterator/table initialisations are replayed, then every variable's current value is
  copied from the user's session into all its copies, and from then on every run of that session
  executes the compiled graph: fetches map to tensors holding the original (whole-batch) values, ops to ops
  running all their instances, feeds keep their names. TensorFlow rebuilds the user's fetch
  structure from the values, so nested lists/dicts/namedtuples, strings and ops behave as usual.
- In a graph with queue runners, the first run that enqueues or dequeues counts as the start of
  training (the queue must be filled in the session that trains), compiled with the graph's train op.
- Graphs that never train (evaluation, prediction) are never touched.
- On exit, sessions still open get their variables' trained values back, then compiled sessions close.

Errors are one line, of a `tag_tf.errors` type, naming the thing: `GraphError` (no train op: a fetched
TRAIN_OP-collection op that runs no optimizer update), `CompileError` (a fetch or feed the plan cannot
provide, e.g. an op created after training started), `ClusterError` (unreachable task),
`TopologyError` (a topology that does not match the devices present), `VerificationError`.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from tag_tf.errors import CompileError, GraphError, TagError, TopologyError, VerificationError
from tag_tf.frontend.planning import Plan, check_request, resolve_strategy

log = logging.getLogger("tag_tf.distribute")

VERIFY_STEPS = 2
VERIFY_TOLERANCE = 1e-4

# Ops that initialise state other than variables (replayed in the compiled session at migration).
_STATE_INIT_OPS = frozenset({"MakeIterator", "InitializeTable", "InitializeTableV2", "InitializeTableFromTextFile",
                             "InitializeTableFromTextFileV2", "InitializeTableFromDataset",
                             "LookupTableImport", "LookupTableImportV2"})
_COLLECTIONS = ("variables", "trainable_variables", "local_variables", "train_op", "losses", "global_step")


def distribute(strategy: Any = "auto", topology: Any = None, cluster: Any = None, cache_dir: str | None = None,
               budget_s: float | None = None, verify: bool = False) -> "Distribution | Callable":
    """Train the TF1 code run inside this context (or decorated function) distributed.

    strategy: "auto" (the best plan the planner gives), "dp", "dp-p" (batch shares proportional to
        device capacity), a `tag_tf.strategy.Strategy`, or the path of a strategy JSON file.
    topology: a preset name ("local:4", "testbed", ...), a topology file or dict, or a Topology;
        default: this machine (its GPUs, else 4 virtual CPU devices).
    cluster: a cluster file (or ClusterSpec): run on those `tag-tf server`s, task i = machine i.
    cache_dir: where plans are cached (default: $TAG_TF_CACHE_DIR or ~/.cache/tag_tf).
    budget_s: planning time budget in seconds.
    verify: before training, check for 2 steps that the distributed graph trains like the original
        (first fed batch, or synthetic batches for iterator inputs); raise VerificationError if not.

    `@tag_tf.distribute` (no arguments) decorates a function with the defaults.
    """
    if callable(strategy) and not isinstance(strategy, (str, os.PathLike)):
        return Distribution()(strategy)
    return Distribution(strategy=strategy, topology=topology, cluster=cluster, cache_dir=cache_dir,
                        budget_s=budget_s, verify=verify)


# =============================================================================================
# Where compiled graphs run
# =============================================================================================
@dataclasses.dataclass(frozen=True)
class Target:
    topology: Any              # tag_tf.topology.Topology
    devices: Any               # tag_tf.compiler.DeviceMap
    cluster: Any = None        # tag_tf.runtime.cluster.ClusterSpec, or None for this process
    num_cpus: int = 1          # virtual CPU devices this process needs (local runs)

    def check(self) -> None:
        if self.cluster is not None:
            self.cluster.check()

    def config(self, user_config: Any = None) -> Any:
        """The user's ConfigProto with this target's devices (and the cluster's settings)."""
        import tensorflow as tf

        config = tf.compat.v1.ConfigProto()
        if user_config is not None:
            config.CopyFrom(user_config)
        if self.cluster is not None:
            config.MergeFrom(self.cluster.session_config())
        else:
            config.device_count["CPU"] = max(self.num_cpus, config.device_count.get("CPU", 1))
        config.allow_soft_placement = True
        return config

    def session(self, graph: Any, user_config: Any = None) -> Any:
        import tensorflow as tf

        target = self.cluster.target if self.cluster is not None else ""
        sess = tf.compat.v1.Session(target, graph=graph, config=self.config(user_config))
        sess._tag_tf_internal = True      # our own session: the patch passes it straight through
        return sess

    def explain(self, error: Exception) -> Exception:
        """A TF error from a cluster run turned into a ClusterError naming a dead task, if any."""
        if self.cluster is not None and self.cluster.unreachable():
            return self.cluster.explain(error)
        return error


def resolve_target(topology: Any = None, cluster: Any = None) -> Target:
    """Topology + cluster -> the devices compiled graphs run on; TopologyError when they cannot run."""
    from tag_tf.compiler import DeviceMap
    from tag_tf.runtime.cluster import ClusterSpec, cpu_topology
    from tag_tf.topology import load_topology, local

    if cluster is not None:
        spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.load(os.fspath(cluster))
        topo = cpu_topology(len(spec.tasks), spec.cpus_per_task) if topology is None else load_topology(topology)
        if topo.num_machines != len(spec.tasks):
            raise TopologyError(f"topology {topo.name!r} has {topo.num_machines} machine(s) but the cluster has "
                                f"{len(spec.tasks)} task(s); task i runs machine i, so they must match")
        for m in topo.machines:
            if all(g.type == "cpu" for g in m.gpus) and m.num_gpus > spec.cpus_per_task:
                raise TopologyError(f"topology {topo.name!r}: machine {m.name!r} has {m.num_gpus} CPU devices "
                                    f"but the cluster's servers have cpus_per_task={spec.cpus_per_task}")
        return Target(topo, DeviceMap.for_topology(topo, job=spec.job), spec)
    topo = local() if topology is None else load_topology(topology)
    _check_runs_here(topo)
    if all(d.type == "cpu" for d in topo.devices):
        return Target(topo, DeviceMap.local_cpus(topo.num_devices), None, topo.num_devices)
    return Target(topo, DeviceMap.for_topology(topo, job="localhost"), None, 1)


def _check_runs_here(topo: Any) -> None:
    """A topology runs in this process only if it is one machine whose GPUs are all present."""
    import tensorflow as tf

    gpus = [d.type for d in topo.devices if d.type != "cpu"]
    present = len(tf.config.list_physical_devices("GPU"))
    if topo.num_machines == 1 and len(gpus) <= present:
        return
    kinds = ", ".join(f"{gpus.count(t)}x {t}" for t in dict.fromkeys(gpus)) or "CPU devices"
    raise TopologyError(
        f"topology {topo.name!r} ({topo.num_machines} machine(s), {kinds}) does not match the devices "
        f"present (1 machine, {present} GPU(s)): such topologies can be planned and simulated but not run "
        f"here; to run it pass cluster= with one server per machine")


# =============================================================================================
# What is known about a user's graph (cached per graph version)
# =============================================================================================
@dataclasses.dataclass(frozen=True)
class GraphInfo:
    version: int
    updates: frozenset[str]            # optimizer update ops
    trains: frozenset[str]             # ops from which an update is reachable (fetching one trains)
    train_collection: frozenset[str]   # ops of the TRAIN_OP collection
    state_init: frozenset[str]         # ops that run an iterator/table initialiser
    queue: frozenset[str]              # ops that run an enqueue/dequeue (graphs with queue runners only)

    @staticmethod
    def of(graph: Any) -> "GraphInfo":
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

        updates = frozenset(op.name for op in ops if opsets.is_optimizer_update(op.type))
        collection = frozenset((x.op if isinstance(x, tf.Tensor) else x).name
                               for x in graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP))
        queue: frozenset[str] = frozenset()
        if updates and graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
            queue = downstream(op.name for op in ops if op.type.startswith(("QueueEnqueue", "QueueDequeue")))
        return GraphInfo(graph.version, updates, downstream(updates), collection,
                         downstream(op.name for op in ops if op.type in _STATE_INIT_OPS), queue)

    def training_roots(self, names: Sequence[str]) -> list[str]:
        """The fetched ops that make a run a training run (GraphError for a TRAIN_OP op that trains
        nothing)."""
        roots = [n for n in names if n in self.trains or n in self.train_collection]
        for n in roots:
            if n not in self.trains:
                raise GraphError(f"no train op found: {n!r} is in the TRAIN_OP collection but runs no optimizer "
                                 f"update (Apply*/ResourceApply* op); tag_tf.distribute distributes "
                                 f"optimizer-based training only")
        return list(dict.fromkeys(roots))


def capture(graph: Any, roots: Sequence[str]) -> tuple[Any, Any, str | None]:
    """(GraphDef, MetaGraphDef with the collections the IR reads, train op name) of a live graph.

    Several training roots are grouped under one NoOp added to the captured GraphDef (never to the
    user's graph, which may be finalized)."""
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.core.protobuf import meta_graph_pb2
    from tensorflow.python.framework import meta_graph

    gd = graph.as_graph_def()
    meta = meta_graph_pb2.MetaGraphDef()
    for key in _COLLECTIONS:
        if graph.get_collection(key):
            meta_graph.add_collection_def(meta, key, graph=graph)
    if len(roots) <= 1:
        return gd, meta, (roots[0] if roots else None)
    names = {n.name for n in gd.node}
    name = "tag_tf/train"
    while name in names:
        name += "_"
    group = node_def_pb2.NodeDef(name=name, op="NoOp", input=[f"^{r}" for r in roots])
    gd.node.append(group)
    return gd, meta, name


# =============================================================================================
# A compiled graph, live in a tf.Graph, with name maps from the user's graph
# =============================================================================================
class Program:
    """The compiled form of one user graph: a live tf.Graph plus original -> compiled name maps.
    Fetches first seen after compilation get adapters added to the live graph (thread-safe)."""

    def __init__(self, ir: Any, analysis: Any, compiled: Any, plan: Plan, target: Target):
        from tag_tf.compiler import Mode
        from tag_tf.runtime.sessions import import_graph
        from tag_tf.runtime.variables import VariableIO

        self.ir, self.analysis, self.compiled, self.plan, self.target = ir, analysis, compiled, plan, target
        self.graph = import_graph(compiled.graph_def)
        variables = ir.variables.values()
        self.io = VariableIO(self.graph, compiled.variables, {v.name: v.kind for v in variables},
                             {v.name: v.dtype for v in variables})
        self.updates = frozenset(n for n in ir.ancestors([ir.meta.train_op]) if _is_update(ir, n))
        # A fed batch smaller than a replicated layout leaves replicas without samples (see check_batch).
        self.batch_inputs = frozenset(ir.meta.feeds)
        self.replicas = max((lay.size for lay in compiled.placement.layouts.values()
                             if lay.mode is Mode.REPLICATED), default=1)
        self._tensors: dict[str, str] = dict(compiled.fetch_tensors)
        self._ops: dict[str, str] = dict(compiled.run_ops)
        self._covered: dict[frozenset[str], bool] = {}
        self._lock = threading.Lock()

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

    def feed(self, name: str) -> str:
        """The compiled tensor to feed for original tensor `name` (feeds keep their names)."""
        op, _, index = name.rpartition(":")
        self._known(op, f"feed {name!r}")
        instances = self.compiled.builder.instances[op]
        if len(instances) != 1:
            raise CompileError(f"cannot feed {name!r}: the plan runs its op on {len(instances)} devices; feed a "
                               f"placeholder (or a tensor computed once) instead")
        return f"{instances[0]}:{index}"

    def check_batch(self, name: str, value: Any) -> None:
        """A dynamic batch smaller than the number of replicas would give some replicas no samples
        (and a NaN mean): refuse it by name rather than train on NaN."""
        if name in self.batch_inputs and np.ndim(value) and np.shape(value)[0] < self.replicas:
            raise CompileError(f"cannot feed {name!r} a batch of {np.shape(value)[0]} sample(s): the plan splits "
                               f"it over {self.replicas} replicas; feed at least {self.replicas} (e.g. drop "
                               f"the last partial batch)")

    def feed_obj(self, name: str) -> Any:
        return self.graph.get_tensor_by_name(self.feed(name))

    def covers(self, roots: Sequence[str]) -> bool:
        """Whether running `roots` only runs optimizer updates this program distributes (ops it does
        not know are left to `op`/`tensor`, which name them)."""
        key = frozenset(r for r in roots if r in self.ir)
        if key not in self._covered:
            self._covered[key] = all(n in self.updates for n in self.ir.ancestors(key) if _is_update(self.ir, n))
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


def _is_update(ir: Any, name: str) -> bool:
    from tag_tf.ir import opsets

    return opsets.is_optimizer_update(ir.op(name).type)


def add_nodes(graph: Any, nodes: Sequence[Any]) -> None:
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
class Runner:
    """Runs original ops/tensors of one user session on its compiled session."""

    def __init__(self, program: Program, session: Any):
        self.program = program
        self.session = session

    def run(self, targets: Sequence[str], fetches: Sequence[str], feeds: Mapping[str, Any],
            options: Any = None, run_metadata: Any = None) -> list[Any]:
        """Run original ops `targets` and fetch original tensors `fetches` (values in that order).

        `options`/`run_metadata` are the serialized buffers `BaseSession._do_run` receives: the
        compiled session's own `_do_run` fills the caller's RunMetadata."""
        import tensorflow as tf

        p = self.program
        names = [p.tensor(t) for t in fetches]
        unique = list(dict.fromkeys(names))          # tf.Tensors are not hashable: dedupe by name
        target_ops = [p.graph.get_operation_by_name(o) for o in dict.fromkeys(p.op(o) for o in targets)]
        for name, value in feeds.items():
            p.check_batch(name, value)
        feed = {p.feed_obj(name).ref(): value for name, value in feeds.items()}
        try:
            values = _saved["_do_run"](self.session, None, target_ops,
                                       [p.graph.get_tensor_by_name(n) for n in unique], feed, options,
                                       run_metadata)
        except tf.errors.OpError as e:
            if p.target.cluster is not None and isinstance(e, (tf.errors.UnavailableError,
                                                              tf.errors.DeadlineExceededError)):
                raise p.target.explain(e) from None
            raise
        by_name = dict(zip(unique, values))
        return [by_name[n] for n in names]

    def close(self) -> None:
        self.session.close()


@dataclasses.dataclass
class SessionState:
    runner: Runner | None = None
    # Iterator/table initialisations run before training: (targets, fetches, feeds) by name.
    replay: list[tuple[list[str], list[str], dict[str, Any]]] = dataclasses.field(default_factory=list)


# =============================================================================================
# The context
# =============================================================================================
class Distribution:
    """What `tag_tf.distribute(...)` returns: a context manager and a decorator.

    After use, `plans` lists the plan of every graph it compiled (`Plan.cache_hit` tells whether
    the plan came from the cache) and `programs` the compiled programs."""

    def __init__(self, *, strategy: Any = "auto", topology: Any = None, cluster: Any = None,
                 cache_dir: str | None = None, budget_s: float | None = None, verify: bool = False):
        self.options = dict(strategy=strategy, topology=topology, cluster=cluster, cache_dir=cache_dir,
                            budget_s=budget_s, verify=verify)
        self.plans: list[Plan] = []
        self.programs: list[Program] = []
        self.target: Target | None = None
        self._graphs: "weakref.WeakKeyDictionary[Any, tuple[GraphInfo, Program | None]]" = weakref.WeakKeyDictionary()
        self._sessions: "weakref.WeakKeyDictionary[Any, SessionState]" = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        self._active = False
        self._log_handler: logging.Handler | None = None

    # -- context / decorator -----------------------------------------------------------------------
    def __enter__(self) -> "Distribution":
        if self._active:
            raise TagError("this tag_tf.distribute(...) context is already active")
        check_request(self.options["strategy"])      # a bad strategy fails here, not mid-training
        self.target = resolve_target(self.options["topology"], self.options["cluster"])
        self._start_logging()
        self._active = True
        _install(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _uninstall(self)
        self._active = False
        try:
            with _bypass():
                for sess, state in list(self._sessions.items()):
                    if state.runner is not None:
                        if not getattr(sess, "_closed", True):
                            self._sync_back(sess, state.runner)
                        state.runner.close()
        finally:
            self._sessions = weakref.WeakKeyDictionary()
            self._stop_logging()

    def __call__(self, func: Callable) -> Callable:
        """As a decorator: every call runs in a fresh context with the same options."""
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Distribution(**self.options) as d:
                self.plans, self.programs = d.plans, d.programs
                return func(*args, **kwargs)
        return wrapper

    def _start_logging(self) -> None:
        # One line per compiled graph on stderr, unless the application configured logging itself.
        if not logging.getLogger().handlers and not log.handlers and not logging.getLogger("tag_tf").handlers:
            self._log_handler = logging.StreamHandler(sys.stderr)
            self._log_handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(self._log_handler)
            self._saved_level = log.level
            log.setLevel(logging.INFO)

    def _stop_logging(self) -> None:
        if self._log_handler is not None:
            log.removeHandler(self._log_handler)
            log.setLevel(self._saved_level)
            self._log_handler = None

    # -- the intercepted run -----------------------------------------------------------------------
    def owns(self, sess: Any) -> bool:
        state = self._sessions.get(sess)
        return state is not None and state.runner is not None

    def dispatch(self, sess: Any, original: Callable, targets: list, fetches: list, feeds: dict,
                 options: Any, run_metadata: Any) -> list[Any]:
        """One `_do_run` of a user session: pass it through, or run it on the compiled graph."""
        info = self._info(sess.graph)
        names = [op.name for op in targets] + [t.op.name for t in fetches]
        roots = info.training_roots(names)
        state = self._sessions.get(sess)
        if state is None or state.runner is None:
            starts_queue = not roots and any(n in info.queue for n in names)
            if not roots and not starts_queue:
                if info.updates and any(n in info.state_init for n in names):
                    with self._lock:
                        self._state(sess).replay.append(_by_name(targets, fetches, feeds))
                return original(sess, None, targets, fetches, feeds, options, run_metadata)
            with self._lock:
                state = self._state(sess)
                if state.runner is None:
                    program = self._program(sess.graph, info, roots, _feeds_by_name(feeds),
                                            [t.name for t in fetches])
                    state.runner = self._migrate(sess, program, state)
        program = state.runner.program
        if roots and not program.covers(roots):
            raise TagError(f"fetching {roots[0]!r} runs optimizer updates outside the train op tag_tf compiled "
                           f"({program.ir.meta.train_op!r}); group all train ops into one (tf.group) and "
                           f"fetch it from the first training run")
        return self._run(state.runner, targets, fetches, feeds, options, run_metadata)

    @staticmethod
    def _run(runner: Runner, targets: list, fetches: list, feeds: dict, options: Any, run_metadata: Any) -> list:
        t, f, fd = _by_name(targets, fetches, feeds)
        return runner.run(t, f, fd, options, run_metadata)

    def _state(self, sess: Any) -> SessionState:
        state = self._sessions.get(sess)
        if state is None:
            state = self._sessions[sess] = SessionState()
        return state

    def _info(self, graph: Any) -> GraphInfo:
        entry = self._graphs.get(graph)
        if entry is not None and entry[0].version == graph.version:
            return entry[0]
        info = GraphInfo.of(graph)
        with self._lock:
            entry = self._graphs.get(graph)      # a program may have been stored meanwhile
            self._graphs[graph] = (info, entry[1] if entry else None)
        return info

    def session_closed(self, sess: Any) -> None:
        with self._lock:
            state = self._sessions.pop(sess, None)
        if state is not None and state.runner is not None:
            state.runner.close()

    # -- compile -----------------------------------------------------------------------------------
    def _program(self, graph: Any, info: GraphInfo, roots: list[str], feeds: dict[str, Any],
                 fetches: list[str]) -> Program:
        """The program of `graph` (compiled on its first training run, shared by its sessions)."""
        entry = self._graphs.get(graph)
        if entry is not None and entry[1] is not None:
            return entry[1]
        from tag_tf.analysis import analyze
        from tag_tf.compiler import compile_strategy
        from tag_tf.context import Options, PassContext
        from tag_tf.ir import from_graph_def

        start = time.perf_counter()
        gd, meta, train_op = capture(graph, roots)
        ir = from_graph_def(gd, meta, train_op=train_op)
        ctx = PassContext(Options(cache_dir=self.options["cache_dir"]))
        batch = None
        if ir.meta.batch_size is None:     # dynamic batch: plan at the size actually fed
            sizes = [np.shape(feeds[f])[0] for f in ir.meta.feeds if f in feeds and np.ndim(feeds[f])]
            batch = int(sizes[0]) if sizes else None
        analysis = analyze(ctx, ir, batch_size=batch)
        target = self.target
        target.check()                     # an unreachable cluster fails here, naming the task
        plan = resolve_strategy(analysis, target.topology, self.options["strategy"],
                                cache_dir=self.options["cache_dir"], budget_s=self.options["budget_s"])
        compiled = compile_strategy(ctx, analysis, plan.strategy, target.devices,
                                    fetches=[f for f in fetches if f.rpartition(":")[0] in ir],
                                    run_ops=[r for r in roots if r in ir])
        if self.options["verify"]:
            self._verify(analysis, compiled, feeds)
        program = Program(ir, analysis, compiled, plan, target)
        self._graphs[graph] = (info, program)
        self.plans.append(plan)
        self.programs.append(program)
        log.info("tag_tf: training graph %s (%d ops, train op %r) on %d device(s) of %r with plan %s; "
                 "compiled in %.2f s", ir.fingerprint, len(ir), ir.meta.train_op, target.topology.num_devices,
                 target.topology.name, plan.describe(), time.perf_counter() - start)
        return program

    def _verify(self, analysis: Any, compiled: Any, feeds: dict[str, Any]) -> None:
        from tag_tf.runtime.equivalence import check_equivalence

        batch = dict(feeds)
        batch.update({name: value for name, value in synthetic_batch(analysis).items() if name not in batch})
        target = self.target
        kwargs = {}
        if target.cluster is not None:
            kwargs = dict(target=target.cluster.target, config=target.config())
        with _bypass():
            result = check_equivalence(analysis, compiled, lambda step: batch, VERIFY_STEPS,
                                       tolerance=VERIFY_TOLERANCE, **kwargs)
        if not result.ok:
            worst = max(result.per_variable, key=result.per_variable.get) if result.per_variable else "?"
            raise VerificationError(f"verify: the distributed graph does not train like the original: "
                                    f"max_rel_diff {result.max_rel_diff:.3g} > {VERIFY_TOLERANCE:g} after "
                                    f"{VERIFY_STEPS} steps (worst variable {worst!r}); not training with it")
        log.info("tag_tf: verified: max_rel_diff %.3g after %d steps", result.max_rel_diff, VERIFY_STEPS)

    # -- moving state between sessions -------------------------------------------------------------
    def _migrate(self, sess: Any, program: Program, state: SessionState) -> Runner:
        """Start a compiled session for `sess`: replay iterator/table initialisations, then copy every
        initialised variable's value from the user's session into all its copies."""
        runner = Runner(program, self.target.session(program.graph, getattr(sess, "_config", None)))
        with _bypass():
            for targets, fetches, feeds in state.replay:
                runner.run(targets, fetches, feeds)
            state.replay.clear()
            values = read_variables(sess, program.ir)
            program.io.load(runner.session, values)
        missing = sorted(set(program.ir.variables) - set(values))
        if missing:
            log.info("tag_tf: variables not initialised yet, left for their initialiser: %s", ", ".join(missing))
        return runner

    def _sync_back(self, sess: Any, runner: Runner) -> None:
        """Leaving the context with the user's session still open: give it the trained values, so code
        after the context sees them. Uses each variable's initializer with its value fed."""
        try:
            values = runner.program.io.read(runner.session)
            write_variables(sess, runner.program.ir, values)
        except Exception as e:   # best effort: the compiled session is closing anyway
            log.warning("tag_tf: could not copy trained variables back to the session: %s", e)


# =============================================================================================
# Variables of the user's session
# =============================================================================================
def _read_tensor(graph: Any, var: Any) -> Any:
    """A tensor of the user's graph holding variable `var`'s value, without adding ops if possible."""
    import tensorflow as tf

    op = graph.get_operation_by_name(var.name)
    if var.kind == "ref":
        return op.outputs[0]
    reads = [c for c in op.outputs[0].consumers() if c.type == "ReadVariableOp" and not c.control_inputs]
    reads.sort(key=lambda c: not c.name.endswith("/Read/ReadVariableOp"))
    if reads:
        return reads[0].outputs[0]
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()    # a read op changes nothing the user's program relies on
    try:
        with graph.as_default(), tf.device(op.device), tf.name_scope("tag_tf_read"):
            return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=var.dtype)
    finally:
        if finalized:
            graph.finalize()


def read_variables(sess: Any, ir: Any) -> dict[str, np.ndarray]:
    """Current values of the IR's variables in the user's session; uninitialised ones are left out."""
    import tensorflow as tf

    tensors = {name: _read_tensor(sess.graph, var) for name, var in ir.variables.items()}
    try:
        return dict(zip(tensors, sess.run(list(tensors.values()))))
    except tf.errors.FailedPreconditionError:
        pass
    values = {}
    for name, t in tensors.items():
        try:
            values[name] = sess.run(t)
        except tf.errors.FailedPreconditionError:
            continue
    return values


def write_variables(sess: Any, ir: Any, values: Mapping[str, np.ndarray]) -> None:
    """Assign values in the user's session through the variables' initializers (value input fed),
    so no op is added to a graph that may be finalized."""
    targets, feeds = [], {}
    for name, value in values.items():
        init = ir.variables[name].initializer
        if not init:
            continue
        op = sess.graph.get_operation_by_name(init)
        targets.append(op)
        feeds[op.inputs[1]] = value
    if targets:
        sess.run(targets, feeds)


def synthetic_batch(analysis: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch for every batch input, from its shape and dtype (ints are zeros: always a valid label)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in analysis.graph.meta.feeds:
        info = analysis.graph_b1.tensor(name)
        shape = tuple(1 if d < 0 else d for d in (info.shape or (analysis.batch_size,)))
        dtype = np.dtype(info.base_dtype) if info.base_dtype not in ("string", "resource", "variant") else object
        if np.issubdtype(dtype, np.floating):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == object:
            out[name] = np.full(shape, b"", dtype=object)
        else:
            out[name] = np.zeros(shape, dtype=dtype)
    return out


def _by_name(targets: Sequence[Any], fetches: Sequence[Any], feeds: Mapping[Any, Any]
             ) -> tuple[list[str], list[str], dict[str, Any]]:
    return [op.name for op in targets], [t.name for t in fetches], _feeds_by_name(feeds)


def _feeds_by_name(feeds: Mapping[Any, Any]) -> dict[str, Any]:
    # TF keys validated feeds by tensor reference (`Tensor.ref()`).
    return {(k.deref() if hasattr(k, "deref") else k).name: v for k, v in feeds.items()}


# =============================================================================================
# The scoped patch of BaseSession
# =============================================================================================
_patch_lock = threading.Lock()
_active: list[Distribution] = []        # entered contexts, innermost last
_saved: dict[str, Any] = {}             # the original BaseSession methods while patched
_local = threading.local()              # .bypass: depth of tag_tf's own session work in this thread


class _bypass:
    """tag_tf's own session work (verification, migration) goes straight to TensorFlow."""

    def __enter__(self) -> None:
        _local.bypass = getattr(_local, "bypass", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _local.bypass -= 1


def _owner(sess: Any) -> Distribution | None:
    contexts = tuple(_active)
    for d in reversed(contexts):
        if d.owns(sess):
            return d
    return contexts[-1] if contexts else None


def _do_run(self: Any, handle: Any, target_list: list, fetch_list: list, feed_dict: dict, options: Any,
            run_metadata: Any) -> Any:
    original = _saved["_do_run"]
    if handle is not None or getattr(_local, "bypass", 0) or getattr(self, "_tag_tf_internal", False):
        return original(self, handle, target_list, fetch_list, feed_dict, options, run_metadata)
    owner = _owner(self)
    if owner is None:
        return original(self, handle, target_list, fetch_list, feed_dict, options, run_metadata)
    return owner.dispatch(self, original, target_list, fetch_list, feed_dict, options, run_metadata)


def _make_callable(self: Any, fetches: Any, feed_list: Sequence[Any] | None = None, accept_options: bool = False) -> Any:
    # TF's fast callables skip `_do_run`; route them through `run` while a context is active.
    if getattr(self, "_tag_tf_internal", False):
        return _saved["make_callable"](self, fetches, feed_list, accept_options)
    feed_list = list(feed_list or ())

    def call(*args: Any, **kwargs: Any) -> Any:
        return self.run(fetches, feed_dict=dict(zip(feed_list, args)) or None, **kwargs)
    return call


def _close(self: Any) -> None:
    for d in tuple(_active):
        d.session_closed(self)
    _saved["close"](self)


def _install(d: Distribution) -> None:
    from tensorflow.python.client import session

    with _patch_lock:
        if not _active:
            for name, fn in (("_do_run", _do_run), ("make_callable", _make_callable), ("close", _close)):
                _saved[name] = getattr(session.BaseSession, name)
                setattr(session.BaseSession, name, fn)
        _active.append(d)


def _uninstall(d: Distribution) -> None:
    from tensorflow.python.client import session

    with _patch_lock:
        if d in _active:
            _active.remove(d)
        if not _active:
            for name, fn in _saved.items():
                setattr(session.BaseSession, name, fn)


__all__ = ["Distribution", "Program", "Target", "VerificationError", "distribute", "resolve_target",
           "synthetic_batch"]
