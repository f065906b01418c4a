"""Gradient fusion: which all-reduced tensors share one collective, and in which order.

Horovod's Tensor Fusion and PyTorch DDP's buckets pack many small gradients into one buffer so that
a model with hundreds of variables pays a collective's fixed latency a few times, not hundreds. We
decide buckets statically, once the compiler knows every tensor it reduces — all-reduced among the
replicas, or summed on one device (a parameter server: each replica then sends one packed tensor
per bucket instead of one per gradient):

- members share a device set, a target (all the replicas, or the device that sums), a dtype and a
  *sync level* (below), and have a static shape;
- they are taken in production order (the backward pass's topological order), so the first bucket
  closes early and its collective overlaps the rest of the backward pass;
- a bucket closes before it would exceed the strategy's `fusion_bytes` (one tensor larger than the
  cap forms a bucket alone);
- collectives are issued in (level, last member) order on every device: the global order that keeps
  rings from deadlocking.

Sync level: the number of possible reductions of partial sums on any path into a tensor's producer
(`sync_levels`). A tensor can only depend on the reduction of a tensor of a lower level, so a bucket (one level) never waits for
its own result, and ordering by level never makes a collective wait for a later one.

The simulator's native expander (kernels/expand.h, `emit_collectives`) applies the same rule to the
facts sim/prepare.py gives it (`FusionFacts`); tests/sim/test_simulator.py checks both insert the same
collectives.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tag_tf.analysis import Analysis
from tag_tf.analysis.states import Kind
from tag_tf.ir import TensorRef
from tag_tf.placement.layout import ColocationSets

HOROVOD_FUSION_BYTES = 64 * 2**20   # Horovod's default fusion buffer (HOROVOD_FUSION_THRESHOLD)
ALL_REPLICAS = -2                    # Request.target of an all-reduce (>= 0: the device that sums)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One tensor to reduce over `devices`: all-reduce, or sum on device `target`."""

    devices: tuple[int, ...]       # sorted
    dtype: str
    level: int
    rank: tuple[int, int, int]     # production order: (planned op, op in graph order, output)
    nbytes: int
    fusable: bool                  # static shape: it can be flattened into a bucket and back
    target: int = ALL_REPLICAS


class FusionFacts:
    """Per-tensor facts the bucket rule needs, computed once per analysis."""

    def __init__(self, analysis: Analysis):
        graph = analysis.graph
        self._order = {name: i for i, name in enumerate(graph.order)}
        planned = {name: i for i, name in enumerate(analysis.planning.ops)}
        unplanned = len(planned)
        self._host = {m: planned[h] for m, h in analysis.planning.host.items()}
        self._unplanned = unplanned
        self._levels = sync_levels(analysis)
        self._graph = graph
        self._batch = analysis.batch

    def level(self, ref: TensorRef) -> int:
        return self._levels[ref.op]

    def rank(self, ref: TensorRef) -> tuple[int, int, int]:
        return (self._host.get(ref.op, self._unplanned), self._order[ref.op], ref.index)

    def nbytes(self, ref: TensorRef) -> int:
        return self._graph.tensor(ref).nbytes or 0

    def fusable(self, ref: TensorRef) -> bool:
        info = self._graph.tensor(ref)
        return (info.shape is not None and all(d >= 0 for d in info.shape) and (info.nbytes or 0) > 0
                and not self._batch.of(ref).batched)

    def request(self, ref: TensorRef, devices: Sequence[int], target: int = ALL_REPLICAS) -> Request:
        return Request(tuple(sorted(devices)), self._graph.tensor(ref).base_dtype, self.level(ref),
                       self.rank(ref), self.nbytes(ref), self.fusable(ref), target)


def sync_levels(analysis: Analysis) -> Mapping[str, int]:
    """Per op: the most reductions of partial sums on a path into it, control dependencies
    included. Strategy-independent and conservative: a read of a partial sum counts unless it
    stays partial inside one op group away from the variables (the only case no strategy reduces:
    the consumer then shares the producer's replicas)."""
    graph = analysis.graph
    ann = analysis.annotations
    group_of = analysis.grouping.group_of
    coloc = ColocationSets(analysis)
    level: dict[str, int] = {}
    for name in graph.order:
        op = graph.op(name)
        requires = ann[name].requires
        group = group_of.get(name)
        on_server = coloc.with_variable(name)     # a PS group places it on the parameter server
        best = 0
        for i, ref in enumerate(op.inputs):
            outs = ann[ref.op].outputs
            partial = ref.index < len(outs) and outs[ref.index].kind is Kind.PARTIAL
            stays = (i < len(requires) and requires[i].kind is Kind.PARTIAL and group is not None
                     and group_of.get(ref.op) == group and not on_server)
            best = max(best, level.get(ref.op, 0) + (1 if partial and not stays else 0))   # 0: a back edge
        for c in op.control_inputs:
            best = max(best, level.get(c, 0))
        level[name] = best
    return level


def assign_buckets(requests: Sequence[Request], fusion_bytes: int | None) -> list[list[int]]:
    """Indices of `requests` per bucket, buckets in the order their collectives are issued."""
    cap = fusion_bytes or 0
    order = sorted(range(len(requests)), key=lambda i: (requests[i].level, requests[i].rank))
    buckets: list[list[int]] = []
    open_: dict[tuple, tuple[list[int], int]] = {}     # key -> (members, bytes)
    for i in order:
        r = requests[i]
        if cap <= 0 or not r.fusable:
            buckets.append([i])
            continue
        key = (r.devices, r.target, r.dtype, r.level)
        members, size = open_.get(key, ([], 0))
        if members and size + r.nbytes > cap:
            buckets.append(members)
            members, size = [], 0
        members.append(i)
        open_[key] = (members, size + r.nbytes)
    buckets.extend(members for members, _ in open_.values())
    last = {id(b): (requests[b[-1]].level, requests[b[-1]].rank) for b in buckets}
    buckets.sort(key=lambda b: last[id(b)])
    return buckets


__all__ = ["ALL_REPLICAS", "HOROVOD_FUSION_BYTES", "FusionFacts", "Request", "assign_buckets", "sync_levels"]
