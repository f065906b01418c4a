"""The all-reduces and fused sums of the GraphBuilder: reserved while the ops are emitted, built last.

A partial sum that the consumers need whole is either all-reduced among its replicas or summed
(AddN) on one device. The conversions only reserve the names of the results (`_all_reduce`, and
`_add_n` for the training step's sums when fusion is on); once every op is emitted,
`_emit_collectives` packs the requests into buckets (tag_tf/placement/fusion.py: the strategy's
`fusion_bytes`, or one tensor per collective) and emits them in one global order. Each collective
waits (control edge) for the previous one on each of its devices, so every member issues them in
the same order and rings cannot deadlock. With `sync_after_backward` (DP-NCCL as the paper ran it)
the first collective of each sync level on a device also waits for every value of that level on
the device, so no all-reduce overlaps the backward pass.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tag_tf.compiler.base import BuilderBase
from tag_tf.compiler.nodes import set_attr
from tag_tf.ir import TensorRef
from tag_tf.placement.fusion import FusionFacts, Request, assign_buckets

# Micro-batch sums of these types are chained additions (`_accumulate`); others stay one AddN.
# Each addition carries the mark Grappler's arithmetic optimizer leaves on additions it has
# rewritten, so that it does not fold the chain back into one AddN (which its memory optimizer
# then turns into that temporary variable). TensorFlow 2.15's name for it; checked by
# tests/compiler/test_pipeline.py, which fails if a TensorFlow folds the chain anyway.
GRAPPLER_ADD_OPS_DONE = "_grappler_ArithmeticOptimizer_AddOpsRewriteStage"
CHAINED_SUM_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "int32", "int64", "complex64", "complex128"})


class CollectivesMixin(BuilderBase):
    def _init_collectives(self, fusion_bytes: int | None, instance_key_base: int, sync_after_backward: bool) -> None:
        self.fusion_bytes = fusion_bytes
        self.sync_after_backward = sync_after_backward
        self._barrier: dict[tuple[int, int], list[str]] = {}    # (level, device) -> ops to wait for
        self._group_keys: dict[tuple[int, ...], int] = {}
        # Servers remember each collective instance's shape across runs: graphs compiled for the
        # same servers must not reuse instance keys (see compile.instance_key_base).
        self._instance_key = instance_key_base
        self._last_collective: dict[tuple[frozenset[int], int], str] = {}   # (run set, device) -> last
        # All-reduces requested while emitting: (memo key, reserved output names per replica).
        self._pending: list[tuple[tuple, list[str]]] = []
        self._buckets: list[list[tuple]] = []        # memo keys per emitted collective
        self._pending_sums: list[tuple[tuple, list[str]]] = []   # AddN on one device, fused
        self._sum_buckets: list[list[tuple]] = []    # memo keys per fused AddN (2+ members)
        self._collectives_done = False
        self._flat_shapes: dict[str, str] = {}          # device -> Const [-1]

    # -- requests (while the ops are emitted) ----------------------------------------------------
    def _add_n(self, ref: TensorRef, device: int) -> str:
        """ref's replicas summed on `device`. With fusion, the training step's sums are deferred
        like all-reduces: they are packed per (replicas, device) into buckets by `_emit_collectives`."""
        if self.fusion_bytes and self._emitting_training and not self._recompute_depth and not self._collectives_done:
            name = self.f.unique(f"tag/sum/{ref.op}")
            self._pending_sums.append((("addn", ref, device), [name]))
            return name + ":0"
        pieces = self._summed_per_machine(ref, device, lambda d: self._device_sum(ref, d))
        return self.f.add_n(f"tag/sum/{ref.op}", pieces, self._dtype(ref), self.devices[device]) + ":0"

    def _summed_per_machine(self, ref: TensorRef, device: int, summed: Callable[[int], str]) -> list[str]:
        """ref's partial sums bound for `device`, `summed(d)` on each of its devices. Micro-batched
        (a pipelined plan): each other machine's devices add theirs up on the first of them, so one
        value leaves that machine (kernels/expand.h, the same rule)."""
        distinct = self.placement.of(ref.op).distinct
        if self.placement.of(ref.op).micro == 1:
            return [summed(d) for d in distinct]
        here = self.devices.machine(device)
        machines: dict[int, list[int]] = {}
        pieces: list[str] = []
        for d in distinct:
            machine = self.devices.machine(d)
            if machine == here:
                pieces.append(summed(d))
            else:
                machines.setdefault(machine, []).append(d)
        for devs in machines.values():
            parts = [summed(d) for d in devs]
            pieces.append(parts[0] if len(parts) == 1 else
                          self.f.add_n(f"tag/presum/{ref.op}", parts, self._dtype(ref), self.devices[devs[0]]) + ":0")
        return pieces

    def _summed_for(self, key: tuple, ref: TensorRef, device: int) -> str:
        """`_device_sum` for the reduction `key` (built once every op is emitted): the training step
        needs it where it needs that reduction."""
        self._emitting_training = self._origin.get(key, "other") == "training"
        try:
            return self._device_sum(ref, device)
        finally:
            self._emitting_training = False

    def _device_sum(self, ref: TensorRef, device: int) -> str:
        """ref's partial sums on `device` added up: its one replica there, or the sum of its
        micro-batches there (accumulated where they were computed: one value leaves the device)."""
        play = self.placement.of(ref.op)
        replicas = play.replicas_on(device)
        if len(replicas) == 1:
            return self.out(ref, replicas[0])
        return self._memo_get(("accumulate", ref, device), lambda: self._accumulate(ref, replicas, device))

    def _accumulate(self, ref: TensorRef, replicas: Sequence[int], device: int) -> str:
        """The micro-batches' values of ref summed on `device` as they arrive: a chain of additions
        in micro-batch order, each freeing its micro-batch's value (one running sum alive, added to
        in place). One AddN of them all would keep every micro-batch's value alive until the last,
        and Grappler turns it into a temporary variable zeroed every step: for a 51 MB gradient
        on a quarter-speed host that zeroing alone measured 0.56 s a step. Types without an addition
        kernel (variants) keep the AddN."""
        dtype, where = self._dtype(ref), self.devices[device]
        values = [self.out(ref, j) for j in replicas]
        if dtype not in CHAINED_SUM_DTYPES:
            return self.f.add_n(f"tag/accumulate/{ref.op}", values, dtype, where) + ":0"
        total = values[0]
        for value in values[1:]:
            total = self.f.node(f"tag/accumulate/{ref.op}", "AddV2", [total, value], where, T=("type", dtype)) + ":0"
            set_attr(self.f.nodes[-1], GRAPPLER_ADD_OPS_DONE, ("bool", True))
        return total

    def _all_reduce(self, ref: TensorRef) -> list[str]:
        """Per device of its layout (`Layout.distinct`), the name of ref's all-reduced value. Until every op is emitted this only
        reserves the names (the collective is built with its bucket by `_emit_collectives`)."""
        def reserve() -> list[str]:
            play = self.placement.of(ref.op)
            names = [self.f.unique(f"tag/allreduce/{ref.op}/r{k}") for k in range(len(play.distinct))]
            key = ("allreduce", ref)
            if self._collectives_done:       # a late request (none is known to occur): alone
                self._emit_bucket([(key, names)])
            else:
                self._pending.append((key, names))
            return [n + ":0" for n in names]
        return self._memo_get(("allreduce", ref), reserve)

    # -- emission (once every op is emitted) ---------------------------------------------------
    def _run_sets(self, refs: Sequence[TensorRef]) -> list[frozenset[int]]:
        """Per ref: which of the train op's roots need it. A program compiled for several training
        roots (a GAN's two optimizers, separate accumulate and apply runs: the front end groups them
        under one NoOp) runs one of them at a time: a bucket or a chain of collectives never mixes
        values of different root sets, or running one root would run (and feed) the others."""
        graph = self.a.graph
        train = graph.meta.train_op
        if not train or graph.op(train).type != "NoOp" or len(graph.op(train).control_inputs) < 2:
            return [frozenset()] * len(refs)
        needs = [graph.ancestors([root]) for root in graph.op(train).control_inputs]
        return [frozenset(i for i, ancestors in enumerate(needs) if ref.op in ancestors) for ref in refs]

    def _emit_collectives(self) -> None:
        facts = FusionFacts(self.a)
        requests = [facts.request(key[1], self.placement.of(key[1].op).distinct) for key, _ in self._pending]
        if self.sync_after_backward:
            self._barrier = self._barrier_control(requests)
        for run_set, indices in _by_run_set(self._run_sets([key[1] for key, _ in self._pending])):
            for members in assign_buckets([requests[i] for i in indices], self.fusion_bytes):
                chosen = [indices[i] for i in members]
                self._emit_bucket([self._pending[i] for i in chosen], requests[chosen[0]].level, run_set)
        sums = [facts.request(key[1], self.placement.of(key[1].op).distinct, key[2]) for key, _ in self._pending_sums]
        for _, indices in _by_run_set(self._run_sets([key[1] for key, _ in self._pending_sums])):
            for members in assign_buckets([sums[i] for i in indices], self.fusion_bytes):
                chosen = [indices[i] for i in members]
                self._emit_sum_bucket([self._pending_sums[i] for i in chosen], sums[chosen[0]].target)
        self._pending, self._pending_sums = [], []
        self._collectives_done = True

    def _barrier_control(self, requests: Sequence[Request]) -> dict[tuple[int, int], list[str]]:
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

    def _emit_bucket(self, members: list[tuple[tuple, list[str]]], level: int = 0,
                     run_set: frozenset[int] = frozenset()) -> None:
        """One collective per replica over the members' values; each member's reserved name ends
        up holding its own reduced value (for several members: flatten, concat, reduce, split,
        reshape). It waits for the previous collective of the same run set on each device."""
        self._buckets.append([key for key, _ in members])
        first: TensorRef = members[0][0][1]
        play = self.placement.of(first.op)
        devs = play.distinct
        dtype = self._dtype(first)
        use_nccl = all(self.devices.gpu[d] for d in devs) and len({self.devices.machine(d) for d in devs}) == 1
        group_key = self._group_keys.setdefault(tuple(sorted(devs)), len(self._group_keys) + 1)
        self._instance_key += 1
        fused = len(members) > 1
        for d in sorted(devs):
            device = self.devices[d]
            # Each member's instance on d (members may list the same devices in another order).
            at = [self.placement.of(key[1].op).distinct.index(d) for key, _ in members]
            values = [self._summed_for(key, key[1], d) for key, _ in members]
            if fused:
                base = f"tag/fused/b{self._instance_key}/d{d}"
                value, name = self._pack(base, values, dtype, device), self.f.unique(f"{base}/sum")
            else:
                value, name = values[0], members[0][1][at[0]]
            prev = self._last_collective.get((run_set, d))
            control = ([prev] if prev else []) + self._barrier.pop((level, d), [])
            if use_nccl:
                self.f.nccl_all_reduce(name, value, dtype, device, num_devices=len(devs), control=control,
                                       shared_name=f"tag_ar_{self._instance_key}", unique=False)
            else:
                self.f.collective_reduce(name, value, dtype, device, group_size=len(devs), group_key=group_key,
                                         instance_key=self._instance_key, control=control, unique=False)
            self._last_collective[(run_set, d)] = name
            if fused:
                self._unpack([(key[1], names[j]) for (key, names), j in zip(members, at)], name + ":0",
                             dtype, device)

    def _emit_sum_bucket(self, members: list[tuple[tuple, list[str]]], target: int) -> None:
        """Members' replicas summed on `target`: each replica packs its pieces into one tensor (one
        transfer per bucket instead of one per gradient), the packs are added and split back."""
        refs = [key[1] for key, _ in members]
        dtype = self._dtype(refs[0])
        device = self.devices[target]
        if len(members) == 1:
            key = members[0][0]
            pieces = self._summed_per_machine(refs[0], target, lambda d: self._summed_for(key, refs[0], d))
            self.f.add_n(members[0][1][0], pieces, dtype, device, unique=False)
            return
        self._sum_buckets.append([key for key, _ in members])
        base = f"tag/fused_sum/{len(self._sum_buckets)}"
        packs = []
        for d in sorted(self.placement.of(refs[0].op).distinct):
            values = [self._summed_for(key, key[1], d) for key, _ in members]
            packs.append(self._pack(f"{base}/d{d}", values, dtype, self.devices[d]))
        total = self.f.add_n(f"{base}/sum", packs, dtype, device)
        self._unpack(list(zip(refs, (names[0] for _, names in members))), total + ":0", dtype, device)

    # -- a bucket as one flat tensor, and back -------------------------------------------------
    def _pack(self, base: str, values: list[str], dtype: str, device: str) -> str:
        """One flat tensor holding `values` (all on `device`) back to back."""
        flat_shape = self._flat_shapes.get(device) or self._flat_shapes.setdefault(
            device, self.f.const("tag/flat_shape", [-1], "int32", device))
        flat = [self.f.node(f"{base}/flat", "Reshape", [v, flat_shape], device,
                            T=("type", dtype), Tshape=("type", "int32")) for v in values]
        return self.f.concat(f"{base}/pack", flat, 0, dtype, device) + ":0"

    def _unpack(self, members: list[tuple[TensorRef, str]], packed: str, dtype: str, device: str) -> None:
        """Split a reduced bucket back into its members, each under the name reserved for it."""
        shapes = []
        for ref, _ in members:
            static = self.graph.tensor(ref).shape
            assert static is not None, ref    # only fusable (statically shaped) tensors share a bucket
            shapes.append(list(static))
        sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        base = packed.split(":")[0]
        parts = self.f.split_v(f"{base}/unpack", packed, self.f.const(f"{base}/sizes", sizes, "int32", device),
                               0, len(members), dtype, device)
        for i, ((_, name), shape) in enumerate(zip(members, shapes)):
            self.f.node(name, "Reshape", [f"{parts}:{i}", self.f.const(f"{base}/shape", shape, "int32", device)],
                        device, unique=False, T=("type", dtype), Tshape=("type", "int32"))


def _by_run_set(run_sets: Sequence[frozenset[int]]) -> list[tuple[frozenset[int], list[int]]]:
    """Indices grouped by run set, groups in the order of their first member."""
    groups: dict[frozenset[int], list[int]] = {}
    for i, run_set in enumerate(run_sets):
        groups.setdefault(run_set, []).append(i)
    return list(groups.items())
