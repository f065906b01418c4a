"""Group refinement: split the op groups that dominate a plan and place their halves apart.

METIS groups are fixed before the search, and a group's ops can never be separated again by a
group-level search: a group holding a quarter of the compute caps every plan. After the MCTS, the
groups of the best plan that dominate it -- by compute, or by the parameter bytes they pin to
their devices -- are split again in two (METIS inside the group, colocation kept, as model
parallelism splits a group), each half starting from its parent's action; the local search's
moves then place the halves independently. The result carries its grouping (`Strategy.op_groups`),
so `simulate`, `verify`, `distribute` and the plan cache see the groups it was made for.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.placement.layout import mp_partition
from tag_tf.search.moves import Evaluator, improve
from tag_tf.strategy import GroupPlan, Strategy

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.sim.simulator import Simulator

MAX_SPLITS = 4            # groups split per round
ROUNDS = 3                # rounds of splitting (each on the groups the last one left)
DOMINANT = 1.5            # a group dominates when its compute (or parameter bytes) exceed this x the mean


def dominant_groups(analysis: Analysis, limit: int = MAX_SPLITS) -> list[int]:
    """The groups whose compute or parameter bytes exceed DOMINANT x the mean, heaviest first
    (only groups of at least two planned ops can be split)."""
    groups = analysis.grouping.groups
    compute = np.array([g.compute for g in groups], dtype=np.float64)
    params = np.array([g.param_bytes for g in groups], dtype=np.float64)
    score = np.maximum(compute / max(compute.mean(), 1e-30), params / max(params.mean(), 1.0))
    order = np.argsort(-score, kind="stable")
    return [int(g) for g in order if score[g] > DOMINANT and len(groups[g].ops) > 1][:limit]


def split_groups(analysis: Analysis, strategy: Strategy, groups: Sequence[int]) -> tuple[np.ndarray, Strategy]:
    """Each of `groups` split in two; the second halves become new groups at the end, with their
    parent's action. Returns (group id per planned op, the strategy on that grouping)."""
    planning = analysis.planning
    index = {name: i for i, name in enumerate(planning.ops)}
    op_group = np.empty(len(planning.ops), dtype=np.int64)
    for group in analysis.grouping.groups:
        for op in group.ops:
            op_group[index[op]] = group.id
    plans = list(strategy.groups)
    for g in groups:
        parts = mp_partition(analysis, g, 2)
        moved = [index[op] for op, part in parts.items() if part == 1]
        if not moved or len(moved) == len(parts):
            continue
        op_group[moved] = len(plans)
        plans.append(plans[g])
    return op_group, dataclasses.replace(strategy, groups=tuple(plans), op_groups=tuple(int(x) for x in op_group))


def refine(sim: Simulator, strategy: Strategy, best: float, actions: Sequence[GroupPlan], deadline: Deadline, *,
           rounds: int = ROUNDS, progress: bool = False) -> tuple[Strategy, float, int]:
    """Split the dominant groups of `strategy` and place the halves by local moves, again on the
    refined groups while that pays and time is left (`rounds` at most). Returns the refined plan
    and its time when it simulates faster, else the input; and the simulations run."""
    runs = 0
    for _ in range(rounds):
        if deadline.expired():
            break
        found, t, n = _refine_once(sim, strategy, best, actions, deadline, progress)
        runs += n
        if found is strategy:
            break
        strategy, best = found, t
    return strategy, best, runs


def _refine_once(sim: Simulator, strategy: Strategy, best: float, actions: Sequence[GroupPlan], deadline: Deadline,
                 progress: bool) -> tuple[Strategy, float, int]:
    base = sim.analysis.for_strategy(strategy)
    targets = dominant_groups(base)
    if not targets:
        return strategy, best, 0
    _, refined = split_groups(base, strategy, targets)
    if len(refined.groups) == len(strategy.groups):
        return strategy, best, 0
    cost = Evaluator(sim)
    t = cost(refined)
    children = list(range(len(strategy.groups), len(refined.groups)))
    moves = [(g,) for g in targets] + [(c,) for c in children]
    found, t, _ = improve(cost, refined, t, actions, moves, deadline, max_passes=1, progress=progress,
                          label="refine")
    if t < best * (1 - 1e-6):
        return found, t, cost.evaluations
    return strategy, best, cost.evaluations


__all__ = ["MAX_SPLITS", "ROUNDS", "dominant_groups", "refine", "split_groups"]
