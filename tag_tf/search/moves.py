"""The simulator-driven improvement loop shared by the planner ("auto") and the HeteroG baseline.

A search here is: a starting strategy, a list of candidate group plans, a list of moves (single
groups or blocks of coupled groups), and a budget. Every move tries every candidate and keeps any
change that lowers the simulated iteration time; out-of-memory strategies count as infinitely slow.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.errors import DeadlineExceeded, StrategyError
from tag_tf.ir import TensorRef
from tag_tf.search.baselines import FUSION_CHOICES, device_capacities
from tag_tf.strategy import GroupPlan, Option, SfbCut, Strategy

if TYPE_CHECKING:
    from tag_tf.sim.simulator import SimReport, Simulator
    from tag_tf.topology.spec import Topology

log = logging.getLogger("tag_tf.search")


# Above this many devices a search judges candidates on collapsed device classes even where they
# are not exact (Simulator.simulate's `approximate`; measured within 5% on random plans over
# whole machines, tests/sim/test_collapse.py) and the plan it returns in full (`confirmed`).
APPROXIMATE_ABOVE = 64


class Evaluator:
    """Simulated iteration time of strategies, counting simulations; inf when a strategy cannot run.
    `approximate`: see APPROXIMATE_ABOVE (default: by the simulator's device count).

    `with_sfb(cuts)` makes it judge each plan as the better of itself and itself with those of
    `cuts` (sufficient factor broadcasting, search/sfb.py) whose ops it replicates: SFB is applied
    after a search, and a plan that replicates a large dense gradient over a slow link is slow
    without it, so a search that did not know SFB never reached the plans SFB makes fastest. The
    plans it returns carry no cuts; `best_with_sfb` solves them again (seeded with `cuts`)."""

    def __init__(self, sim: Simulator, approximate: bool | None = None):
        self.sim = sim
        self.approximate = sim.num_devices > APPROXIMATE_ABOVE if approximate is None else approximate
        self.evaluations = 0
        self.unsimulatable = 0         # candidates the native expander could not order (see below)
        self.sfb_cuts: tuple[tuple[SfbCut, frozenset[int]], ...] = ()     # (cut, the groups of its ops)

    def with_sfb(self, cuts: Sequence[SfbCut]) -> Evaluator:
        """From now on, plans are judged with the cuts of `cuts` they replicate (class doc)."""
        group_of = self.sim.analysis.grouping.group_of
        self.sfb_cuts = tuple((c, groups) for c in cuts if (groups := cut_groups(c, group_of)) is not None)
        return self

    def _applicable(self, strategy: Strategy) -> list[SfbCut]:
        if not self.sfb_cuts or strategy.sfb or strategy.microbatches > 1 or strategy.op_groups is not None:
            return []
        replicated = replicated_groups(strategy)
        return [c for c, groups in self.sfb_cuts if cut_applies(strategy, replicated, c, groups)]

    def __call__(self, strategy: Strategy) -> float:
        report = self.report(strategy)
        return float("inf") if report is None or report.oom else report.iteration_time_s

    def confirmed(self, strategy: Strategy, seconds: float) -> float:
        """`strategy`'s time in a full simulation where its collapsed one (device classes,
        kernels/expand.h) was not exact: a plan the search returns is judged device by device."""
        report = self.report(strategy)
        if report is None or report.oom or report.exact:
            return seconds
        report = self.report(strategy, collapse=False)
        return float("inf") if report is None or report.oom else report.iteration_time_s

    def report(self, strategy: Strategy, *, collapse: bool | None = None) -> SimReport | None:
        """The simulation report, or None when the strategy cannot run (see __call__); with SFB cuts
        (`with_sfb`), the faster of the plan's and the plan's with the cuts it replicates."""
        report = self._report(strategy, collapse)
        cuts = self._applicable(strategy)
        if cuts:
            other = self._report(strategy.with_sfb_cuts(cuts), collapse)
            if other is not None and not other.oom and (report is None or report.oom or
                                                        other.iteration_time_s < report.iteration_time_s):
                return other
        return report

    def _report(self, strategy: Strategy, collapse: bool | None) -> SimReport | None:
        self.evaluations += 1
        try:
            return self.sim.simulate(strategy, collapse=collapse, approximate=self.approximate)
        except StrategyError:          # e.g. a batch too small for that many replicas
            return None
        except RuntimeError as e:
            # Some model-parallel groups mixed with fused buckets expand to a cyclic task graph in
            # the native simulator although the compiled graph is a DAG: such a candidate cannot
            # be judged, so the search never picks it (counted, logged once per search).
            if "cycle" not in str(e):
                raise
            if not self.unsimulatable:
                log.info("tag_tf: the simulator cannot order a candidate strategy (%s); skipping such "
                         "candidates", e)
            self.unsimulatable += 1
            return None


def cut_groups(cut: SfbCut, group_of: Mapping[str, int]) -> frozenset[int] | None:
    """The groups of a cut's ops and, for a gradient synchronised in pieces (SfbCut.allreduced), of
    the summands' producers; None where one is not an op of these groups (a cut of another graph)."""
    ops = (*cut.ops, *(TensorRef.parse(t.lstrip("^")).op for t in cut.allreduced))
    return frozenset(group_of[op] for op in ops) if all(op in group_of for op in ops) else None


def cut_applies(strategy: Strategy, replicated: set[int], cut: SfbCut, groups: frozenset[int]) -> bool:
    """Whether `strategy` can take `cut` (whose `cut_groups` are `groups`): every group replicated
    (`replicated_groups`) and, for a gradient synchronised in pieces (SfbCut.allreduced), its ops and
    the summands' producers in one allreduce layout (what the SFB solver offers)."""
    if not groups <= replicated:
        return False
    plans = {strategy.groups[g] for g in groups}
    return not cut.allreduced or (len({p.devices for p in plans}) == 1
                                  and all(p.option is Option.ALLREDUCE for p in plans))


def replicated_groups(strategy: Strategy) -> set[int]:
    """The groups whose ops SFB may duplicate: replicated with AllReduce or PS on 2+ devices."""
    return {g for g, plan in enumerate(strategy.groups)
            if len(plan.devices) > 1 and plan.option in (Option.ALLREDUCE, Option.PS)}


# Above this many machines the device sets follow the cluster's hierarchy (machine kinds and
# counts) instead of listing every machine: one action per machine would make the tree as wide as
# the cluster, and plans over whole machines of a kind are what the simulator's device classes
# make cheap.
HIERARCHY_MACHINES = 8


def candidate_device_sets(topology: Topology) -> list[tuple[int, ...]]:
    """All devices; the devices of the k fastest GPU types for each k; then, on up to
    HIERARCHY_MACHINES machines, each machine's group, and on larger clusters each speed class alone
    and its first 1, 2, 4, ... machines (`hierarchy_sets`)."""
    caps = device_capacities(topology)
    speeds = sorted({c for c in caps}, reverse=True)
    sets: list[tuple[int, ...]] = [tuple(range(topology.num_devices))]
    for k in range(1, len(speeds)):
        keep = set(speeds[:k])
        sets.append(tuple(d for d in range(topology.num_devices) if caps[d] in keep))
    if topology.num_machines > HIERARCHY_MACHINES:
        sets.extend(hierarchy_sets(topology, caps))
    else:
        sets.extend(tuple(g.devices) for g in topology.groups)
    unique: list[tuple[int, ...]] = []
    for s in sets:
        if s and s not in unique:
            unique.append(s)
    return unique


def hierarchy_sets(topology: Topology, caps: Sequence[float]) -> list[tuple[int, ...]]:
    """Device sets over whole machines of one speed (a machine's speed: its fastest device): each
    speed class alone, and its first 1, 2, 4, ... machines, fastest class first."""
    by_speed: dict[float, list[int]] = {}
    for m in range(topology.num_machines):
        speed = max(caps[d.id] for d in topology.devices if d.machine == m)
        by_speed.setdefault(speed, []).append(m)
    sets: list[tuple[int, ...]] = []
    for speed in sorted(by_speed, reverse=True):
        machines = by_speed[speed]
        counts = [len(machines)]
        n = 1
        while n < len(machines):
            counts.append(n)
            n *= 2
        for count in counts:
            keep = set(machines[:count])
            sets.append(tuple(d.id for d in topology.devices if d.machine in keep))
    return sets


def coupled_blocks(traffic: np.ndarray, *, ratio: float = 0.5, most: int = 6) -> list[tuple[int, ...]]:
    """Blocks of groups that should move together: each group with the groups it exchanges at least
    `ratio` of its heaviest exchange with (bytes per iteration, both directions), if that makes 2 to
    `most` groups. `traffic[a, b]`: bytes group a sends to group b (`Simulator.group_traffic()`).
    A large layer's weights, its forward op and its gradient ops often land in different groups
    (METIS balances compute); moving any one of them alone to other devices ships the weights every
    step, so only the block move can win."""
    w = np.asarray(traffic, dtype=np.float64)
    num_groups = w.shape[0]
    w = w + w.T
    blocks: list[tuple[int, ...]] = []
    for g in range(num_groups):
        if w[g].max() <= 0:
            continue
        block = tuple(sorted({g, *np.flatnonzero(w[g] >= ratio * w[g].max()).tolist()}))
        if 2 <= len(block) <= most and block not in blocks:
            blocks.append(block)
    # Heaviest exchanges first: they decide the most communication.
    weight = {b: sum(w[i, j] for i in b for j in b) for b in blocks}
    return sorted(blocks, key=lambda b: -weight[b])


def improve(cost: Evaluator, start: Strategy, best: float, candidates: Sequence[GroupPlan],
            moves: Sequence[tuple[int, ...]], deadline: Deadline, *, max_passes: int = 3,
            progress: bool = False, label: str = "planning") -> tuple[Strategy, float, set[int]]:
    """Passes of `moves` x `candidates` from `start` (simulated at `best`) until nothing improves,
    `max_passes` or the deadline. Returns the best strategy, its time and the groups changed."""
    groups = list(start.groups)
    improved: set[int] = set()
    bar = _progress(progress, max_passes * len(moves) * len(candidates), label)
    try:
        for _ in range(max_passes):
            changed = False
            for block in moves:
                for plan in candidates:
                    deadline.check("the search")
                    bar.update(1)
                    if all(groups[g] == plan for g in block):
                        continue
                    trial = groups.copy()
                    for g in block:
                        trial[g] = plan
                    t = cost(dataclasses.replace(start, groups=tuple(trial)))
                    if t < best * (1 - 1e-6):
                        best, groups = t, trial
                        improved.update(block)
                        changed = True
            if not changed:
                break
    except DeadlineExceeded:
        pass
    finally:
        bar.close()
    return dataclasses.replace(start, groups=tuple(groups)), best, improved


def tune_fusion(cost: Evaluator, strategy: Strategy, best: float, deadline: Deadline) -> tuple[Strategy, float]:
    """The latency-aware bucket size: the fusion cap (or none) that simulates fastest."""
    for cap in FUSION_CHOICES:
        if cap == strategy.fusion_bytes:
            continue
        try:
            deadline.check("the search")
        except DeadlineExceeded:
            break
        trial = dataclasses.replace(strategy, fusion_bytes=cap)
        t = cost(trial)
        if t < best * (1 - 1e-6):
            strategy, best = trial, t
    return strategy, best


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool, total: int, label: str):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"tag_tf: {label}", unit="sim", leave=False, disable=None)


__all__ = ["APPROXIMATE_ABOVE", "HIERARCHY_MACHINES", "Evaluator", "candidate_device_sets", "coupled_blocks",
           "hierarchy_sets", "improve", "tune_fusion"]
