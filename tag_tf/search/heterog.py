"""The HeteroG baseline: HeteroG's decision space searched with our simulator and budget.

HeteroG (Yi et al., 2022) decides per op group either to replicate it on all devices, synchronised
by AllReduce or by parameter servers, or to place it on one device. We search that space with the
same simulator-driven moves as the planner (tag_tf/search/moves.py), single groups in descending
compute order, starting from the best fixed baseline; gradients keep that baseline's fusion.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tag_tf.deadline import Deadline
from tag_tf.search.moves import Evaluator, improve
from tag_tf.strategy import GroupPlan, Option, Strategy

if TYPE_CHECKING:
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.spec import Topology


def heterog_candidates(num_devices: int) -> list[GroupPlan]:
    everyone = tuple(range(num_devices))
    plans = [GroupPlan(everyone, Option.ALLREDUCE)]
    if num_devices > 1:
        plans.append(GroupPlan(everyone, Option.PS))
    plans.extend(GroupPlan((d,), Option.ALLREDUCE) for d in range(num_devices))
    return plans


def heterog_search(cost: Evaluator, topology: Topology, start: Strategy, start_time: float,
                   deadline: Deadline, *, progress: bool = False) -> tuple[Strategy, float]:
    """Improve `start` (simulated at `start_time`) within HeteroG's decision space."""
    sim = cost.sim
    strategy, t, _ = improve(cost, start, start_time, heterog_candidates(topology.num_devices),
                             [(g,) for g in sim.groups_by_compute()], deadline, progress=progress, label="heterog")
    return dataclasses.replace(strategy, name="heterog"), t


def heterog(sim: Simulator, topology: Topology, starts: Mapping[str, Strategy], budget_s: float = 10.0) -> Strategy:
    """The HeteroG baseline strategy for `sim`'s graph on `topology` (searched for `budget_s`), from the
    fastest of `starts` (the fixed baselines' plans: search/registry.py gives them)."""
    cost = Evaluator(sim)
    times = {name: cost(s) for name, s in starts.items()}
    best = min(times, key=times.__getitem__)
    strategy, _ = heterog_search(cost, topology, starts[best], times[best], Deadline.after(budget_s))
    return strategy


__all__ = ["heterog", "heterog_candidates", "heterog_search"]
