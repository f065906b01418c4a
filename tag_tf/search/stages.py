"""Pipeline stages: ops cut into consecutive stages of the forward pass, each on its devices.

A pipelined plan (`Strategy.microbatches` > 1) puts consecutive ops on each stage's devices;
the compiler runs every group's part of the batch as micro-batches, so while stage s works on
micro-batch m, stage s - 1 already works on m + 1 (placement/layout.py, compiler/builder.py).

A pipelined plan brings its own op groups, its stages (`op_stages`): the forward pass is cut in
topological order where the running sum of its ops' weights (the analysis's op weights, or the
simulator's op times) crosses each stage's end -- stage s takes `fractions[s]` of the work (by
default equal parts; give a slower stage a smaller fraction) -- and every gradient and update goes
with the stage of the layer it belongs to.

`pipeline_search` makes the "pipeline" baseline every search has to beat (`best_pipeline`,
`MctsOptions.pipeline`) and, in the MCTS polish, tries the best plan found with micro-batches (a
plan whose groups sit on different devices is a pipeline already). The baseline: stages over the
cluster's machines -- consecutive machines, in the
topology's order and fastest first, cut into 2..MAX_STAGES blocks of about equal capacity, each
stage data-parallel over its block with capacity shares and taking work in proportion to its
capacity -- at each micro-batch count, and moves the stage cuts of the best of them. It keeps a
pipelined plan only where it simulates faster than what it was given.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.deadline import Deadline
from tag_tf.errors import DeadlineExceeded, StrategyError
from tag_tf.placement.fusion import HOROVOD_FUSION_BYTES
from tag_tf.search.baselines import device_capacities
from tag_tf.search.moves import Evaluator
from tag_tf.strategy import GroupPlan, Option, Strategy
from tag_tf.topology.spec import Topology

if TYPE_CHECKING:
    from tag_tf.sim.simulator import Simulator

log = logging.getLogger("tag_tf.search")

PIPELINE = "pipeline"            # the baseline's name (search/registry.py)
PIPELINE_SHARE = 0.1             # of a search's budget for the pipeline baseline ...
PIPELINE_MAX_S = 4.0             # ... at most
MICROBATCHES = (2, 4, 8, 16)     # micro-batch counts the search tries
MAX_STAGES = 8                   # stages over machines, at most
ORDERED_BELOW = 250e6 / 8         # bytes/s: links slower than this carry a pipeline's micro-batches in order
CUT_STEPS = (0.8, 1.25)          # a stage's share of the work scaled by these when its cuts move
CUT_ROUNDS = 2
CUT_WINDOW = 0.25                # a stage cut moves by up to this share of its larger stage's work
CUT_WINDOW_MIN = 0.05            # (at least this share of all the work: about a layer of a deep model) ...
CUT_SLACK = 0.05                 # ... to the nearest place within 5% of the fewest bytes crossing
CUT_KEEP = 1 / 3                 # and by at most this share of its smaller stage's work: a small
                                 # stage keeps a third of its share from each side


def planned_op_weights(sim: Simulator, device_type: str | int) -> np.ndarray:
    """Each planned op's simulated compute time on `device_type` (a type name, or the index of a
    type in the simulator's per-type arrays) at the whole batch: the simulator's calibrated op costs
    (`Simulator.op_per_sample_s` and the fixed seconds per run), planning order."""
    p = sim.prepared
    n = p.num_ops
    t = list(p.device_types).index(device_type) if isinstance(device_type, str) else int(device_type)
    fixed = np.asarray(p.op_fixed, dtype=np.float64).reshape(-1, n)[t]
    per_sample = np.asarray(p.op_per_sample, dtype=np.float64).reshape(-1, n)[t]
    return fixed + per_sample * sim.batch_size


def stage_capacities(sim: Simulator, topology: Topology) -> list[float]:
    """Each device's speed as the simulator costs it (samples per second of the whole graph,
    calibrated: `Simulator.device_rates`); the datasheet capacities where the simulator has none."""
    rates = [float(r) for r in sim.device_rates()]
    if len(rates) == topology.num_devices and all(r > 0 for r in rates):
        return rates
    return device_capacities(topology)


def op_stages(analysis: Analysis, fractions: Sequence[float], weights: np.ndarray | None = None) -> np.ndarray:
    """The stage of each planned op (planning order) for stages taking `fractions` of the work.

    The forward pass (the loss's ancestors) is cut in topological order where its cumulative
    weight (`weights` per planned op; default the analysis's) crosses each stage's end; an input
    of the forward pass (a variable, a placeholder) joins its first consumer's stage. Every other
    op (gradients, updates) goes with the latest stage of the forward values it reads -- a weight's
    gradient with its layer -- or, reading none, with the stage of its largest input (the earliest
    of those as large: the backward pass flows towards stage 0). The cuts move to where few
    activation bytes cross (`_cuts`). Ops TF must colocate share the earliest of their stages."""
    count = len(fractions)
    if not count or any(not f > 0 for f in fractions):
        raise StrategyError(f"stage fractions must be positive, got {list(fractions)}")
    index, preds, succs = _planned_edges(analysis)
    forward = _forward_pass(analysis, index, preds)
    n = len(index)
    computing = [i for i in range(n) if forward[i] and any(forward[p] for p in preds[i])]
    if len(computing) < count:
        raise StrategyError(f"{count} stages but the forward pass has only {len(computing)} ops to cut")
    w = np.asarray(analysis.weights if weights is None else weights, dtype=float)[computing]
    stage = np.full(n, -1, dtype=np.int64)
    cuts = _cuts(np.maximum(w, 1e-12), fractions, _crossing_bytes(analysis, computing, forward))
    for s in range(count):
        stage[computing[cuts[s]:cuts[s + 1]]] = s
    _spread(stage, forward, preds, succs, _edge_bytes(analysis))
    return _colocated_earliest(analysis, stage, index, count)


def _planned_edges(analysis: Analysis) -> tuple[dict[str, int], list[list[int]], list[list[int]]]:
    """Planned ops' indices by name, and each one's producers and consumers."""
    planning = analysis.planning
    index = {name: i for i, name in enumerate(planning.ops)}
    preds: list[list[int]] = [[] for _ in index]
    succs: list[list[int]] = [[] for _ in index]
    for a, b in np.asarray(planning.edges, dtype=np.int64).reshape(-1, 2):
        preds[int(b)].append(int(a))
        succs[int(a)].append(int(b))
    return index, preds, succs


def _forward_pass(analysis: Analysis, index: dict[str, int], preds: list[list[int]]) -> np.ndarray:
    """Which planned ops the loss depends on."""
    from tag_tf.ir import TensorRef

    loss = analysis.graph.meta.loss
    if not loss:
        raise StrategyError("pipeline stages need the training loss (the forward pass's end)")
    forward = np.zeros(len(index), dtype=bool)
    stack = [index[analysis.planning.host[TensorRef.parse(loss).op]]]
    while stack:
        i = stack.pop()
        if not forward[i]:
            forward[i] = True
            stack.extend(preds[i])
    return forward


def _crossing_bytes(analysis: Analysis, computing: Sequence[int], forward: np.ndarray) -> np.ndarray:
    """Per cut position k over the forward ops `computing` (ops [:k] before the cut, [k:] after):
    the bytes of forward activations that cross it, each producer's largest tensor into the later
    part counted once (what one micro-batch hands to the next stage, at the whole batch)."""
    position = {op: k for k, op in enumerate(computing)}
    largest: dict[int, int] = {}
    last: dict[int, int] = {}
    planning = analysis.planning
    for (a, b), size in zip(np.asarray(planning.edges, dtype=np.int64).reshape(-1, 2),
                            np.asarray(planning.edge_bytes, dtype=np.int64), strict=True):
        i, j = position.get(int(a)), position.get(int(b))
        if i is None or j is None or j <= i or not forward[int(b)]:
            continue
        largest[i] = max(largest.get(i, 0), int(size))
        last[i] = max(last.get(i, 0), j)
    diff = np.zeros(len(computing) + 2, dtype=np.float64)
    for i, size in largest.items():          # producer i crosses every cut in (i, last consumer]
        diff[i + 1] += size
        diff[last[i] + 1] -= size
    return np.cumsum(diff)[:len(computing) + 1]


def _cuts(w: np.ndarray, fractions: Sequence[float], crossing: np.ndarray | None = None) -> list[int]:
    """Where the forward ops (weights `w`, in order) are cut so that stage s takes fractions[s] of
    the weight; every stage gets at least one op. With `crossing` (bytes per cut position), each
    cut moves, within CUT_WINDOW of the larger neighbouring stage's share of the work, to where
    the fewest activation bytes cross (a layer's end rather than inside its wide feed-forward), but
    by no more than CUT_KEEP of the smaller neighbour's share (CUT_WINDOW_MIN does not empty a
    small stage beside a large one)."""
    count = len(fractions)
    total = float(sum(fractions))
    middle = (np.cumsum(w) - 0.5 * w) / w.sum()
    ends = np.cumsum(np.asarray(fractions, dtype=float))[:-1] / total
    cuts = [0]
    for s, end in enumerate(ends, start=1):
        cut = int(np.searchsorted(middle, end, side="right"))
        if crossing is not None:
            span = min(max(CUT_WINDOW * max(fractions[s - 1], fractions[s]) / total, CUT_WINDOW_MIN),
                       CUT_KEEP * min(fractions[s - 1], fractions[s]) / total)
            lo = int(np.searchsorted(middle, end - span, side="right"))
            hi = int(np.searchsorted(middle, end + span, side="right"))
            lo, hi = max(lo, cuts[-1] + 1), min(hi, len(w) - (count - s))
            if lo <= hi:
                window = np.arange(lo, hi + 1)
                least = crossing[window].min()
                near = window[crossing[window] <= least * (1 + CUT_SLACK)]
                cut = int(near[np.argmin(np.abs(near - cut))])
        cuts.append(min(max(cut, cuts[-1] + 1), len(w) - (count - s)))
    cuts.append(len(w))
    return cuts


def _edge_bytes(analysis: Analysis) -> dict[tuple[int, int], int]:
    planning = analysis.planning
    return {(int(a), int(b)): int(size) for (a, b), size in
            zip(np.asarray(planning.edges, dtype=np.int64).reshape(-1, 2),
                np.asarray(planning.edge_bytes, dtype=np.int64), strict=True)}


def _spread(stage: np.ndarray, forward: np.ndarray, preds: list[list[int]], succs: list[list[int]],
            edge_bytes: dict[tuple[int, int], int]) -> None:
    """Stages for the ops the cut left out (in place): forward inputs take their first consumer's;
    the rest, in topological order, the latest forward stage they read, else the stage of their
    largest input (the earliest of those as large: a sum of gradients stays where its gradients
    are, not where a shape it also reads was computed, which sent a layer norm's backward pass
    back and forth between two machines); ops with no inputs at all go with their consumers."""
    n = len(stage)
    for i in reversed(range(n)):
        if forward[i] and stage[i] < 0:
            later = [stage[c] for c in succs[i] if forward[c] and stage[c] >= 0]
            stage[i] = min(later) if later else 0
    for i in range(n):
        if stage[i] >= 0:
            continue
        fwd = [stage[p] for p in preds[i] if forward[p]]
        if fwd:
            stage[i] = max(fwd)
            continue
        known = [(-edge_bytes.get((p, i), 0), stage[p]) for p in preds[i] if stage[p] >= 0]
        stage[i] = min(known)[1] if known else -1
    for i in reversed(range(n)):
        if stage[i] < 0:
            later = [stage[c] for c in succs[i] if stage[c] >= 0]
            stage[i] = min(later) if later else 0


def _colocated_earliest(analysis: Analysis, stage: np.ndarray, index: dict[str, int], count: int) -> np.ndarray:
    """`stage` with ops TF must colocate in the earliest of their stages."""
    from tag_tf.analysis.grouping import UnionFind, colocation_pairs

    n = len(stage)
    sets = UnionFind(n)
    host = analysis.planning.host
    for a, b in colocation_pairs(analysis.graph_b1, list(host)):
        sets.union(index[host[a]], index[host[b]])
    first: dict[int, int] = {}
    for i in range(n):
        root = sets.find(i)
        first[root] = min(first.get(root, count), int(stage[i]))
    return np.array([first[sets.find(i)] for i in range(n)], dtype=np.int64)


def pipeline_plan(analysis: Analysis, stages: Sequence[Sequence[int]], microbatches: int, *,
                  option: Option = Option.ALLREDUCE, fractions: Sequence[float] | None = None,
                  shares: Sequence[float] | None = None, weights: np.ndarray | None = None, name: str = "pipeline",
                  **kw: object) -> Strategy:
    """A pipelined plan: the planned ops cut into stages (`op_stages`, `weights` per planned op),
    stage s on devices `stages[s]` (data-parallel over them by `option` and `shares` when
    several), the batch in `microbatches` micro-batches. Its op groups are the stages."""
    if not stages or any(not s for s in stages):
        raise StrategyError("every pipeline stage needs at least one device")
    stage = op_stages(analysis, fractions or [1.0] * len(stages), weights)
    used = sorted(set(stage.tolist()))               # a stage colocation emptied is left out
    renumber = {s: k for k, s in enumerate(used)}
    groups = tuple(GroupPlan(tuple(stages[s]), option) for s in used)
    return Strategy(groups, None if shares is None else tuple(shares), name=name, microbatches=microbatches,
                    op_groups=tuple(renumber[int(s)] for s in stage), **kw)  # type: ignore[arg-type]


def stage_blocks(topology: Topology, caps: Sequence[float]) -> list[list[tuple[int, ...]]]:
    """Candidate stage device sets: the machines (one machine: its devices) in the topology's
    order and fastest first, cut into S = 2..MAX_STAGES consecutive blocks of about equal capacity."""
    units = [tuple(g.devices) for g in topology.groups]
    if len(units) < 2:
        units = [(d,) for d in range(topology.num_devices)]
    out: list[list[tuple[int, ...]]] = []
    for order in (units, fastest_first(units, caps)):
        for count in range(2, min(MAX_STAGES, len(order)) + 1):
            blocks = capacity_blocks(order, caps, count)
            if blocks not in out:
                out.append(blocks)
    return out


def fastest_first(units: Sequence[tuple[int, ...]], caps: Sequence[float]) -> list[tuple[int, ...]]:
    """`units` (device tuples, e.g. machines) by their capacity, largest first (ties keep their order)."""
    return sorted(units, key=lambda u: -sum(caps[d] for d in u))


def capacity_blocks(order: Sequence[tuple[int, ...]], caps: Sequence[float], count: int) -> list[tuple[int, ...]]:
    """`order`'s units cut into `count` (<= len(order)) consecutive blocks of about equal capacity:
    a unit goes to the block its capacity's middle falls in, every block keeping at least one."""
    weight = np.array([sum(caps[d] for d in u) for u in order], dtype=float)
    middle = (np.cumsum(weight) - 0.5 * weight) / weight.sum()
    cuts = [0]
    for s in range(1, count):
        cut = int(np.searchsorted(middle, s / count, side="right"))
        cuts.append(min(max(cut, cuts[-1] + 1), len(order) - (count - s)))
    cuts.append(len(order))
    return [tuple(d for u in order[cuts[s]:cuts[s + 1]] for d in u) for s in range(count)]


def pipeline_search(cost: Evaluator, analysis: Analysis, topology: Topology, best_plan: Strategy | None,
                    best_time: float, deadline: Deadline, *, stages: bool = True,
                    fusion_bytes: int = HOROVOD_FUSION_BYTES) -> tuple[Strategy | None, float]:
    """The best of `best_plan` and the pipelined plans described in the module docstring (None:
    the best pipeline over the machines alone; None back when none runs). `stages` False: only
    `best_plan` in micro-batches."""
    caps = stage_capacities(cost.sim, topology)
    weights = planned_op_weights(cost.sim, int(cost.sim.device_type_index[int(np.argmax(caps))]))
    candidates: list[tuple[Strategy, list[tuple[int, ...]] | None, list[float] | None]] = []
    if best_plan is not None and not best_plan.sfb and best_plan.microbatches == 1:
        candidates += [(dataclasses.replace(best_plan, microbatches=m), None, None) for m in MICROBATCHES]
    for stage_devices in stage_blocks(topology, caps) if stages else ():
        capacity = [sum(caps[d] for d in b) for b in stage_devices]
        for m in MICROBATCHES:
            if m * max(len(b) for b in stage_devices) > analysis.batch_size:
                continue
            plan = pipeline_plan(analysis, stage_devices, m, fractions=capacity, shares=caps, weights=weights,
                                 fusion_bytes=fusion_bytes)
            candidates.append((plan, stage_devices, capacity))
    start_time, tried = best_time, 0
    found: tuple[list[tuple[int, ...]], list[float], int] | None = None
    try:
        for plan, where, share in candidates:
            deadline.check("the pipeline search")
            tried += 1
            t = cost(plan)
            if t < best_time:
                best_plan, best_time = plan, t
                found = None if where is None else (where, list(share or []), plan.microbatches)
        for _ in range(CUT_ROUNDS if found else 0):      # move the stage cuts of the best pipeline
            assert found is not None
            blocks, fractions, micro = found
            moved = False
            for s in range(len(blocks)):
                for step in CUT_STEPS:
                    deadline.check("the pipeline search")
                    trial = list(fractions)
                    trial[s] *= step
                    plan = pipeline_plan(analysis, blocks, micro, fractions=trial, shares=caps, weights=weights,
                                         fusion_bytes=fusion_bytes)
                    if best_plan is not None and plan.groups == best_plan.groups and plan.op_groups == best_plan.op_groups:
                        continue
                    tried += 1
                    t = cost(plan)
                    if t < best_time:
                        best_plan, best_time, fractions, moved = plan, t, trial, True
            found = (blocks, fractions, micro)
            if not moved:
                break
    except DeadlineExceeded:
        pass
    best_plan = _ordering(best_plan, topology)
    if best_plan is not None and best_time < start_time:
        log.info("tag_tf: pipelining: %d micro-batches beat the plan without (%.3g -> %.3g ms simulated, %d tried)",
                 best_plan.microbatches, start_time * 1e3, best_time * 1e3, tried)
    return best_plan, best_time


def _ordering(plan: Strategy | None, topology: Topology) -> Strategy | None:
    """A pipelined `plan` with the topology's slow links ordered (`ordered_links`); others as they are."""
    if plan is None or plan.microbatches == 1:
        return plan
    return dataclasses.replace(plan, ordered_links=ordered_links(topology))


def ordered_links(topology: Topology) -> tuple[tuple[int, int], ...]:
    """The machine pairs a pipeline sends over in micro-batch order (compiler/transfers.py): those
    slower than ORDERED_BELOW. Measured on the emulated clusters with every link ordered: over
    50 Mbit/s, cnn-wide's pipeline 13.8 -> 7.1 s a step and the mlp's 244 -> 182 ms; over 1 Gbit/s
    the round trip each micro-batch then waits for cost more than it saved (mlp 21 -> 28 ms, cnn
    52 -> 68 ms, transformer 174 -> 223 ms, cnn-wide 1.41 -> 1.58 s)."""
    first: dict[int, int] = {}
    for d in range(topology.num_devices):
        first.setdefault(topology.device(d).machine, d)
    return tuple((a, b) for a in sorted(first) for b in sorted(first)
                 if a != b and topology.bandwidth(first[a], first[b]) < ORDERED_BELOW)


def best_pipeline(sim: Simulator, topology: Topology, budget_s: float) -> Strategy:
    """The "pipeline" baseline: the best pipeline over the machines `pipeline_search` finds in
    `budget_s` (StrategyError when none runs: a batch smaller than two micro-batches per device)."""
    plan, _ = pipeline_search(Evaluator(sim), sim.analysis, topology, None, float("inf"), Deadline.after(budget_s))
    if plan is None:
        raise StrategyError(f"no pipelined plan runs on {topology.name!r} at batch {sim.analysis.batch_size} "
                            f"(stages over {topology.num_machines} machine(s), at least 2 micro-batches)")
    return plan


__all__ = ["MICROBATCHES", "PIPELINE", "PIPELINE_MAX_S", "PIPELINE_SHARE", "best_pipeline", "op_stages", "pipeline_plan", "pipeline_search", "planned_op_weights", "stage_blocks", "stage_capacities"]
