"""Builds the distributed GraphDef: op instances per layout plus the conversions between them.

Every input of every instance goes through `materialize(tensor, layout, replica, required state)`.
When the producer's state on its layout differs from what the consumer needs, a conversion is
inserted (and memoised, so all consumers share it):

  need \\ have   split (same shards)   split (other shards)   partial            full             local
  split          as is                 Concat + SplitV        -                  SplitV           recompute globally, SplitV
  partial        as is (same devices)  -                      -                  replica 0 only, zeros elsewhere
  full           Concat                Concat                 AllReduce / AddN   as is            recompute globally
  local          as is (same shards)   recompute for layout   -                  recompute for layout

GraphBuilder is assembled from parts, each in its own module:
  base.py         what all parts share: the inputs, the emitted instances (`outputs`) and the memo
  builder.py      (this module) the op instances, `materialize` and the conversions, the fetches
  collectives.py  all-reduces and fused sums: reserved while the ops are emitted, bucketed and built
                  last (`_emit_collectives`), in one global order so that rings cannot deadlock
  shapes.py       row counts and Shape/Size values for shards and dynamic batches, in the graph
  transfers.py    a pipeline's transfers over slow links sent in micro-batch order
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.analysis.rules import SHAPE_OPS
from tag_tf.analysis.simplify import training_ops
from tag_tf.analysis.states import FULL, Flag, Kind, State
from tag_tf.compiler.collectives import CollectivesMixin
from tag_tf.compiler.devices import DeviceMap
from tag_tf.compiler.shapes import ShapesMixin
from tag_tf.compiler.transfers import TransfersMixin
from tag_tf.errors import CompileError
from tag_tf.ir import TensorRef
from tag_tf.placement.layout import HOST, Layout, Mode, Placement, single
from tag_tf.strategy import Option

if TYPE_CHECKING:
    from tensorflow.core.framework.node_def_pb2 import NodeDef


class GraphBuilder(CollectivesMixin, ShapesMixin, TransfersMixin):
    def __init__(self, analysis: Analysis, placement: Placement, devices: DeviceMap,
                 fusion_bytes: int | None = None, instance_key_base: int = 0, sync_after_backward: bool = False,
                 ordered_links: Sequence[tuple[int, int]] = ()):
        super().__init__(analysis, placement, devices)       # BuilderBase: inputs, outputs, memo
        self._init_collectives(fusion_bytes, instance_key_base, sync_after_backward)
        self._training_ops = training_ops(self.graph)
        self._pipelined: bool | None = None
        self.ordered_links = frozenset(ordered_links)   # (sender, receiver) machines: transfers in order
        self.ordered_transfers = 0        # transfers that wait for the micro-batch before (transfers.py)

    # =========================================================================================
    # Emission of the original ops
    # =========================================================================================
    def emit_all(self) -> None:
        for name in self.graph.order:
            self._emitting_training = name in self._training_ops
            lay = self.placement.of(name)
            self.instances[name] = []
            self.outputs[name] = []
            for j in range(lay.size):
                node_name, outs = self._emit_instance(name, lay, j, self._instance_name(name, lay, j))
                self.instances[name].append(node_name)
                self.outputs[name].append(outs)
        self._emitting_training = False
        nodes = {n.name: n for n in self.f.nodes}
        for name in self.graph.order:       # control edges, once every instance exists
            self._wire_control(name, nodes)
        self._emit_collectives()
        # Last: whether a gate would close a cycle depends on every edge (an all-reduce can join
        # the micro-batches, e.g. a loss divided by the batch's token count).
        self._gate_microbatches({n.name: n for n in self.f.nodes})
        loss = self.graph.meta.loss
        if self.pipelined and loss and self.ordered_links:
            forward = self.graph.ancestors([TensorRef.parse(loss).op]) & self._training_ops
            self.ordered_transfers = self._order_transfers(forward, self.ordered_links)

    def _gate_microbatches(self, nodes: dict[str, NodeDef]) -> None:
        """The pipeline schedule (GPipe's forward): on each device, a stage's forward pass of
        micro-batch m starts once that of micro-batch m - 1 is done there. Left to the dataflow
        alone, every micro-batch's first op is ready at once and the device runs them breadth first:
        micro-batch 0 would leave the stage only when all of them do, and the next stage would wait.
        Per micro-batched layout and device, a NoOp gate waits for micro-batch m - 1's exits (its
        forward ops no other forward op of the stage reads) and micro-batch m's entries (forward ops
        reading nothing forward from the stage) wait for it. A stage whose forward pass joins its
        micro-batches (an op needing the whole batch: exact batch statistics) is left ungated: its
        micro-batch 0 waits for the others anyway, and a gate would close a cycle. kernels/expand.h
        adds the same edges."""
        loss = self.graph.meta.loss
        if not loss:
            return
        forward = self.graph.ancestors([TensorRef.parse(loss).op]) & self._training_ops
        stages: dict[Layout, list[str]] = {}
        for name in self.graph.order:
            lay = self.placement.of(name)
            if name in forward and lay.micro > 1:
                stages.setdefault(lay, []).append(name)
        for lay, ops in stages.items():
            members = set(ops)
            read = {r.op for o in ops for r in self.graph.op(o).inputs if r.op in members}
            entries = [o for o in ops if not any(r.op in members for r in self.graph.op(o).inputs)]
            exits = [o for o in ops if o not in read]
            k = lay.size // lay.micro
            later = {self.instances[o][j] for o in ops for j in range(k, lay.size)}
            if self._reaches(nodes, [self.instances[o][i] for o in exits for i in range(k)], later):
                continue
            for m in range(1, lay.micro):
                for i in range(k):
                    j, prev = m * k + i, (m - 1) * k + i
                    gate = self.f.no_op(f"tag/gate/m{m}/{lay.devices[j]}", [self.instances[o][prev] for o in exits],
                                        self.devices[lay.devices[j]])
                    nodes[gate] = self.f.nodes[-1]          # later stages' checks see this stage's gates
                    for o in entries:
                        nodes[self.instances[o][j]].input.append(f"^{gate}")

    @staticmethod
    def _reaches(nodes: dict[str, NodeDef], start: Sequence[str], targets: set[str]) -> bool:
        """Whether any of `targets` is an ancestor (data or control) of a node in `start`."""
        seen: set[str] = set()
        stack = list(start)
        while stack:
            name = stack.pop()
            if name in seen or name not in nodes:
                continue
            seen.add(name)
            for i in nodes[name].input:
                src = i.lstrip("^").split(":")[0]
                if src in targets:
                    return True
                stack.append(src)
        return False

    @staticmethod
    def _instance_name(op: str, lay: Layout, j: int) -> str:
        return op if lay.size == 1 else f"tag_r{j}/{op}"

    def _emit_instance(self, op: str, lay: Layout, j: int, name: str) -> tuple[str, list[str]]:
        """Copy op's NodeDef as instance j of `lay`, with its inputs materialized."""
        from tensorflow.core.framework import node_def_pb2

        src = self.graph.op(op)
        ann = self.a.annotations[op]
        device = self.devices[lay.devices[j]]
        replicated = lay.mode is Mode.REPLICATED
        node = node_def_pb2.NodeDef()
        node.CopyFrom(self.graph.node_def(op))
        node.name = name
        self.f.reserve(name)
        node.device = device
        if "_class" in node.attr:      # we place every op explicitly; stale colocation names would clash
            del node.attr["_class"]
        del node.input[:]
        for i, ref in enumerate(src.inputs):
            if ref.op not in self.outputs and self.graph.op(ref.op).type in ("NextIteration", "RefNextIteration"):
                # A loop's back edge (read by its Merge before it is emitted): the name it will have,
                # the copy on this device.
                play = self.placement.of(ref.op)
                k = j if play.devices == lay.devices else \
                    play.devices.index(lay.devices[j]) if lay.devices[j] in play.devices else 0
                node.input.append(f"{self._instance_name(ref.op, play, k)}:{ref.index}")
                continue
            need = ann.requires[i] if replicated else FULL
            node.input.append(self.materialize(ref, lay, j, need))
        outs = [f"{name}:{k}" for k in range(len(src.outputs))]
        if src.type in ("Enter", "RefEnter") and lay.size > 1:
            # Each copy of a TF1 loop is its own frame: copies sharing a frame name would be one loop.
            node.attr["frame_name"].s = node.attr["frame_name"].s + f"/tag_r{j}".encode()
        if replicated and Flag.LOCAL_CONST in ann.flags:
            self._rescale_const(node, op, lay.counts[j])
        elif replicated and Flag.SLICE_CONST in ann.flags:
            self._slice_const(node, op, ann.outputs[0], lay, j)
        self.f.add(node)
        if replicated and Flag.MEAN_SCALE in ann.flags:
            outs[0] = self._mean_scale(op, name, node.input[0], lay, j, device)
        return name, outs

    def _wire_control(self, op: str, nodes: dict[str, NodeDef]) -> None:
        src = self.graph.op(op)
        if not src.control_inputs:
            return
        lay = self.placement.of(op)
        for j, inst in enumerate(self.instances[op]):
            node = nodes[inst]
            for c in src.control_inputs:
                clay = self.placement.of(c)
                # Same replicas, or replicas holding the same rows (a pipeline's stages: micro-batch m
                # of one waits for micro-batch m of the other): replica j waits for replica j;
                # otherwise for every instance. Waiting for every micro-batch, each `tf.tuple` of a
                # gradient whose ops two stages share joined the micro-batches' backward passes.
                # Two stages of different widths (micro-batched alike): micro-batch m waits for
                # micro-batch m's instances; waiting for all, a far stage's micro-batch 0 waited
                # for micro-batch 1 on a wider one.
                if clay.size > 1 and clay.mode is lay.mode and (clay.devices == lay.devices or clay.lines_up(lay)):
                    deps = [self.instances[c][j]]
                elif clay.micro == lay.micro > 1 and clay.mode is lay.mode is Mode.REPLICATED:
                    k, kc = lay.size // lay.micro, clay.size // clay.micro
                    deps = self.instances[c][j // k * kc:(j // k + 1) * kc]
                else:
                    deps = self.instances[c]
                node.input.extend(f"^{d}" for d in deps)

    # -- per-replica rewrites -----------------------------------------------------------------
    def _rescale_const(self, node: NodeDef, op: str, count: int) -> None:
        from tensorflow.python.framework import tensor_util

        value = self.graph.attr(op, "value")
        mask = self.a.batch.batch_consts[op]
        b = self.a.batch_size
        scaled = np.where(mask, value // b * count, value).astype(value.dtype)
        node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(scaled, shape=value.shape))

    def _slice_const(self, node: NodeDef, op: str, state: State, lay: Layout, j: int) -> None:
        from tensorflow.python.framework import tensor_util

        value = self.graph.attr(op, "value")
        start = sum(lay.counts[:j]) * state.mult
        rows = lay.counts[j] * state.mult
        index = [slice(None)] * value.ndim
        index[state.axis] = slice(start, start + rows)
        node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value[tuple(index)]))

    def _mean_scale(self, op: str, name: str, x: str, lay: Layout, j: int, device: str) -> str:
        """A Mean over the batch on a shard, rescaled so that summing the replicas gives the mean."""
        dtype = self.graph.op(op).outputs[0].base_dtype
        if lay.counts:
            ratio = self.f.const(f"{name}/tag_share", lay.counts[j] / self.a.batch_size, dtype, device)
        else:
            ref = self.graph.op(op).inputs[0]
            state = self.a.annotations[op].requires[0]
            local_rows = self._dim(x, state.axis, self._dtype(ref), device)
            total = self._global_rows(state.mult, device, ref.op)
            ratio = self.f.binary(f"{name}/tag_share", "RealDiv",
                                  self.f.cast(f"{name}/tag_local_rows", local_rows, "int32", dtype, device),
                                  self.f.cast(f"{name}/tag_total_rows", total, "int32", dtype, device),
                                  dtype, device)
        # A replica can get no rows when a run-time batch is smaller than the replica count: its
        # Mean is then NaN, and MulNoNan makes its zero share contribute exactly 0.
        op = "Mul" if lay.counts else "MulNoNan"
        return self.f.binary(f"{name}/tag_scaled", op, f"{name}:0", ratio, dtype, device) + ":0"

    # =========================================================================================
    # Materialization
    # =========================================================================================
    def materialize(self, ref: TensorRef, lay: Layout, j: int, need: State) -> str:
        if lay.mode is Mode.REPLICATED:
            if need.kind is Kind.SPLIT:
                return self._as_split(ref, lay, need)[j]
            if need.kind is Kind.PARTIAL:
                return self._as_partial(ref, lay, j)
            if need.kind is Kind.LOCAL:
                return self._as_local(ref, lay, j)
        return self.full_on(ref, lay.devices[j], lay, j)

    # -- full -----------------------------------------------------------------------------------
    def full_on(self, ref: TensorRef, device: int, consumer: Layout | None = None, replica: int | None = None) -> str:
        """ref's whole value on `device`, for `consumer`'s instance `replica` when given (a replica
        reads its own replica's copy: micro-batches of one device, each copy of a loop its frame's)."""
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        if state.kind is Kind.FULL:
            if replica is not None and consumer is not None and consumer.devices == play.devices:
                return self.out(ref, replica)
            if device in play.devices:
                return self.out(ref, play.devices.index(device))
            machine = self.devices.machine(device)
            if device != HOST and self.pipelined and machine != self.devices.machine(play.devices[0]):
                # A pipelined plan moves a whole value to another machine once: the machine's other
                # devices copy it from the first one there (kernels/expand.h full_on, the same rule).
                return self._memo_get(("relay", ref, machine), lambda: self._relay(self.out(ref, 0), ref, device))
            return self.out(ref, 0)
        if state.kind is Kind.SPLIT:
            return self._memo_get(("concat", ref, device), lambda: self._concat(ref, device))
        if state.kind is Kind.PARTIAL:
            if (consumer is not None and consumer.mode is not Mode.SINGLE and play.option is Option.ALLREDUCE
                    and set(consumer.devices) == set(play.devices) and len(play.distinct) > 1):
                return self._all_reduce(ref)[play.distinct.index(device)]
            agg = device if consumer is None or consumer.mode is Mode.SINGLE else play.devices[0]
            if play.micro > 1 and play.distinct == (agg,):
                total = self._device_sum(ref, agg)    # a stage alone on agg: its micro-batches' sum is the sum
            else:
                total = self._memo_get(("addn", ref, agg), lambda: self._add_n(ref, agg))
            machine = self.devices.machine(device)
            if device in (agg, HOST) or not self.pipelined or machine == self.devices.machine(agg):
                return total
            return self._memo_get(("relay", ref, agg, machine), lambda: self._relay(total, ref, device))
        return self._global_value(ref, device)

    @property
    def pipelined(self) -> bool:
        """Whether the plan runs micro-batches (any layout does)."""
        if self._pipelined is None:
            self._pipelined = any(lay.micro > 1 for lay in self.placement.layouts.values())
        return self._pipelined

    def _relay(self, value: str, ref: TensorRef, device: int) -> str:
        """`value` (of ref) copied onto `device`: the first device of its machine that needs it."""
        return self.f.node(f"tag/relay/{ref.op}", "Identity", [value], self.devices[device],
                           T=("type", self._dtype(ref))) + ":0"

    def _concat(self, ref: TensorRef, device: int) -> str:
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        pieces = [self.out(ref, k) for k in range(play.size)]
        return self.f.concat(f"tag/concat/{ref.op}", pieces, state.axis, self._dtype(ref),
                             self.devices[device]) + ":0"

    # -- split ----------------------------------------------------------------------------------
    def _as_split(self, ref: TensorRef, lay: Layout, need: State) -> list[str]:
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        if ((play.same_split(lay) or play.lines_up(lay)) and state.kind is Kind.SPLIT and state.axis == need.axis
                and state.mult == need.mult):
            return [self.out(ref, j) for j in range(lay.size)]      # TF sends each piece where it goes
        if (play.mode is Mode.REPLICATED and play.micro == lay.micro > 1 and bool(play.counts) == bool(lay.counts)
                and state.kind is Kind.SPLIT and state.axis == need.axis and state.mult == need.mult):
            key: tuple = ("split", ref, lay.devices, lay.counts, lay.weights, need.axis, need.mult, "by micro-batch")
            return self._memo_get(key, lambda: self._split_by_microbatch(ref, play, lay, need))
        key = ("split", ref, lay.devices, lay.counts, lay.weights, need.axis, need.mult)
        return self._memo_get(key, lambda: self._split(ref, play, state, lay, need))

    def _split_by_microbatch(self, ref: TensorRef, play: Layout, lay: Layout, need: State) -> list[str]:
        """Between two pipeline stages split over different devices (both cut the batch into the same
        micro-batches): each micro-batch's pieces are regrouped on their own, so micro-batch m of the
        next stage waits for micro-batch m of this one only. With a dynamic batch the micro-batches'
        bounds agree too (floor(N * m / M) rows on both sides: `_runtime_sizes`), and the next stage's
        rows within micro-batch m are its own layout's, computed at run time (`_micro_sizes`);
        gathering the whole batch first, a stage's micro-batch 0 waited for every micro-batch."""
        micro, kp, kc = lay.micro, play.size // lay.micro, lay.size // lay.micro
        dtype = self._dtype(ref)
        pieces: list[str] = []
        for m in range(micro):
            have = [self.out(ref, j) for j in range(m * kp, (m + 1) * kp)]
            counts = lay.counts[m * kc:(m + 1) * kc]
            if lay.counts and play.counts[m * kp:(m + 1) * kp] == counts:
                pieces += have
                continue
            at = lay.devices[m * kc]
            device = self.devices[at]
            whole = have[0] if kp == 1 else self.f.concat(f"tag/concat/{ref.op}/m{m}", have, need.axis, dtype,
                                                          device) + ":0"
            if kc == 1:
                pieces.append(whole)
                continue
            if counts:
                sizes = self.f.const(f"tag/split/{ref.op}/m{m}/sizes", [c * need.mult for c in counts], "int32",
                                     device)
            else:
                sizes = self._micro_sizes(ref, lay, need, m, at)
            name = self.f.split_v(f"tag/split/{ref.op}/m{m}", whole, sizes, need.axis, kc, dtype, device)
            pieces += [f"{name}:{k}" for k in range(kc)]
        return pieces

    def _split(self, ref: TensorRef, play: Layout, state: State, lay: Layout, need: State) -> list[str]:
        # Split where the whole value is (or where it is assembled), then TF sends each piece.
        if state.kind is Kind.FULL:
            at = lay.devices[0] if lay.devices[0] in play.devices else play.devices[0]
        else:
            at = lay.devices[0]
        full = self.full_on(ref, at)
        dtype = self._dtype(ref)
        device = self.devices[at]
        if lay.counts:
            sizes = self.f.const(f"tag/split/{ref.op}/sizes", [c * need.mult for c in lay.counts], "int32", device)
        else:
            sizes = self._runtime_sizes(full, dtype, need, lay, at)
        name = self.f.split_v(f"tag/split/{ref.op}", full, sizes, need.axis, lay.size, dtype, device)
        return [f"{name}:{k}" for k in range(lay.size)]

    # -- partial --------------------------------------------------------------------------------
    def _as_partial(self, ref: TensorRef, lay: Layout, j: int) -> str:
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        if state.kind is Kind.PARTIAL and play.mode is Mode.REPLICATED and play.devices == lay.devices:
            return self.out(ref, j)
        full = self.full_on(ref, lay.devices[0])
        if j == 0:
            return full
        device = lay.devices[j]

        def zeros() -> str:
            local = self.full_on(ref, device) if state.kind is Kind.FULL else full
            return self.f.unary(f"tag/zeros/{ref.op}", "ZerosLike", local, self._dtype(ref),
                                self.devices[device]) + ":0"
        return self._memo_get(("zeros", ref, device), zeros)

    # -- local ----------------------------------------------------------------------------------
    def _as_local(self, ref: TensorRef, lay: Layout, j: int) -> str:
        play = self.placement.of(ref.op)
        if play.same_split(lay) and self.state_of(ref).kind is Kind.LOCAL:
            return self.out(ref, j)
        return self._recompute(ref, lay, j)

    def _recompute(self, ref: TensorRef, lay: Layout, j: int) -> str:
        """The value op `ref.op` has when run on replica j's shard of `lay` (a clone instance)."""
        def build() -> list[str]:
            static = self._static_local(ref.op, lay, j)
            if static is not None:
                return static
            name = self.f.unique(f"tag/local/{'-'.join(map(str, lay.devices))}/r{j}/{ref.op}")
            self._recompute_depth += 1
            try:
                return self._emit_instance(ref.op, lay, j, name)[1]
            finally:
                self._recompute_depth -= 1
        return self._memo_get(("recompute", ref.op, lay.devices, lay.counts, lay.weights, j), build)[ref.index]

    def _global_value(self, ref: TensorRef, device: int) -> str:
        """The original (whole-batch) value of a LOCAL tensor, recomputed on `device`."""
        def build() -> list[str]:
            ann = self.a.annotations[ref.op]
            if Flag.LOCAL_CONST in ann.flags:
                return [self.f.const(f"tag/global/{ref.op}", self.graph.attr(ref.op, "value"),
                                     self.graph.op(ref.op).outputs[0].base_dtype, self.devices[device]) + ":0"]
            src = self.graph.op(ref.op)
            if src.type in SHAPE_OPS and not self.placement.dynamic:
                outs = []
                for k, r in enumerate(src.inputs if src.type == "ShapeN" else src.inputs[:1]):
                    shape = self.graph.tensor(r).shape
                    assert shape is not None, r      # a LOCAL Shape/Size reads a tensor of known rank
                    value = int(np.prod(shape)) if src.type == "Size" else list(shape)
                    outs.append(self.f.const(f"tag/global/{ref.op}", value, src.outputs[k].base_dtype,
                                             self.devices[device]) + ":0")
                return outs
            if src.type in SHAPE_OPS:
                computed = self._global_shapes(ref.op, device)
                if computed is not None:
                    return computed
            name = self.f.unique(f"tag/global/{ref.op}")
            self._recompute_depth += 1
            try:
                return self._emit_instance(ref.op, single(device), 0, name)[1]
            finally:
                self._recompute_depth -= 1
        return self._memo_get(("recompute", ref.op, device), build)[ref.index]

    # -- what was built ---------------------------------------------------------------------------
    @property
    def counts(self) -> dict[str, int]:
        """Conversions the training step executes, by kind; plus those only other ops would run
        (`other_conversions`) and the recomputations of LOCAL values with what they needed.
        `allreduce` counts collectives (a fused bucket is one), `allreduce_tensors` the tensors
        they reduce."""
        kinds = ("split", "concat", "addn", "allreduce", "zeros")
        out = {k: 0 for k in kinds}
        out.update(allreduce_tensors=0, recompute=0, other_conversions=0)
        for key, origin in self._origin.items():
            kind = "allreduce_tensors" if key[0] == "allreduce" else key[0]
            if kind == "recompute":
                out["recompute"] += 1
            elif kind in out:
                if origin == "training":
                    out[kind] += 1
                elif origin == "recompute":
                    out["recompute"] += 1
                else:
                    out["other_conversions"] += 1
        out["accumulate"] = sum(key[0] == "accumulate" and origin == "training"      # micro-batch sums per device
                                for key, origin in self._origin.items())
        out["allreduce"] = sum(any(self._origin.get(k) == "training" for k in b) for b in self._buckets)
        # A fused sum is one AddN for all its members.
        out["addn_tensors"] = out["addn"]
        out["addn"] -= sum(sum(self._origin.get(k) == "training" for k in b) - 1 for b in self._sum_buckets)
        return out

    # =========================================================================================
    # Fetches
    # =========================================================================================
    def fetch_tensor(self, name: str) -> str:
        """A tensor holding the original tensor's whole value on the host."""
        ref = TensorRef.parse(name)
        if ref.op not in self.graph:
            raise CompileError(f"cannot fetch {name!r}: no such op in the graph")
        value = self.full_on(ref, HOST, single(HOST))
        if self.placement.of(ref.op).size == 1 or self.state_of(ref).kind is not Kind.FULL:
            return value
        # One replica's copy holds the whole value, but every replica must run: their control
        # dependencies (e.g. `train_op = with_dependencies([updates], loss)`) reach collectives that
        # wait for all members, and a fetch pulling in one replica alone would wait forever.
        def all_replicas() -> str:
            others = [i for i in self.instances[ref.op] if i != value.rpartition(":")[0]]
            return self.f.node(f"tag/fetch/{ref.op}", "Identity", [value], self.devices[HOST], control=others,
                               T=("type", self._dtype(ref))) + ":0"
        return self._memo_get(("fetch_all", ref), all_replicas)

    def fetch_op(self, name: str) -> str:
        """An op that runs every instance of the original op."""
        if name not in self.instances:
            raise CompileError(f"cannot run {name!r}: no such op in the graph")
        inst = self.instances[name]
        if len(inst) == 1:
            return inst[0]
        return self._memo_get(("fetch_op", name),
                              lambda: self.f.no_op(f"tag/run/{name}", inst, self.devices[HOST]))

    def devices_of(self, op: str) -> Sequence[int]:
        return self.placement.of(op).devices
