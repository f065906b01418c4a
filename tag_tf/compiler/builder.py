"""Builds the distributed GraphDef: op instances per layout plus the conversions between them.

Every input of every instance goes through `materialize(tensor, layout, replica, required state)`.
When the producer's state on its layout differs from what the consumer needs, a conversion is
inserted (and memoised, so all consumers share it):

  need \\ have   split (same shards)   split (other shards)   partial            full             local
  split          as is                 Concat + SplitV        -                  SplitV           recompute globally, SplitV
  partial        as is (same devices)  -                      -                  replica 0 only, zeros elsewhere
  full           Concat                Concat                 AllReduce / AddN   as is            recompute globally
  local          as is (same shards)   recompute for layout   -                  recompute for layout

All-reduces are decided last: while the ops are emitted, each one only reserves the names of its
results; `_emit_collectives` then packs them into buckets (tag_tf/compiler/fusion.py: the strategy's
`fusion_bytes`, or one tensor per collective) and emits them in one global order, each collective
waiting (control edge) for the previous one on each of its devices, so every member issues them in
the same order and rings cannot deadlock. With `sync_after_backward` (DP-NCCL as the paper ran
it) the first collective of each sync level on a device also waits for every value of that level
on the device, so no all-reduce overlaps the backward pass.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.analysis.rules import SHAPE_OPS
from tag_tf.analysis.simplify import training_ops
from tag_tf.analysis.states import FULL, Flag, Kind, State
from tag_tf.compiler.devices import DeviceMap
from tag_tf.compiler.fusion import FusionFacts, assign_buckets
from tag_tf.compiler.nodes import NodeFactory
from tag_tf.compiler.placement import HOST, Layout, Mode, Placement, single
from tag_tf.errors import CompileError
from tag_tf.ir import TensorRef
from tag_tf.strategy import Option

_WEIGHT_SCALE = 10_000   # integer share weights for run-time (dynamic batch) splitting


class GraphBuilder:
    def __init__(self, analysis: Analysis, placement: Placement, devices: DeviceMap,
                 fusion_bytes: int | None = None, instance_key_base: int = 0, sync_after_backward: bool = False):
        self.a = analysis
        self.fusion_bytes = fusion_bytes
        self.sync_after_backward = sync_after_backward
        self._barrier: dict[tuple[int, int], list[str]] = {}    # (level, device) -> ops to wait for
        self.graph = analysis.graph
        self.placement = placement
        self.devices = devices
        self.f = NodeFactory(self.graph.order)
        self.outputs: dict[str, list[list[str]]] = {}        # op -> per instance -> per output tensor name
        self.instances: dict[str, list[str]] = {}            # op -> node names of its instances
        self._memo: dict[tuple, Any] = {}
        self._group_keys: dict[tuple[int, ...], int] = {}
        # Servers remember each collective instance's shape across runs: graphs compiled for the
        # same servers must not reuse instance keys (see compile.instance_key_base).
        self._instance_key = instance_key_base
        self._last_collective: dict[int, str] = {}
        # All-reduces requested while emitting: (memo key, reserved output names per replica).
        self._pending: list[tuple[tuple, list[str]]] = []
        self._buckets: list[list[tuple]] = []        # memo keys per emitted collective
        self._pending_sums: list[tuple[tuple, list[str]]] = []   # AddN on one device, fused
        self._sum_buckets: list[list[tuple]] = []    # memo keys per fused AddN (2+ members)
        self._collectives_done = False
        self._flat_shapes: dict[str, str] = {}          # device -> Const [-1]
        # Who needs each memoised conversion: "training" (an op of the training step), "other" (ops
        # that only run when fetched: init, save, dangling gradient outputs) or "recompute" (inside
        # the recomputation of a LOCAL value). Reuse by a training op upgrades the entry.
        self._origin: dict[tuple, str] = {}
        self._nested: dict[tuple, list[tuple]] = {}   # conversions built while building another
        self._building: list[tuple] = []
        self._training_ops = training_ops(self.graph)
        self._emitting_training = False
        self._recompute_depth = 0

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
            need = ann.requires[i] if replicated else FULL
            node.input.append(self.materialize(ref, lay, j, need))
        outs = [f"{name}:{k}" for k in range(len(src.outputs))]
        if replicated and Flag.LOCAL_CONST in ann.flags:
            self._rescale_const(node, op, lay.counts[j])
        elif replicated and Flag.SLICE_CONST in ann.flags:
            self._slice_const(node, op, ann.outputs[0], lay, j)
        self.f.add(node)
        if replicated and Flag.MEAN_SCALE in ann.flags:
            outs[0] = self._mean_scale(op, name, node.input[0], lay, j, device)
        return name, outs

    def _wire_control(self, op: str, nodes: dict[str, Any]) -> None:
        src = self.graph.op(op)
        if not src.control_inputs:
            return
        lay = self.placement.of(op)
        for j, inst in enumerate(self.instances[op]):
            node = nodes[inst]
            for c in src.control_inputs:
                clay = self.placement.of(c)
                # Same replicas: replica j waits for replica j; otherwise for every instance.
                if clay.size > 1 and clay.mode is lay.mode and clay.devices == lay.devices:
                    deps = [self.instances[c][j]]
                else:
                    deps = self.instances[c]
                node.input.extend(f"^{d}" for d in deps)

    # -- per-replica rewrites -----------------------------------------------------------------
    def _rescale_const(self, node: Any, op: str, count: int) -> None:
        from tensorflow.python.framework import tensor_util

        value = self.graph.attr(op, "value")
        mask = self.a.batch.batch_consts[op]
        b = self.a.batch_size
        scaled = np.where(mask, value // b * count, value).astype(value.dtype)
        node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(scaled, shape=value.shape))

    def _slice_const(self, node: Any, op: str, state: State, lay: Layout, j: int) -> None:
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
            total = self._global_rows(state.mult, device)
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
    def state_of(self, ref: TensorRef) -> State:
        lay = self.placement.of(ref.op)
        if lay.mode is not Mode.REPLICATED:
            return FULL
        outs = self.a.annotations[ref.op].outputs
        return outs[ref.index] if ref.index < len(outs) else FULL

    def out(self, ref: TensorRef, j: int) -> str:
        return self.outputs[ref.op][j][ref.index]

    def materialize(self, ref: TensorRef, lay: Layout, j: int, need: State) -> str:
        if lay.mode is Mode.REPLICATED:
            if need.kind is Kind.SPLIT:
                return self._as_split(ref, lay, need)[j]
            if need.kind is Kind.PARTIAL:
                return self._as_partial(ref, lay, j)
            if need.kind is Kind.LOCAL:
                return self._as_local(ref, lay, j)
        return self.full_on(ref, lay.devices[j], lay)

    # -- full -----------------------------------------------------------------------------------
    def full_on(self, ref: TensorRef, device: int, consumer: Layout | None = None) -> str:
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        if state.kind is Kind.FULL:
            k = play.devices.index(device) if device in play.devices else 0
            return self.out(ref, k)
        if state.kind is Kind.SPLIT:
            return self._memo_get(("concat", ref, device), lambda: self._concat(ref, device))
        if state.kind is Kind.PARTIAL:
            if (consumer is not None and consumer.mode is not Mode.SINGLE and play.option is Option.ALLREDUCE
                    and set(consumer.devices) == set(play.devices)):
                return self._all_reduce(ref)[play.devices.index(device)]
            agg = device if consumer is None or consumer.mode is Mode.SINGLE else play.devices[0]
            return self._memo_get(("addn", ref, agg), lambda: self._add_n(ref, agg))
        return self._global_value(ref, device)

    def _concat(self, ref: TensorRef, device: int) -> str:
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        pieces = [self.out(ref, k) for k in range(play.size)]
        return self.f.concat(f"tag/concat/{ref.op}", pieces, state.axis, self._dtype(ref),
                             self.devices[device]) + ":0"

    def _add_n(self, ref: TensorRef, device: int) -> str:
        """ref's replicas summed on `device`. With fusion, the training step's sums are deferred
        like all-reduces: they are packed per (replicas, device) into buckets by `_emit_collectives`."""
        if self.fusion_bytes and self._emitting_training and not self._recompute_depth and not self._collectives_done:
            name = self.f.unique(f"tag/sum/{ref.op}")
            self._pending_sums.append((("addn", ref, device), [name]))
            return name + ":0"
        play = self.placement.of(ref.op)
        pieces = [self.out(ref, k) for k in range(play.size)]
        return self.f.add_n(f"tag/sum/{ref.op}", pieces, self._dtype(ref), self.devices[device]) + ":0"

    def _emit_sum_bucket(self, members: list[tuple[tuple, list[str]]], target: int) -> None:
        """Members' replicas summed on `target`: each replica packs its pieces into one tensor (one
        transfer per bucket instead of one per gradient), the packs are added and split back."""
        refs = [key[1] for key, _ in members]
        dtype = self._dtype(refs[0])
        device = self.devices[target]
        if len(members) == 1:
            pieces = [self.out(refs[0], k) for k in range(self.placement.of(refs[0].op).size)]
            self.f.add_n(members[0][1][0], pieces, dtype, device, unique=False)
            return
        self._sum_buckets.append([key for key, _ in members])
        base = f"tag/fused_sum/{len(self._sum_buckets)}"
        packs = []
        for d in sorted(self.placement.of(refs[0].op).devices):
            values = [self.out(r, self.placement.of(r.op).devices.index(d)) for r in refs]
            packs.append(self._pack(f"{base}/d{d}", values, dtype, self.devices[d]))
        total = self.f.add_n(f"{base}/sum", packs, dtype, device)
        self._unpack(list(zip(refs, (names[0] for _, names in members))), total + ":0", dtype, device)

    def _pack(self, base: str, values: list[str], dtype: str, device: str) -> str:
        """One flat tensor holding `values` (all on `device`) back to back."""
        flat_shape = self._flat_shapes.get(device) or self._flat_shapes.setdefault(
            device, self.f.const("tag/flat_shape", [-1], "int32", device))
        flat = [self.f.node(f"{base}/flat", "Reshape", [v, flat_shape], device,
                            T=("type", dtype), Tshape=("type", "int32")) for v in values]
        return self.f.concat(f"{base}/pack", flat, 0, dtype, device) + ":0"

    def _all_reduce(self, ref: TensorRef) -> list[str]:
        """Per replica, the name of ref's all-reduced value. Until every op is emitted this only
        reserves the names (the collective is built with its bucket by `_emit_collectives`)."""
        def reserve() -> list[str]:
            play = self.placement.of(ref.op)
            names = [self.f.unique(f"tag/allreduce/{ref.op}/r{k}") for k in range(play.size)]
            key = ("allreduce", ref)
            if self._collectives_done:       # a late request (none is known to occur): alone
                self._emit_bucket([(key, names)])
            else:
                self._pending.append((key, names))
            return [n + ":0" for n in names]
        return self._memo_get(("allreduce", ref), reserve)

    def _emit_collectives(self) -> None:
        facts = FusionFacts(self.a)
        requests = [facts.request(key[1], self.placement.of(key[1].op).devices) for key, _ in self._pending]
        if self.sync_after_backward:
            self._barrier = self._barrier_control(requests)
        for members in assign_buckets(requests, self.fusion_bytes):
            self._emit_bucket([self._pending[i] for i in members], requests[members[0]].level)
        sums = [facts.request(key[1], self.placement.of(key[1].op).devices, key[2]) for key, _ in self._pending_sums]
        for members in assign_buckets(sums, self.fusion_bytes):
            self._emit_sum_bucket([self._pending_sums[i] for i in members], sums[members[0]].target)
        self._pending, self._pending_sums = [], []
        self._collectives_done = True

    def _barrier_control(self, requests: Sequence[Any]) -> dict[tuple[int, int], list[str]]:
        """Per (sync level, device): the ops producing that level's values to all-reduce there
        (the native expander's `emit_collectives` barrier, line for line)."""
        waits: dict[tuple[int, int], list[str]] = {}
        for (key, _), request in zip(self._pending, requests):
            if self._origin.get(key, "training") != "training":
                continue       # only fetched outside the step (metrics, summaries): the planning graph has none
            ref = key[1]
            for j, d in enumerate(self.placement.of(ref.op).devices):
                ops = waits.setdefault((request.level, d), [])
                op = self.out(ref, j).split(":")[0]
                if op not in ops:
                    ops.append(op)
        return waits

    def _emit_bucket(self, members: list[tuple[tuple, list[str]]], level: int = 0) -> None:
        """One collective per replica over the members' values; each member's reserved name ends
        up holding its own reduced value (for several members: flatten, concat, reduce, split,
        reshape)."""
        self._buckets.append([key for key, _ in members])
        first: TensorRef = members[0][0][1]
        play = self.placement.of(first.op)
        devs = play.devices
        dtype = self._dtype(first)
        use_nccl = all(self.devices.gpu[d] for d in devs) and len({self.devices.machine(d) for d in devs}) == 1
        group_key = self._group_keys.setdefault(tuple(sorted(devs)), len(self._group_keys) + 1)
        self._instance_key += 1
        fused = len(members) > 1
        for d in sorted(devs):
            device = self.devices[d]
            # Each member's instance on d (members may list the same devices in another order).
            at = [self.placement.of(key[1].op).devices.index(d) for key, _ in members]
            values = [self.out(key[1], j) for (key, _), j in zip(members, at)]
            if fused:
                base = f"tag/fused/b{self._instance_key}/d{d}"
                value, name = self._pack(base, values, dtype, device), self.f.unique(f"{base}/sum")
            else:
                value, name = values[0], members[0][1][at[0]]
            prev = self._last_collective.get(d)
            control = ([prev] if prev else []) + self._barrier.pop((level, d), [])
            if use_nccl:
                self.f.nccl_all_reduce(name, value, dtype, device, num_devices=len(devs), control=control,
                                       shared_name=f"tag_ar_{self._instance_key}", unique=False)
            else:
                self.f.collective_reduce(name, value, dtype, device, group_size=len(devs), group_key=group_key,
                                         instance_key=self._instance_key, control=control, unique=False)
            self._last_collective[d] = name
            if fused:
                self._unpack([(key[1], names[j]) for (key, names), j in zip(members, at)], name + ":0",
                             dtype, device)

    def _unpack(self, members: list[tuple[TensorRef, str]], packed: str, dtype: str, device: str) -> None:
        """Split a reduced bucket back into its members, each under the name reserved for it."""
        shapes = [list(self.graph.tensor(ref).shape) for ref, _ in members]
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        base = packed.split(":")[0]
        parts = self.f.split_v(f"{base}/unpack", packed, self.f.const(f"{base}/sizes", sizes, "int32", device),
                               0, len(members), dtype, device)
        for i, ((_, name), shape) in enumerate(zip(members, shapes)):
            self.f.node(name, "Reshape", [f"{parts}:{i}", self.f.const(f"{base}/shape", shape, "int32", device)],
                        device, unique=False, T=("type", dtype), Tshape=("type", "int32"))

    # -- split ----------------------------------------------------------------------------------
    def _as_split(self, ref: TensorRef, lay: Layout, need: State) -> list[str]:
        play = self.placement.of(ref.op)
        state = self.state_of(ref)
        if (play.same_split(lay) and state.kind is Kind.SPLIT and state.axis == need.axis
                and state.mult == need.mult):
            return [self.out(ref, j) for j in range(lay.size)]
        key = ("split", ref, lay.devices, lay.counts, lay.weights, need.axis, need.mult)
        return self._memo_get(key, lambda: self._split(ref, play, state, lay, need))

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

    def _runtime_sizes(self, full: str, dtype: str, need: State, lay: Layout, at: int) -> str:
        """Rows per replica computed in the graph from the actual batch: floor(N*W_j/W) boundaries."""
        device = self.devices[at]
        rows = self._dim(full, need.axis, dtype, device)
        w = np.maximum(1, np.round(np.asarray(lay.weights) / min(lay.weights) * _WEIGHT_SCALE)).astype(np.int64)
        cum = np.concatenate([[0], np.cumsum(w)]).astype(np.int32)
        base = f"tag/sizes/{full.split(':')[0]}"
        n = self.f.binary(f"{base}/samples", "FloorDiv", rows,
                          self.f.const(f"{base}/mult", need.mult, "int32", device), "int32", device)
        bounds = self.f.binary(f"{base}/bounds", "FloorDiv",
                               self.f.binary(f"{base}/scaled", "Mul", n, self.f.const(f"{base}/cum", cum, "int32", device),
                                             "int32", device),
                               self.f.const(f"{base}/total", int(cum[-1]), "int32", device), "int32", device)
        hi = self.f.node(f"{base}/hi", "StridedSlice", [bounds, self._c1(base, 1, device), self._c1(base, 0, device),
                                                        self._c1(base, 1, device)], device,
                         T=("type", "int32"), Index=("type", "int32"), end_mask=("int", 1))
        lo = self.f.node(f"{base}/lo", "StridedSlice", [bounds, self._c1(base, 0, device), self._c1(base, -1, device),
                                                        self._c1(base, 1, device)], device,
                         T=("type", "int32"), Index=("type", "int32"))
        diff = self.f.binary(f"{base}/samples_each", "Sub", hi, lo, "int32", device)
        return self.f.binary(f"{base}/rows_each", "Mul", diff,
                             self.f.const(f"{base}/mult2", need.mult, "int32", device), "int32", device)

    def _c1(self, base: str, v: int, device: str) -> str:
        return self.f.const(f"{base}/c", [v], "int32", device)

    def _dim(self, tensor: str, axis: int, dtype: str, device: str) -> str:
        """Scalar int32: size of `tensor` along `axis`, at run time."""
        base = f"tag/dim/{tensor.split(':')[0]}"
        shape = self.f.shape(f"{base}/shape", tensor, dtype, device)
        return self.f.node(f"{base}/d{axis}", "StridedSlice",
                           [shape, self._c1(base, axis, device), self._c1(base, axis + 1, device),
                            self._c1(base, 1, device)], device,
                           T=("type", "int32"), Index=("type", "int32"), shrink_axis_mask=("int", 1))

    def _global_rows(self, mult: int, device: str) -> str:
        """Scalar int32: the global batch size times `mult` (at run time for dynamic graphs)."""
        if not self.placement.dynamic:
            return self._memo_get(("global_rows", mult, device), lambda: self.f.const(
                "tag/global_rows", self.a.batch_size * mult, "int32", device))

        def batch() -> str:
            feed = TensorRef.parse(self.graph.meta.feeds[0])
            fdev = self.placement.of(feed.op).devices[0]
            return self._dim(self.out(feed, 0), 0, self._dtype(feed), self.devices[fdev])
        n = self._memo_get(("global_batch",), batch)
        if mult == 1:
            return n
        return self._memo_get(("global_rows", mult, device), lambda: self.f.binary(
            "tag/global_rows", "Mul", n, self.f.const("tag/mult", mult, "int32", device), "int32", device))

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

    def _static_local(self, op: str, lay: Layout, j: int) -> list[str] | None:
        """Shape/Size of a statically shaped tensor on a shard is a constant: emit that."""
        src = self.graph.op(op)
        if src.type not in SHAPE_OPS or not lay.counts:
            return None
        device = self.devices[lay.devices[j]]
        outs = []
        for k, ref in enumerate(src.inputs if src.type == "ShapeN" else src.inputs[:1]):
            shape = self.a.graph_b1.tensor(ref).shape
            tb = self.a.batch.of(ref)
            if shape is None or any(d < 0 for d in shape) or tb.irregular:
                return None
            dims = list(shape)
            if tb.batched:
                dims[tb.axis] = lay.counts[j] * tb.mult
            dtype = src.outputs[k].base_dtype
            value = int(np.prod(dims)) if src.type == "Size" else dims
            outs.append(self.f.const(f"tag/local/{op}/r{j}", value, dtype, device) + ":0")
        return outs

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
                    value = int(np.prod(shape)) if src.type == "Size" else list(shape)
                    outs.append(self.f.const(f"tag/global/{ref.op}", value, src.outputs[k].base_dtype,
                                             self.devices[device]) + ":0")
                return outs
            if src.type in SHAPE_OPS:
                outs = self._global_shapes(ref.op, device)
                if outs is not None:
                    return outs
            name = self.f.unique(f"tag/global/{ref.op}")
            self._recompute_depth += 1
            try:
                return self._emit_instance(ref.op, single(device), 0, name)[1]
            finally:
                self._recompute_depth -= 1
        return self._memo_get(("recompute", ref.op, device), build)[ref.index]

    def _global_shapes(self, op: str, device: int) -> list[str] | None:
        """Whole-batch Shape/ShapeN/Size outputs of `op` at run time, without moving the data.

        Recomputing the op on one device would gather its split input (a Concat of every shard)
        only to read its shape: one activation-sized transfer per layer-norm gradient per step.
        Instead, take the shape of a shard (the one on `device` when there is one), which differs
        from the whole only along the batch axis, and put the global row count there. None when
        an input is not a plain split tensor (the caller recomputes).
        """
        src = self.graph.op(op)
        dev = self.devices[device]
        outs = []
        for k, ref in enumerate(src.inputs if src.type == "ShapeN" else src.inputs[:1]):
            state, tb = self.state_of(ref), self.a.batch.of(ref)
            if state.kind is not Kind.SPLIT or tb.irregular or tb.axis != state.axis:
                return None
            out_type = src.outputs[k].base_dtype
            play = self.placement.of(ref.op)
            j = play.devices.index(device) if device in play.devices else 0    # a shard already there
            base = f"tag/global/{op}/{k}"
            shard_shape = self.f.shape(f"{base}/shard_shape", self.out(ref, j), self._dtype(ref),
                                       self.devices[play.devices[j]])
            rows = self.f.node(f"{base}/rows", "Reshape",
                               [self._global_rows(tb.mult, dev), self._c1(base, 1, dev)], dev,
                               T=("type", "int32"), Tshape=("type", "int32"))
            shape = self.f.node(f"{base}/shape", "TensorScatterUpdate",
                                [shard_shape, self.f.const(f"{base}/axis", [[tb.axis]], "int32", dev), rows], dev,
                                T=("type", "int32"), Tindices=("type", "int32"))
            if src.type == "Size":
                shape = self.f.node(f"{base}/size", "Prod", [shape, self.f.const(f"{base}/dims", [0], "int32", dev)],
                                    dev, T=("type", "int32"), Tidx=("type", "int32"), keep_dims=("bool", False))
            if out_type != "int32":
                shape = self.f.cast(f"{base}/cast", shape, "int32", out_type, dev)
            outs.append(shape + ":0")
        return outs

    # -- helpers ----------------------------------------------------------------------------------
    def _memo_get(self, key: tuple, build):
        context = "recompute" if self._recompute_depth else ("training" if self._emitting_training else "other")
        value = self._memo.get(key)
        if value is None:
            self._origin[key] = context
            if self._building:
                self._nested.setdefault(self._building[-1], []).append(key)
            self._building.append(key)
            try:
                value = build()
            finally:
                self._building.pop()
            self._memo[key] = value
        elif context == "training":
            self._mark_training(key)
        return value

    def _mark_training(self, key: tuple) -> None:
        stack = [key]
        while stack:
            k = stack.pop()
            if self._origin.get(k) != "training":
                self._origin[k] = "training"
                stack.extend(self._nested.get(k, ()))

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
        out["allreduce"] = sum(any(self._origin.get(k) == "training" for k in b) for b in self._buckets)
        # A fused sum is one AddN for all its members.
        out["addn_tensors"] = out["addn"]
        out["addn"] -= sum(sum(self._origin.get(k) == "training" for k in b) - 1 for b in self._sum_buckets)
        return out

    def _dtype(self, ref: TensorRef) -> str:
        return self.graph.tensor(ref).base_dtype

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
