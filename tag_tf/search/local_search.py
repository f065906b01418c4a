"""A budgeted local search over per-group strategies, driven by the simulator.

Until the GNN-guided MCTS lands this is the planner behind `strategy="auto"`. It simulates every
fixed baseline (DP-NCCL, DP-NCCL-P, Horovod, Horovod-P), runs the HeteroG baseline's search for part
of the budget, and starts from the best of them or of uniform plans over fewer devices. Then, group by group in descending compute order
(the paper's MCTS order) and block by block (coupled groups), it tries each candidate placement —
all devices, the devices of the k fastest GPU types, each machine's device group — with AllReduce
and PS synchronisation, keeping any change that lowers the simulated iteration time, and finally
picks the gradient fusion cap that simulates fastest. Out-of-memory strategies count as infinitely
slow. The plan is therefore never slower (simulated) than any baseline it reports. Every strategy it
can produce is one the compiler turns into an equivalent graph.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.search.baselines import device_capacities
from tag_tf.search.moves import Evaluator, candidate_device_sets, coupled_blocks, improve, tune_fusion
from tag_tf.search.outcome import BaselineComparison
from tag_tf.search.registry import template_baseline
from tag_tf.search.stages import PIPELINE
from tag_tf.search.starts import Starts, baselines_to_beat
from tag_tf.strategy import GroupPlan, Option, Strategy

if TYPE_CHECKING:
    from tag_tf.analysis.grouping import OpGroup
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.spec import Topology

NOTHING_FITS = "every strategy tried runs out of device memory or has fewer samples than replicas"
HETEROG_SHARE = 0.4     # of the budget, for the HeteroG baseline's search (its result seeds ours)


@dataclasses.dataclass(frozen=True)
class SearchResult(BaselineComparison):
    strategy: Strategy
    iteration_time_s: float            # simulated
    baselines: dict[str, float]        # simulated iteration time of each baseline (inf: does not run)
    evaluations: int
    seconds: float
    improved_groups: int


def local_search(sim: Simulator, topology: Topology, *, budget_s: float = 30.0, max_passes: int = 3,
                 blocks: bool = True, progress: bool = False, deadline: Deadline | None = None) -> SearchResult:
    """The best plan found within `budget_s` seconds, or by `deadline` where that comes first
    (`blocks`: also move coupled groups together)."""
    start_time = time.perf_counter()
    deadline = (deadline or Deadline.never()).within(budget_s)
    cost = Evaluator(sim)
    starts = baselines_to_beat(cost, topology, deadline, heterog_share=HETEROG_SHARE, singles=sim.client is not None,
                               progress=progress)
    # The pipeline baseline is one to beat; the moves below start from the others (its groups are
    # its stages).
    best_name = starts.best(leave_out=(PIPELINE,))
    candidates = _candidates(topology)
    current, best = _start(cost, topology, starts, best_name, candidates, deadline)
    moves = [(g,) for g in sim.groups_by_compute()] + (coupled_blocks(sim.group_traffic()) if blocks else [])
    current, best, improved = improve(cost, current, best, candidates, moves, deadline,
                                      max_passes=max_passes, progress=progress)
    current, best = tune_fusion(cost, current, best, deadline)
    times = starts.times
    if np.isfinite(best):         # judged device by device where device classes were not exact
        best = cost.confirmed(current, best)
        if not best < times[best_name]:
            current, best = starts.plans[best_name], times[best_name]
    if PIPELINE in starts.plans and times[PIPELINE] < best:
        current, best = starts.plans[PIPELINE], cost.confirmed(starts.plans[PIPELINE], times[PIPELINE])
    strategy = dataclasses.replace(current, graph=sim.analysis.graph.fingerprint, topology=topology.fingerprint,
                                   name="auto")
    return SearchResult(strategy, best, times, cost.evaluations, time.perf_counter() - start_time, len(improved))


def _candidates(topology: Topology) -> list[GroupPlan]:
    return [GroupPlan(devices, option) for devices in candidate_device_sets(topology)
            for option in (Option.ALLREDUCE, Option.PS) if len(devices) > 1 or option is Option.ALLREDUCE]


def _start(cost: Evaluator, topology: Topology, starts: Starts, best_name: str, candidates: list[GroupPlan],
           deadline: Deadline) -> tuple[Strategy, float]:
    """Where the moves start: the best baseline (its synchronisation overlapped with the backward
    pass where that is faster), or a uniform plan over fewer devices that simulates faster."""
    current, best = starts.plans[best_name], starts.times[best_name]
    if current.sync_after_backward:
        # Our plans overlap synchronisation with the backward pass (DP-NCCL's barrier is its own).
        overlapped = dataclasses.replace(current, sync_after_backward=False)
        t = cost(overlapped)
        if t <= best:
            current, best = overlapped, t
    # Uniform plans over fewer devices (the fastest GPU type, one machine, the fastest GPU) also
    # start: a small model can run faster without the slow network at all, and when no baseline
    # fits (out of memory, fewer samples than devices) they are the only starts.
    fastest = int(np.argmax(device_capacities(topology)))
    for plan in [*candidates, GroupPlan((fastest,), Option.ALLREDUCE)]:
        if np.isfinite(best) and deadline.expired():
            break
        start = dataclasses.replace(starts.plans[template_baseline()], groups=(plan,) * cost.sim.num_groups)
        t = cost(start)
        if t < best * (1 - 1e-6):
            best, current = t, start
    return current, best


class GroupRow(TypedDict):
    """One group of a plan, for people: `describe`'s rows."""

    group: int
    ops: int
    compute_share: float
    option: str
    devices: list[int]
    by_type: dict[str, int]


def describe(strategy: Strategy, topology: Topology, groups: Sequence[OpGroup]) -> list[GroupRow]:
    """A readable per-group summary: devices by GPU type, option, compute share."""
    total = sum(g.compute for g in groups) or 1.0
    rows: list[GroupRow] = []
    for i, (plan, group) in enumerate(zip(strategy.groups, groups)):
        types: dict[str, int] = {}
        for d in plan.devices:
            t = topology.devices[d].type
            types[t] = types.get(t, 0) + 1
        rows.append({"group": i, "ops": len(group.ops), "compute_share": round(group.compute / total, 4),
                     "option": plan.option.value, "devices": list(plan.devices), "by_type": types})
    return rows


__all__ = ["NOTHING_FITS", "SearchResult", "candidate_device_sets", "coupled_blocks", "describe", "local_search"]
