"""Where each op runs under a strategy: its Layout.

- SINGLE(d): one instance on device d (whole batch).
- REPLICATED(R, counts): instance j on R[j] takes counts[j] samples; outputs follow the op's
  annotation (split / partial / full / local).
- DUPLICATED(R): a full copy on every device of R (whole batch each): a Duplicate group, and the
  ops sufficient factor broadcasting duplicates inside a replicated group (`Strategy.sfb`).

Pipelined plans (`Strategy.microbatches` M > 1): a group's ops run as M micro-batches, a REPLICATED
layout whose replica m * k + i is micro-batch m's part on the group's i-th device (k devices): R
lists each device M times, in micro-batch order, so the replicas' rows in order are the batch's.
What keeps state -- variables (slots included) and the ops writing them (`keeps_state`) -- stays
once per device (the group's layout without micro-batches); reads and gathers run per micro-batch.
The micro-batches' gradients are summed on each device before the group's synchronisation.

Ops outside training (initialisers, save/restore, summaries) follow the variable they touch: writers
run once per variable copy (so every copy is initialised and restored), everything else once.
Random initialisers therefore run once and every copy receives the same initial value.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.analysis.grouping import UnionFind, colocation_pairs, group_ops
from tag_tf.analysis.simplify import PlanningGraph, training_ops
from tag_tf.analysis.states import Flag, Kind
from tag_tf.errors import StrategyError
from tag_tf.ir import Graph, TensorRef, opsets
from tag_tf.strategy import GroupPlan, Option, SfbCut, Strategy, split_counts

HOST = -1   # the chief's host device (CPU of task 0): non-training ops without a better place


class Mode(enum.Enum):
    SINGLE = "single"
    REPLICATED = "replicated"
    DUPLICATED = "duplicated"


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    mode: Mode
    devices: tuple[int, ...]
    counts: tuple[int, ...] = ()          # REPLICATED: samples per replica (sum = batch size)
    weights: tuple[float, ...] = ()       # REPLICATED: share weights (dynamic batch: split at run time)
    option: Option = Option.ALLREDUCE     # how partial sums of this layout are synchronised
    micro: int = 1                        # micro-batches (REPLICATED: each device listed this many times)

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def distinct(self) -> tuple[int, ...]:
        """The devices, each once, in the order of their first replica."""
        return self.devices if self.micro == 1 else tuple(dict.fromkeys(self.devices))

    def replicas_on(self, device: int) -> tuple[int, ...]:
        """The replicas on `device` (several for a micro-batched layout)."""
        return tuple(j for j, d in enumerate(self.devices) if d == device)

    def lines_up(self, other: Layout) -> bool:
        """Two replicated layouts, one of them micro-batched, whose replicas hold the same rows in
        the same order (devices may differ): a pipeline stage hands micro-batch m's piece straight
        to the next stage's replica m instead of gathering the batch and splitting it again."""
        return (self.mode is Mode.REPLICATED and other.mode is Mode.REPLICATED and max(self.micro, other.micro) > 1
                and self.size == other.size and self.counts == other.counts and self.weights == other.weights)

    def same_split(self, other: Layout) -> bool:
        """Two replicated layouts whose shards line up exactly."""
        return (self.mode is Mode.REPLICATED and other.mode is Mode.REPLICATED
                and self.devices == other.devices and self.counts == other.counts
                and self.weights == other.weights)

    def __str__(self) -> str:
        if self.mode is Mode.SINGLE:
            return f"single({self.devices[0]})"
        if self.mode is Mode.DUPLICATED:
            return f"dup{list(self.devices)}"
        return f"rep{list(self.devices)}:{list(self.counts)}"


def single(device: int) -> Layout:
    return Layout(Mode.SINGLE, (device,))


@dataclasses.dataclass(frozen=True)
class Placement:
    layouts: Mapping[str, Layout]        # every op of the graph
    batch_size: int
    dynamic: bool

    def of(self, op: str) -> Layout:
        return self.layouts[op]


class ColocationSets:
    """Union-find over all ops of the graph by TF's colocation constraints."""

    def __init__(self, analysis: Analysis):
        graph = analysis.graph
        self.names = list(graph.order)
        self.index = {n: i for i, n in enumerate(self.names)}
        uf = UnionFind(len(self.names))
        for a, b in colocation_pairs(graph, self.names):
            uf.union(self.index[a], self.index[b])
        self._root = [uf.find(i) for i in range(len(self.names))]
        self.variable_roots = frozenset(self.root(v) for v in graph.variables)

    def root(self, op: str) -> int:
        return self._root[self.index[op]]

    def with_variable(self, op: str) -> bool:
        """Colocated with a variable (its reads, updates, slots): in a PS group these live on the PS."""
        return self.root(op) in self.variable_roots


def mp_partition(analysis: Analysis, group: int, parts: int, seed: int = 0) -> dict[str, int]:
    """Model parallelism inside one group: METIS over the group's planned ops -> part per op."""
    planning = analysis.planning
    ops = analysis.grouping.groups[group].ops
    if parts <= 1 or len(ops) <= 1:
        return {op: 0 for op in ops}
    index = {n: i for i, n in enumerate(planning.ops)}
    keep = np.array([index[o] for o in ops])
    pos = np.full(len(planning.ops), -1, dtype=np.int64)
    pos[keep] = np.arange(len(keep))
    pairs = np.asarray(planning.edges, dtype=np.int64).reshape(-1, 2)
    mask = (pos[pairs[:, 0]] >= 0) & (pos[pairs[:, 1]] >= 0)
    edges = pos[pairs[mask]].astype(np.int32).reshape(-1, 2)
    members = set(ops)
    host = {m: h for m, h in planning.host.items() if h in members}
    sub = PlanningGraph(tuple(ops), host, edges, planning.edge_bytes[mask], {})
    grouping = group_ops(analysis.graph_b1, sub, analysis.weights[keep], num_groups=parts,
                         balance_factor=1.5, seed=seed)
    return {op: grouping.group_of[op] % parts for op in ops}


def validated_duplicates(analysis: Analysis, strategy: Strategy, coloc: ColocationSets | None = None,
                         members: Mapping[str, list[str]] | None = None) -> frozenset[str]:
    """The planned ops `strategy.sfb` duplicates, checked against `analysis` (the analysis of the
    strategy's groups): each must be a planned op of a group replicated with AllReduce or PS, and
    none of the ops it hosts may be fed once (an input) or colocated with a variable (PS groups
    keep those on their server; the simulator duplicates planned ops whole, so a member that stayed
    behind would make the two disagree)."""
    dup = strategy.duplicated_ops
    if not dup:
        return dup
    coloc = coloc or ColocationSets(analysis)
    planned = set(analysis.planning.ops)
    members = members if members is not None else analysis.planning.members()
    for cut in strategy.sfb:
        for op in cut.ops:
            where = f"sfb for {cut.gradient}: op {op!r}"
            if op not in planned:
                raise StrategyError(f"{where} is not a planned op of this graph")
            gid = analysis.grouping.group_of[op]
            plan = strategy.groups[gid]
            if len(plan.devices) < 2 or plan.option not in (Option.ALLREDUCE, Option.PS):
                raise StrategyError(f"{where}: its group {gid} runs {plan.option.value} on {len(plan.devices)} "
                                    "device(s); only ops of a group replicated with allreduce or ps can be "
                                    "duplicated")
        synced = _allreduced(analysis, strategy, cut, dup, members)
        for op in cut.ops:
            where = f"sfb for {cut.gradient}: op {op!r}"
            plan = strategy.groups[analysis.grouping.group_of[op]]
            for m in members[op]:
                what = where if m == op else f"{where} hosts {m!r}, which"
                if Flag.SOURCE in analysis.annotations[m].flags:
                    raise StrategyError(f"{what} is an input of the step (fed once); it cannot be duplicated")
                if coloc.with_variable(m):
                    raise StrategyError(f"{what} is colocated with a variable; it cannot be duplicated")
                for ref in analysis.graph.op(m).inputs:
                    if ref in synced or not _replicated_partial(analysis, strategy, ref, dup):
                        continue
                    hint = (" (or name it in the cut's 'allreduced': it is all-reduced on its own)"
                            if _same_allreduce_layout(analysis, strategy, ref, plan) else "")
                    raise StrategyError(f"{what} reads the partial sum {ref.name}: it would be synchronised "
                                        f"mid-way through the backward pass; duplicate its producer too{hint}")
    return dup


def _allreduced(analysis: Analysis, strategy: Strategy, cut: SfbCut, dup: frozenset[str],
                members: Mapping[str, list[str]]) -> frozenset[TensorRef]:
    """The partial sums `cut` all-reduces on its own (SfbCut.allreduced), each checked: read by its
    duplicated ops, a partial sum of an op that stays replicated, in an allreduce group on the
    devices of the op that reads it (one all-reduce over those devices makes it whole there)."""
    out: set[TensorRef] = set()
    for name in cut.allreduced:
        where = f"sfb for {cut.gradient}: 'allreduced' names {name!r}"
        try:
            ref = TensorRef.parse(name)
        except ValueError:
            raise StrategyError(f"{where}, which is not a tensor name") from None
        readers = [op for op in cut.ops for m in members[op] if ref in analysis.graph.op(m).inputs]
        if not readers:
            raise StrategyError(f"{where}, which none of the cut's duplicated ops reads")
        if analysis.planning.host.get(ref.op) in dup:
            raise StrategyError(f"{where}, whose producer the plan duplicates too: it is whole on every device "
                                "already")
        if not _replicated_partial(analysis, strategy, ref, dup):
            raise StrategyError(f"{where}, which is not a partial sum of an op replicated on 2+ devices")
        if not all(_same_allreduce_layout(analysis, strategy, ref, strategy.groups[analysis.grouping.group_of[op]])
                   for op in readers):
            raise StrategyError(f"{where}: only a partial sum of a group replicated with allreduce on the devices "
                                "of the ops reading it is all-reduced on its own")
        out.add(ref)
    return frozenset(out)


def _same_allreduce_layout(analysis: Analysis, strategy: Strategy, ref: TensorRef, plan: GroupPlan) -> bool:
    """`ref`'s producer and an op of `plan` share one allreduce layout (the devices, in order)."""
    producer = strategy.groups[analysis.grouping.group_of[ref.op]]
    return producer.option is Option.ALLREDUCE and plan.option is Option.ALLREDUCE and producer.devices == plan.devices


def _replicated_partial(analysis: Analysis, strategy: Strategy, ref: TensorRef, dup: frozenset[str]) -> bool:
    """`ref` is a per-replica partial sum of an op that stays replicated."""
    host = analysis.planning.host.get(ref.op)
    if host is None or host in dup:
        return False
    outs = analysis.annotations[ref.op].outputs
    if ref.index >= len(outs) or outs[ref.index].kind is not Kind.PARTIAL:
        return False
    plan = strategy.groups[analysis.grouping.group_of[ref.op]]
    return (len(plan.devices) > 1 and plan.option in (Option.ALLREDUCE, Option.PS)
            and Flag.SOURCE not in analysis.annotations[ref.op].flags)


def resolve(analysis: Analysis, strategy: Strategy, num_devices: int) -> Placement:
    """The layout of every op of `analysis.graph` under `strategy`."""
    graph = analysis.graph
    analysis.check_groups(strategy)
    strategy.validate(len(analysis.grouping.groups), num_devices)
    batch = analysis.batch_size
    dynamic = analysis.dynamic_batch
    train = training_ops(graph)
    coloc = ColocationSets(analysis)
    group_of = analysis.grouping.group_of
    dup = validated_duplicates(analysis, strategy, coloc)
    planned_host = analysis.planning.host

    # Per-group base layouts and, for PS groups, a parameter server per colocation set (round-robin).
    # Pipelined: the micro-batched layout of each group's ops; what keeps state stays on `base`.
    micro = strategy.microbatches
    group_layout: list[Layout] = []
    group_micro: list[Layout] = []
    for plan in strategy.groups:
        group_layout.append(_group_layout(plan, strategy, batch, dynamic))
        group_micro.append(_micro_layout(group_layout[-1], micro, batch, dynamic))
    ps_device: dict[int, int] = {}
    next_ps: dict[int, int] = {}
    mp_parts: dict[int, dict[str, int]] = {}

    layouts: dict[str, Layout] = {}
    for name in graph.order:
        if name not in train:
            continue
        gid = group_of[name]
        plan = strategy.groups[gid]
        base = group_layout[gid]
        ann = analysis.annotations[name]
        if Flag.SOURCE in ann.flags:
            layouts[name] = single(plan.devices[0])     # fed once; replicated consumers split it
            continue
        if plan.option is Option.MODEL_PARALLEL and len(plan.devices) > 1:
            if gid not in mp_parts:
                mp_parts[gid] = mp_partition(analysis, gid, len(plan.devices))
            host = analysis.planning.host[name]
            part = single(plan.devices[mp_parts[gid][host]])
            layouts[name] = part if keeps_state(graph, name) else _micro_layout(part, micro, batch, dynamic)
            continue
        if plan.option is Option.PS and base.mode is Mode.REPLICATED and coloc.with_variable(name):
            root = coloc.root(name)
            if root not in ps_device:
                k = next_ps.get(gid, 0)
                ps_device[root] = plan.devices[k % len(plan.devices)]
                next_ps[gid] = k + 1
            layouts[name] = single(ps_device[root])
            continue
        if base.mode is Mode.REPLICATED and planned_host.get(name) in dup:    # SFB: the whole batch everywhere
            layouts[name] = Layout(Mode.DUPLICATED, base.devices, option=base.option)
            continue
        layouts[name] = base if keeps_state(graph, name) else group_micro[gid]

    # Non-training ops follow what they are colocated with.
    anchor: dict[int, str] = {}
    for name in graph.order:
        if name in layouts:
            anchor.setdefault(coloc.root(name), name)
    for name in graph.order:
        if name in layouts:
            continue
        a = anchor.get(coloc.root(name))
        if a is None:
            layouts[name] = single(HOST)
            continue
        lay = layouts[a]
        if lay.mode is Mode.SINGLE:
            layouts[name] = lay
        elif opsets.is_variable_writer(graph.op(name).type) or graph.op(name).type in opsets.TABLE_WRITERS:
            layouts[name] = Layout(Mode.DUPLICATED, lay.distinct)  # write every copy (of a variable or table)
        else:
            layouts[name] = single(lay.devices[0])
    return Placement(layouts, batch, dynamic)


def _group_layout(plan: GroupPlan, strategy: Strategy, batch: int, dynamic: bool) -> Layout:
    if len(plan.devices) == 1 or plan.option is Option.MODEL_PARALLEL:
        return single(plan.devices[0])
    if plan.option is Option.DUPLICATE:
        return Layout(Mode.DUPLICATED, plan.devices)
    weights = strategy.share_weights(plan.devices)
    counts = () if dynamic else split_counts(batch, weights)
    return Layout(Mode.REPLICATED, plan.devices, counts, weights if dynamic else (), plan.option)


def keeps_state(graph: Graph, op: str) -> bool:
    """A variable or an op writing one (or a table): in a micro-batched group it runs once per
    device, not once per micro-batch."""
    kind = graph.op(op).type
    return kind in opsets.VARIABLE_OPS or opsets.is_variable_writer(kind) or kind in opsets.TABLE_WRITERS


def _micro_layout(base: Layout, micro: int, batch: int, dynamic: bool) -> Layout:
    """`base` (a group's layout, or one device's) run as `micro` micro-batches: each micro-batch
    split over base's devices as base splits the batch. Layouts that keep the whole batch on every
    device (duplicated) are not micro-batched."""
    if micro == 1 or base.mode is Mode.DUPLICATED:
        return base
    k = base.size
    if dynamic:
        counts: tuple[int, ...] = ()
        weights = tuple(w for _ in range(micro) for w in (base.weights or (1.0,) * k))
    else:
        share = (1.0,) * k if base.mode is Mode.SINGLE else tuple(c / batch for c in base.counts)
        try:
            counts = tuple(c for part in split_counts(batch, (1.0,) * micro) for c in split_counts(part, share))
        except StrategyError:
            raise StrategyError(f"batch size {batch} is too small for {micro} micro-batches over {k} device(s) "
                                f"({micro * k} parts of at least one sample)") from None
        weights = ()
    return Layout(Mode.REPLICATED, base.devices * micro, counts, weights, base.option, micro)


__all__ = ["HOST", "keeps_state", "Layout", "Mode", "Placement", "resolve", "validated_duplicates", "single", "mp_partition"]

