"""Between-graph execution: the part of a compiled graph that one task runs on its own.

A compiled graph is one graph for the whole cluster. Driven by one client (the chief), every step
costs a RunGraph round trip to each other task, and Send/Recv pairs only meet inside one step of
one session (benchmarks/remote_step.py measured the round trip; it is most of a small model's
two-process step). MultiWorkerMirroredStrategy and Horovod have every process drive its own step,
meeting only in collectives. `localize` cuts the compiled graph into one graph per task so that
tag_tf can do the same:

- nodes on the task's own devices are kept as they are;
- a node elsewhere that is a pure function of fed inputs and constants (the fed placeholder, the
  split of the batch into shards, shapes read from it) moves to the task's CPU: every task runs the
  same script, feeds the same batch and cuts its own shards from it;
- a sum of replicas' partial values across tasks (the AddN the compiler builds to fetch a
  whole-batch value such as the loss) becomes the task's own partial sum plus a CollectiveReduceV2
  over the contributing tasks, kept under the AddN's name; every contributing task runs it every
  step (`TaskGraph.always`), whatever it fetches, so the collectives always meet. Where the plan
  fuses gradients into buckets, the sum rides in a bucket's all-reduce instead (appended to its
  pack, sliced back after: `TaskGraph.riding`): across processes a collective costs a round trip,
  as long as a small model's whole step;
- a concatenation of replicas' shards across tasks (`tag/concat/*`, e.g. fetched predictions)
  becomes an all-gather over the tasks, padded to the longest shard and unpadded after;
- the compiler's grouping adapters (`tag/run/*` NoOps, `tag/fetch/*` Identities), control edges to
  another task's instance of a replicated op, and single-device ops reading a replica's copy as is
  (a value every replica holds) take this task's own instance instead.

Anything else that crosses tasks (a parameter server's variable, a model-parallel edge, an input
iterator on the chief, a join that replicas read back) cannot be cut this way: `NotLocal` names the
first such node and why, and the caller lets the chief drive every step as before.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.compiler.nodes import AttrSpec, NodeFactory
from tag_tf.errors import CompileError

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef
    from tensorflow.core.framework.tensor_pb2 import TensorProto

_TASK = re.compile(r"/task:(\d+)")
_STATEFUL_ANYWAY = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv"})
_MAX_TASKS = 30                 # group keys carry the contributing tasks as a bit mask
GROUP_KEY_FLAG = 1 << 30        # above the compiler's own group keys (1, 2, ... per device set)
SUM_KEYS = 1 << 13              # the upper half of the graph's instance-key slot (compile.instance_key_base)
_MAX_GATHER_TASKS = 10          # a gather ranks its members by device name: "task:10" sorts before "task:2"


class NotLocal(CompileError):
    """The compiled graph has an edge between tasks that between-graph execution cannot cut."""


@dataclasses.dataclass(frozen=True)
class TaskGraph:
    """What task `task` runs on its own: `graph_def` (every node on its devices, names kept),
    the cross-task sums it takes part in (`always`: run every step), and the compiled tensors and
    ops it can fetch and run."""
    task: int
    graph_def: GraphDef
    always: tuple[str, ...]
    tensors: frozenset[str]
    ops: frozenset[str]
    tasks: tuple[int, ...] = ()     # every task with a part
    cpu: str = ""                   # this task's CPU
    check_key: int = 0              # instance key of the one-off check that the tasks feed one batch
    group_key: int = 0              # the group of every task's CPU
    riding: tuple[str, ...] = ()    # sums carried by a gradient bucket's all-reduce (no collective of their own)


def task_of(device: str) -> int | None:
    found = _TASK.search(device or "")
    return int(found.group(1)) if found else None


def _source(inp: str) -> str:
    return inp.lstrip("^").split(":")[0]


def _stateful(op: str) -> bool:
    from tensorflow.python.framework import op_def_registry

    found = op_def_registry.get(op)
    return op in _STATEFUL_ANYWAY or found is None or found.is_stateful


class _Cutter:
    """Cuts the graph for one task (see the module docstring); `sums` is shared by all tasks."""

    def __init__(self, nodes: Mapping[str, NodeDef], task: int, cpu: str, sums: Mapping[str, tuple[int, ...]],
                 instance_of: Mapping[str, tuple[str, ...]], key_base: int, sum_order: Sequence[str]):
        self.nodes, self.task, self.cpu, self.sums = nodes, task, cpu, sums
        self.instance_of, self.key_base = instance_of, key_base
        self.sum_index = {name: i for i, name in enumerate(sum_order)}
        self.out: dict[str, NodeDef] = {}
        self.used_sums: set[str] = set()
        self.needed_by: dict[str, str] = {}      # node -> the node that first needed it (for errors)
        self.f = NodeFactory(taken=nodes)        # the nodes this cut adds (sums and gathers over tasks)
        self.pending: list[str] = []
        self.draining = False
        self.partials: dict[str, tuple[str, str, tuple[int, ...]]] = {}   # sum -> (this task's part, dtype, tasks)

    def node_task(self, name: str) -> int | None:
        return task_of(self.nodes[name].device)

    def visit(self, name: str) -> None:
        """Put node `name` (and what it needs) into this task's graph. Iterative: a deep graph's
        chains are longer than Python's recursion limit."""
        self.pending.append(name)
        if self.draining:
            return
        self.draining = True
        try:
            while self.pending:
                self._visit_one(self.pending.pop())
        finally:
            self.draining = False

    def _visit_one(self, name: str) -> None:
        if name in self.out or name in self.used_sums:
            return
        if name not in self.nodes:
            raise NotLocal(f"between-graph: {name!r} is not in the compiled graph")
        node = self.nodes[name]
        if name in self.sums:
            self.used_sums.add(name)
            self._gather(node) if node.op == "ConcatV2" else self._sum(node)
        elif self.node_task(name) == self.task:
            self._copy(node, node.device)
        elif node.op == "NoOp" and name.startswith("tag/run/"):
            self._group(node, value=None)
        elif node.op == "Identity" and name.startswith("tag/fetch/"):
            self._group(node, value=node.input[0])
        elif not _stateful(node.op) and len(self.instance_of.get(name, ())) <= 1:
            # A single-device op (on the chief's CPU: fetch adapters, the batch's split): computed
            # here too. Where it reads a replica's copy directly, the value is the same on every
            # replica (the compiler reads a replica's output as is only then): read this task's.
            inputs = []
            for inp in node.input:
                src = _source(inp)
                own = self._own_instance(src) if self.node_task(src) != self.task else None
                inputs.append(inp if own is None else inp.replace(src, own, 1))
            self._copy(node, self.cpu, inputs)
        else:
            chain: list[str] = []
            at = name
            while at in self.needed_by and len(chain) < 6:
                at = self.needed_by[at]
                chain.append(repr(at))
            raise NotLocal(f"between-graph: op {name!r} ({node.op}) runs on task {self.node_task(name)} and holds "
                           f"state or talks to another task; task {self.task} cannot compute it on its own "
                           f"(needed by {' <- '.join(chain) or 'a fetch'})")

    def _own_instance(self, name: str) -> str | None:
        """This task's instance of the op that `name` is an instance of (None: none here)."""
        mine = [i for i in self.instance_of.get(name, ()) if self.node_task(i) == self.task]
        return mine[0] if mine else None

    def _copy(self, node: NodeDef, device: str, inputs: Iterable[str] | None = None) -> None:
        new = type(node)()
        new.CopyFrom(node)
        new.device = device
        inputs = list(node.input if inputs is None else inputs)
        del new.input[:]
        for inp in inputs:
            if inp.startswith("^") and self.node_task(inp[1:]) != self.task:
                # A control edge to another task's instance of a replicated op: that task runs its own
                # instance; this task waits for its own.
                own = self._own_instance(inp[1:])
                if own is not None:
                    inp = "^" + own
            if not inp.startswith("^") or inp not in new.input:     # a data input may come twice (Mul(x, x))
                new.input.append(inp)
        self.out[node.name] = new            # before the inputs: a cycle would otherwise recurse forever
        for inp in new.input:
            self.needed_by.setdefault(_source(inp), node.name)
            self.visit(_source(inp))

    def _group(self, node: NodeDef, value: str | None) -> None:
        """A compiler adapter grouping every instance: this task's instances only."""
        inputs = []
        if value is not None:
            src = _source(value)
            if self.node_task(src) != self.task:
                own = self._own_instance(src)
                if own is None:
                    raise NotLocal(f"between-graph: task {self.task} holds no copy of {src!r}, fetched by "
                                   f"{node.name!r}")
                value = own + value[len(src):]
            inputs.append(value)
        inputs += [i for i in node.input[len(inputs):] if i.startswith("^") and self.node_task(_source(i)) == self.task]
        self._copy(node, self.cpu, inputs)

    def _sum(self, node: NodeDef) -> None:
        """Sum of partials over tasks: this task's part, then a collective over the contributors."""
        own, contributors = self._own_part(node)
        dtype = _dtype(node.attr["T"].type)
        partial = own[0] if len(own) == 1 else self.f.add_n(f"{node.name}/tag_task_partial", own, dtype,
                                                            self.nodes[_source(own[0])].device)
        self.partials[node.name] = (partial, dtype, contributors)

    def emit_sums(self, riders: Mapping[str, _Bucket]) -> None:
        """The cross-task sums this task takes part in: each either rides the gradient bucket
        `riders` names for it (appended to the bucket's pack: no collective of its own) or is a
        collective of its own."""
        by_bucket: dict[tuple[str, str], list[str]] = {}
        for name in sorted(self.partials):
            if name in riders:
                bucket = riders[name]
                by_bucket.setdefault((bucket.members[self.task], bucket.splits[self.task]), []).append(name)
            else:
                partial, dtype, contributors = self.partials[name]
                self._collective(name, "CollectiveReduceV2", partial, dtype, contributors, 0, unique=False,
                                 merge_op=("s", "Add"), final_op=("s", "Id"))
        for (member, split), names in by_bucket.items():
            self._ride(member, split, names)

    def _ride(self, bucket: str, split_name: str, names: Sequence[str]) -> None:
        """Append the flattened partials `names` to the pack the all-reduce `bucket` reduces, and take
        them back from the reduced pack: the bucket's unpacking SplitV gets one more output (the
        rest), which each sum slices and reshapes under its own name."""
        f, cpu = self.f, self.cpu
        fused = self.out[bucket]
        pack = self.out[_source(fused.input[0])]
        split = self.out[split_name]
        sizes = self.out[_source(split.input[1])]
        dtype = _dtype(fused.attr["T"].type)
        flat_shape = f.const(f"{bucket}/tag_sums/flat_shape", [-1], "int32", cpu) + ":0"
        flats = [f.node(f"{name}/tag_flat", "Reshape", [self.partials[name][0], flat_shape], cpu,
                        T=("type", dtype), Tshape=("type", "int32")) + ":0" for name in names]
        count = pack.attr["N"].i
        values, rest = list(pack.input[:count]), list(pack.input[count:])
        del pack.input[:]
        pack.input.extend(values + flats + rest)          # the axis and control inputs stay last
        pack.attr["N"].i = count + len(flats)
        sizes.attr["value"].tensor.CopyFrom(_int32_tensor([*_const_ints(sizes), -1]))
        split.attr["num_split"].i += 1
        extra = f"{split.name}:{split.attr['num_split'].i - 1}"
        begin = f.const(f"{bucket}/tag_sums/zero", [0], "int32", cpu) + ":0"
        for name in names:
            partial = self.partials[name][0]
            size = f.node(f"{name}/tag_size", "Reshape", [
                f.node(f"{name}/tag_count", "Size", [partial], cpu, T=("type", dtype), out_type=("type", "int32")) + ":0",
                f.const(f"{name}/tag_one", [1], "int32", cpu) + ":0"], cpu,
                T=("type", "int32"), Tshape=("type", "int32")) + ":0"
            piece = f.slice(f"{name}/tag_piece", extra, begin, size, dtype, cpu) + ":0"
            f.node(name, "Reshape", [piece, f.shape(f"{name}/tag_shape", partial, dtype, cpu) + ":0"], cpu,
                   unique=False, T=("type", dtype), Tshape=("type", "int32"))
            begin = f.binary(f"{name}/tag_next", "Add", begin, size, "int32", cpu) + ":0"

    def ancestors(self, name: str) -> set[str]:
        """Every node of this task's graph that `name` reads, directly or not (control edges too; a
        sum over tasks not emitted yet reads its partial)."""
        graph = {**self.out, **{n.name: n for n in self.f.nodes}}
        seen, todo = set(), [_source(name)]
        while todo:
            at = todo.pop()
            if at in seen:
                continue
            seen.add(at)
            if at in graph:
                todo.extend(_source(i) for i in graph[at].input)
            elif at in self.partials:
                todo.append(_source(self.partials[at][0]))
        return seen

    def _gather(self, node: NodeDef) -> None:
        """Concatenation of replicas' shards along the batch axis over tasks: this task's shards, then
        an all-gather over the contributors. Shards may differ in rows (a batch that does not divide
        evenly): each task pads its part to the longest, and the padding is dropped after."""
        own, contributors = self._own_part(node, values=node.input[:node.attr["N"].i])
        order = [self.node_task(_source(i)) or 0 for i in node.input[:node.attr["N"].i]]
        axis = self.nodes[_source(node.input[node.attr["N"].i])]
        if axis.op != "Const" or _const_int(axis) != 0 or order != sorted(order):
            raise NotLocal(f"between-graph: {node.name!r} joins shards of several tasks in a way an all-gather "
                           f"cannot (not along the batch axis, or not in task order)")
        if contributors[-1] >= _MAX_GATHER_TASKS:
            raise NotLocal(f"between-graph: {node.name!r} gathers from {contributors[-1] + 1} tasks (at most "
                           f"{_MAX_GATHER_TASKS})")
        dtype = _dtype(node.attr["T"].type)
        if dtype not in _GATHER_TYPES:
            raise NotLocal(f"between-graph: {node.name!r} joins {dtype} shards of several tasks (an all-gather "
                           f"carries {', '.join(sorted(_GATHER_TYPES))})")
        f, cpu, base = self.f, self.cpu, f"{node.name}/tag_gather"
        local = own[0] if len(own) == 1 else f.concat(f"{base}/own", own, 0, dtype, cpu) + ":0"
        rows = f.node(f"{base}/rows", "Slice", [f.shape(f"{base}/shape", local, dtype, cpu) + ":0",
                                                f.const(f"{base}/zero1", [0], "int32", cpu) + ":0",
                                                f.const(f"{base}/one1", [1], "int32", cpu) + ":0"], cpu,
                      T=("type", "int32"), Index=("type", "int32")) + ":0"
        all_rows = self._collective(f"{base}/all_rows", "CollectiveGatherV2", rows, "int32", contributors, 1)
        longest = f.node(f"{base}/longest", "Max", [all_rows, f.const(f"{base}/axis0", [0], "int32", cpu) + ":0"],
                         cpu, T=("type", "int32"), Tidx=("type", "int32"), keep_dims=("bool", True)) + ":0"
        pad_rows = f.binary(f"{base}/pad_rows", "Sub", longest, rows, "int32", cpu) + ":0"
        first = f.concat(f"{base}/pad_first", [f.const(f"{base}/zero1b", [0], "int32", cpu) + ":0", pad_rows], 0,
                         "int32", cpu) + ":0"
        rank = f.node(f"{base}/rank", "Rank", [local], cpu, T=("type", dtype)) + ":0"
        rest_dims = f.node(f"{base}/rest_dims", "Pack",
                           [f.binary(f"{base}/rank_1", "Sub", rank, f.const(f"{base}/one", 1, "int32", cpu) + ":0",
                                     "int32", cpu) + ":0", f.const(f"{base}/two", 2, "int32", cpu) + ":0"], cpu,
                           N=("int", 2), T=("type", "int32"), axis=("int", 0)) + ":0"
        rest = f.node(f"{base}/pad_rest", "Fill", [rest_dims, f.const(f"{base}/zero", 0, "int32", cpu) + ":0"], cpu,
                      T=("type", "int32"), index_type=("type", "int32")) + ":0"
        paddings = f.concat(f"{base}/paddings", [f.node(f"{base}/pad_first2", "Reshape",
                                                        [first, f.const(f"{base}/shape12", [1, 2], "int32", cpu) + ":0"],
                                                        cpu, T=("type", "int32"), Tshape=("type", "int32")) + ":0",
                                                 rest], 0, "int32", cpu) + ":0"
        padded = f.node(f"{base}/padded", "Pad", [local, paddings], cpu, T=("type", dtype),
                        Tpaddings=("type", "int32")) + ":0"
        gathered = self._collective(f"{base}/all", "CollectiveGatherV2", padded, dtype, contributors, 2)
        # Keep row j of task t's block where j < its row count.
        longest0 = f.node(f"{base}/longest0", "Squeeze", [longest], cpu, T=("type", "int32"),
                          squeeze_dims=("list_int", [0])) + ":0"
        positions = f.node(f"{base}/positions", "Range", [f.const(f"{base}/r0", 0, "int32", cpu) + ":0", longest0,
                                                           f.const(f"{base}/r1", 1, "int32", cpu) + ":0"], cpu,
                           Tidx=("type", "int32")) + ":0"
        keep = f.node(f"{base}/keep", "Less", [positions, f.node(f"{base}/rows_col", "ExpandDims",
                                                                  [all_rows, f.const(f"{base}/ax1", 1, "int32", cpu) + ":0"],
                                                                  cpu, T=("type", "int32"), Tdim=("type", "int32")) + ":0"],
                      cpu, T=("type", "int32")) + ":0"
        flat = f.node(f"{base}/keep_flat", "Reshape", [keep, f.const(f"{base}/m1", [-1], "int32", cpu) + ":0"], cpu,
                      T=("type", "bool"), Tshape=("type", "int32")) + ":0"
        where = f.node(f"{base}/where", "Where", [flat], cpu, T=("type", "bool")) + ":0"
        index = f.node(f"{base}/index", "Reshape", [where, f.const(f"{base}/m1b", [-1], "int32", cpu) + ":0"], cpu,
                       T=("type", "int64"), Tshape=("type", "int32")) + ":0"
        f.node(node.name, "GatherV2", [gathered, index, f.const(f"{base}/gather_axis", 0, "int32", cpu) + ":0"], cpu,
               unique=False, Tparams=("type", dtype), Tindices=("type", "int64"), Taxis=("type", "int32"),
               batch_dims=("int", 0))

    def _own_part(self, node: NodeDef, values: Sequence[str] | None = None) -> tuple[list[str], tuple[int, ...]]:
        contributors = self.sums[node.name]
        if self.task not in contributors:
            raise NotLocal(f"between-graph: task {self.task} needs {node.name!r}, which joins values it holds no "
                           f"part of")
        values = [i for i in (node.input if values is None else values) if not i.startswith("^")]
        own = [i for i in values if self.node_task(_source(i)) == self.task]
        for inp in own:
            self.needed_by.setdefault(_source(inp), node.name)
            self.visit(_source(inp))
        return own, contributors

    def _collective(self, name: str, op: str, value: str, dtype: str, contributors: tuple[int, ...], slot: int,
                    unique: bool = True, **attrs: AttrSpec) -> str:
        """A collective over the contributing tasks' CPUs; its instance key is this cross-task join's
        (`slot`: which of its collectives), the same on every task."""
        f, cpu = self.f, self.cpu
        key = self.key_base + 2 * SUM_KEYS - 1 - (3 * self.sum_index[name.split("/tag_gather")[0]] + slot)
        mask = sum(1 << t for t in contributors)
        inputs = [value, f.const(f"{name}/tag_group_size", len(contributors), "int32", cpu) + ":0",
                  f.const(f"{name}/tag_group_key", GROUP_KEY_FLAG | mask, "int32", cpu) + ":0",
                  f.const(f"{name}/tag_instance_key", key, "int32", cpu) + ":0"]
        return f.node(name, op, inputs, cpu, control=(), unique=unique, T=("type", dtype),
                      communication_hint=("s", "auto"), timeout_seconds=("f", 0.0), Nordering_token=("int", 0),
                      **attrs) + ":0"


@dataclasses.dataclass(frozen=True)
class _Bucket:
    """A fused gradient all-reduce of the compiled graph: one CollectiveReduceV2 (a sum) per member
    device over a pack (ConcatV2) that one SplitV unpacks; `members`: task -> its instance."""
    key: int
    dtype: str
    members: Mapping[int, str]
    splits: Mapping[int, str]        # task -> the SplitV unpacking its instance


def _buckets(graph_def: GraphDef, nodes: Mapping[str, NodeDef]) -> list[_Bucket]:
    """The compiled graph's fused all-reduces a sum over tasks can ride: one member per task, a sum
    (merge Add, final Id) of a pack that nothing else reads, unpacked by one SplitV of constant sizes."""
    readers: dict[str, list[str]] = {}
    for n in graph_def.node:
        for i in n.input:
            if not i.startswith("^"):
                readers.setdefault(_source(i), []).append(n.name)
    found: dict[int, dict[int, tuple[str, str]]] = {}
    dtypes: dict[int, str] = {}
    shared: set[int] = set()        # buckets with two members on one task: not one contribution per task
    for n in graph_def.node:
        if (n.op != "CollectiveReduceV2" or n.attr["merge_op"].s != b"Add" or n.attr["final_op"].s != b"Id"
                or len(n.input) < 4 or nodes[_source(n.input[3])].op != "Const"):
            continue
        pack, task, split = nodes.get(_source(n.input[0])), task_of(n.device), readers.get(n.name, [])
        if (task is None or pack is None or pack.op != "ConcatV2" or readers.get(pack.name) != [n.name]
                or len(split) != 1 or nodes[split[0]].op != "SplitV"
                or nodes[_source(nodes[split[0]].input[1])].op != "Const"):
            continue
        key = _const_int(nodes[_source(n.input[3])])
        members = found.setdefault(key, {})
        if task in members:
            shared.add(key)
        members[task] = (n.name, split[0])
        dtypes[key] = _dtype(n.attr["T"].type)
    return [_Bucket(key, dtypes[key], {t: m[0] for t, m in members.items()}, {t: m[1] for t, m in members.items()})
            for key, members in sorted(found.items()) if key not in shared]


def _riders(graph_def: GraphDef, nodes: Mapping[str, NodeDef], cutters: Mapping[int, _Cutter],
            sums: Mapping[str, tuple[int, ...]]) -> dict[str, _Bucket]:
    """Sum over tasks -> the gradient bucket whose all-reduce carries it.

    A whole-batch fetch summed over the tasks (the loss) would otherwise cost every step a
    collective of its own, a round trip between processes as long as a small model's compute. It
    rides the last fused bucket of the same tasks and dtype that every contributor runs and that
    its partial does not depend on; the same choice on every task (decided here, for all)."""
    buckets = _buckets(graph_def, nodes)
    chosen: dict[str, _Bucket] = {}
    for name in sorted(sums):
        takers = [c for c in cutters.values() if name in c.partials]
        if not takers or sorted(c.task for c in takers) != list(sums[name]):
            continue
        dtype, contributors = takers[0].partials[name][1], takers[0].partials[name][2]
        reads = {c.task: c.ancestors(c.partials[name][0]) for c in takers}
        for bucket in reversed(buckets):
            if bucket.dtype != dtype or sorted(bucket.members) != list(contributors):
                continue
            if all(bucket.members[c.task] in c.out and not _touches(c, bucket, reads[c.task]) for c in takers):
                chosen[name] = bucket
                break
    return chosen


def _touches(cutter: _Cutter, bucket: _Bucket, nodes: set[str]) -> bool:
    """Whether `nodes` hold task's instance of the bucket, its pack or its unpacking (a partial read
    after them cannot ride in them)."""
    member = bucket.members[cutter.task]
    return bool({member, _source(cutter.out[member].input[0]), bucket.splits[cutter.task]} & nodes)


# Ops that keep every plan of a graph driven by one client (`localize` refuses them: an input pipeline
# on one task, BatchNorm's reserve space joined across replicas); a graph holding one cannot run
# between-graph, whatever the plan.
ONE_DRIVER_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
                            "QueueDequeueV2", "QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeue",
                            "QueueDequeueMany", "QueueDequeueUpTo", "ReaderReadV2", "ReaderReadUpToV2",
                            "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})


_GATHER_TYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int32", "int64"})


def _dtype(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(enum).name


def _const_int(node: NodeDef) -> int:
    """The value of an int scalar Const (an axis, an instance key)."""
    from tensorflow.python.framework import tensor_util

    return tensor_util.MakeNdarray(node.attr["value"].tensor).tolist()


def _const_ints(node: NodeDef) -> list[int]:
    """The values of an int vector Const (split sizes)."""
    from tensorflow.python.framework import tensor_util

    return tensor_util.MakeNdarray(node.attr["value"].tensor).tolist()


def _int32_tensor(values: Sequence[int]) -> TensorProto:
    from tensorflow.python.framework import tensor_util

    return tensor_util.make_tensor_proto(np.asarray(values, dtype=np.int32))


def localize(graph_def: GraphDef, tensors: Sequence[str], ops: Sequence[str],
             instances: Mapping[str, Sequence[str]], key_base: int) -> dict[int, TaskGraph]:
    """One TaskGraph per task that holds a device of `graph_def`, able to fetch `tensors` and run
    `ops` (compiled names). `instances`: original op -> its compiled instances (to find a task's own
    copy of a value replicated on every device); `key_base`: the graph's instance-key slot
    (`compile.instance_key_base`). NotLocal when any task cannot run its part on its own."""
    from tensorflow.core.framework import graph_pb2

    nodes = {n.name: n for n in graph_def.node}
    tasks = sorted({t for n in graph_def.node if (t := task_of(n.device)) is not None})
    if len(tasks) < 2:
        raise NotLocal("between-graph: the graph runs on one task")
    if tasks[-1] >= _MAX_TASKS:
        raise NotLocal(f"between-graph: more than {_MAX_TASKS} tasks")
    # Joins over tasks: sums of partials (AddN) and concatenations of shards (the compiler's tag/concat).
    sums: dict[str, tuple[int, ...]] = {}
    for n in graph_def.node:
        if n.op == "AddN" or (n.op == "ConcatV2" and n.name.startswith("tag/concat/")):
            values = n.input[:n.attr["N"].i]
            held = {task_of(nodes[_source(i)].device) for i in values if not i.startswith("^") and _source(i) in nodes}
            if len(held) > 1:
                sums[n.name] = tuple(sorted(t for t in held if t is not None))
    # A join that replicas read back (not a fetch adapter or a single-device op) would cost each
    # step its collectives, per join and in order; the chief-driven graph moves those bytes in one
    # round trip. (FusedBatchNorm's reserve-space outputs are joined so: BatchNorm models stay
    # chief-driven.)
    instance_of: dict[str, tuple[str, ...]] = {}
    for group in instances.values():
        for name in group:
            instance_of[name] = tuple(group)
    for n in graph_def.node:
        if len(instance_of.get(n.name, ())) > 1:
            for i in n.input:
                if _source(i) in sums:
                    raise NotLocal(f"between-graph: {_source(i)!r} joins values of several tasks and is read back "
                                   f"by the replica {n.name!r}")
    if 3 * len(sums) > SUM_KEYS:
        raise NotLocal(f"between-graph: {len(sums)} joins across tasks (at most {SUM_KEYS // 3})")
    used = [_const_int(nodes[_source(n.input[3])]) for n in graph_def.node
            if n.op.startswith("Collective") and len(n.input) > 3 and _source(n.input[3]) in nodes
            and nodes[_source(n.input[3])].op == "Const"]
    if any(k >= key_base + SUM_KEYS - 1 for k in used):
        raise NotLocal("between-graph: the compiled graph's collectives use the instance keys its joins across "
                       "tasks would take")
    cpus = {}
    for n in graph_def.node:
        t = task_of(n.device)
        if t is not None and t not in cpus:
            cpus[t] = n.device[:n.device.index(f"/task:{t}")] + f"/task:{t}/device:CPU:0"
    cutters = {t: _Cutter(nodes, t, cpus[t], sums, instance_of, key_base, sorted(sums)) for t in tasks}
    for cutter in cutters.values():
        for name in [*(_source(t) for t in tensors), *ops]:
            cutter.visit(name)
    # Every contributor of a sum any task needs runs it, every step: a collective waits for all.
    while True:
        needed = set().union(*(c.used_sums for c in cutters.values()))
        missing = [(t, s) for t, c in cutters.items() for s in sorted(needed)
                   if t in sums[s] and s not in c.used_sums]
        if not missing:
            break
        for t, s in missing:
            cutters[t].visit(s)
    riders = _riders(graph_def, nodes, cutters, sums)
    for cutter in cutters.values():
        cutter.emit_sums(riders)
    out = {}
    for t, cutter in cutters.items():
        gd = graph_pb2.GraphDef()
        gd.versions.CopyFrom(graph_def.versions)
        gd.library.CopyFrom(graph_def.library)
        gd.node.extend(cutter.out.values())
        gd.node.extend(cutter.f.nodes)
        for node in gd.node:      # postcondition: nothing of another task is left
            if task_of(node.device) != t:
                raise AssertionError(f"localize: {node.name!r} on {node.device!r} in task {t}'s graph")
        always = tuple(sorted(s for s in cutter.used_sums))
        out[t] = TaskGraph(t, gd, always, frozenset(tensors), frozenset(ops), tuple(tasks), cpus[t],
                           key_base + SUM_KEYS - 1, GROUP_KEY_FLAG | sum(1 << x for x in tasks),
                           tuple(sorted(s for s in cutter.partials if s in riders)))
    return out


__all__ = ["ONE_DRIVER_OPS", "NotLocal", "TaskGraph", "localize", "task_of"]
