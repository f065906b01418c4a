"""A budgeted local search over per-group strategies, driven by the simulator.

Until the GNN-guided MCTS lands this is the planner behind `strategy="auto"`. It starts from the
better DP baseline (DP-NCCL or DP-NCCL-P, by simulation) and then, group by group in descending
compute order (the paper's MCTS order), tries each candidate placement — all devices, the devices of
the k fastest GPU types, each machine's device group — with AllReduce and PS synchronisation,
keeping any change that lowers the simulated iteration time. Out-of-memory strategies count as
infinitely slow. Every strategy it can produce is one the compiler turns into an equivalent graph.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from tag_tf.errors import StrategyError
from tag_tf.search.baselines import baseline, device_capacities
from tag_tf.strategy import GroupPlan, Option, Strategy


NOTHING_FITS = "every strategy tried runs out of device memory or has fewer samples than replicas"


@dataclasses.dataclass(frozen=True)
class SearchResult:
    strategy: Strategy
    iteration_time_s: float            # simulated
    baselines: dict[str, float]        # simulated iteration time of each baseline
    evaluations: int
    seconds: float
    improved_groups: int

    @property
    def found(self) -> bool:
        """False when no strategy tried runs (see NOTHING_FITS)."""
        return bool(np.isfinite(self.iteration_time_s))

    @property
    def speedup_over_dp(self) -> float | None:
        """None when DP or the plan does not run (out of memory, batch smaller than the devices)."""
        dp, t = self.baselines["dp"], self.iteration_time_s
        if not (self.found and np.isfinite(dp)) or t <= 0:
            return None
        return dp / t


def candidate_device_sets(topology: Any) -> list[tuple[int, ...]]:
    """All devices; the devices of the k fastest GPU types for each k; each machine's group."""
    caps = device_capacities(topology)
    speeds = sorted({c for c in caps}, reverse=True)
    sets: list[tuple[int, ...]] = [tuple(range(topology.num_devices))]
    for k in range(1, len(speeds)):
        keep = set(speeds[:k])
        sets.append(tuple(d for d in range(topology.num_devices) if caps[d] in keep))
    sets.extend(tuple(g.devices) for g in topology.groups)
    unique: list[tuple[int, ...]] = []
    for s in sets:
        if s and s not in unique:
            unique.append(s)
    return unique


def coupled_blocks(prepared: Any, num_groups: int, *, ratio: float = 0.5, most: int = 6) -> list[tuple[int, ...]]:
    """Blocks of groups that should move together: each group with the groups it exchanges at least
    `ratio` of its heaviest exchange with (bytes per iteration, both directions), if that makes 2 to
    `most` groups. A large layer's weights, its forward op and its gradient ops often land in
    different groups (METIS balances compute); moving any one of them alone to other devices ships
    the weights every step, so only the block move can win."""
    src = np.asarray(prepared["op_group"])[np.asarray(prepared["e_src"])]
    dst = np.asarray(prepared["op_group"])[np.asarray(prepared["e_dst"])]
    cross = src != dst
    w = np.zeros((num_groups, num_groups))
    np.add.at(w, (src[cross], dst[cross]), np.asarray(prepared["e_bytes"], dtype=np.float64)[cross])
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


def local_search(sim: Any, topology: Any, *, budget_s: float = 30.0, max_passes: int = 3,
                 blocks: bool = True, progress: bool = False) -> SearchResult:
    """Improve on the best DP baseline within `budget_s` seconds of search (`blocks`: also move
    coupled groups together)."""
    start_time = time.perf_counter()
    n_groups = sim.num_groups
    evaluations = 0

    def cost(strategy: Strategy) -> float:
        nonlocal evaluations
        evaluations += 1
        try:
            report = sim.simulate(strategy)
        except StrategyError:          # e.g. a batch too small for that many replicas
            return float("inf")
        return float("inf") if report.oom else report.iteration_time_s

    baselines = {name: cost(baseline(name, n_groups, topology)) for name in ("dp", "dp-p")}
    best_name = min(baselines, key=baselines.get)
    current = baseline(best_name, n_groups, topology)
    best = baselines[best_name]
    candidates = [GroupPlan(devices, option) for devices in candidate_device_sets(topology)
                  for option in (Option.ALLREDUCE, Option.PS) if len(devices) > 1 or option is Option.ALLREDUCE]
    if not np.isfinite(best):
        # DP itself does not fit (out of memory, or fewer samples than devices): start from the best
        # uniform plan over a smaller device set instead.
        proportional = baseline("dp-p", n_groups, topology).shares
        for plan in candidates:
            start = Strategy.uniform(n_groups, plan.devices, plan.option, shares=proportional)
            t = cost(start)
            if t < best:
                best, current = t, start
    shares = current.shares
    order = np.argsort([-g.compute for g in sim.analysis.grouping.groups], kind="stable")
    moves = [(int(g),) for g in order] + (coupled_blocks(sim.prepared, n_groups) if blocks else [])
    groups = list(current.groups)
    improved: set[int] = set()
    bar = _progress(progress, max_passes * len(moves) * len(candidates))
    try:
        for _ in range(max_passes):
            changed = False
            for block in moves:
                for plan in candidates:
                    if time.perf_counter() - start_time > budget_s:
                        raise _OutOfTime
                    bar.update(1)
                    if all(groups[g] == plan for g in block):
                        continue
                    trial = groups.copy()
                    for g in block:
                        trial[g] = plan
                    t = cost(Strategy(tuple(trial), shares))
                    if t < best * (1 - 1e-6):
                        best, groups = t, trial
                        improved.update(block)
                        changed = True
            if not changed:
                break
    except _OutOfTime:
        pass
    finally:
        bar.close()
    strategy = Strategy(tuple(groups), shares, sim.analysis.graph.fingerprint, topology.fingerprint,
                        name="auto")
    return SearchResult(strategy, best, baselines, evaluations, time.perf_counter() - start_time, len(improved))


class _OutOfTime(Exception):
    pass


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool, total: int):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="tag_tf: planning", unit="sim", leave=False, disable=None)


def describe(strategy: Strategy, topology: Any, groups: Sequence[Any]) -> list[dict[str, Any]]:
    """A readable per-group summary: devices by GPU type, option, compute share."""
    total = sum(g.compute for g in groups) or 1.0
    rows = []
    for i, (plan, group) in enumerate(zip(strategy.groups, groups)):
        types: dict[str, int] = {}
        for d in plan.devices:
            t = topology.devices[d].type
            types[t] = types.get(t, 0) + 1
        rows.append({"group": i, "ops": len(group.ops), "compute_share": round(group.compute / total, 4),
                     "option": plan.option.value, "devices": list(plan.devices), "by_type": types})
    return rows
