"""Batch shares per plan: the split of the batch that balances each device's predicted compute.

Which shares are best depends on the plan: a GPU that also hosts an unreplicated group (or a
duplicated one, which sees the whole batch) should take fewer samples of the replicated groups than
its speed alone says. For a plan, device d computes

    time_d = a_d + s_d * c_d,   c_d = sum over batch-split groups g on d of  P[g, type d] * B / S_g

where a_d is the compute that does not depend on d's share (fixed op times, duplicated and
unreplicated groups, model-parallel parts), P[g, t] a group's per-sample time on type t, B the
batch and S_g the sum of the shares of g's devices (a group splits its batch by its devices'
shares). With every S_g held fixed, minimising max_d time_d subject to sum s_d = const is a linear
program whose optimum levels the devices: s_d = (T - a_d) / c_d with one T (water-filling), found by
bisection. S_g then moves with the new shares, so the solve repeats from them a few times (it
settles in two or three rounds when groups share their device sets, as they mostly do).
Communication is not in this model, nor the order in which groups wait for each other (a device
that runs the first layer alone delays everyone else's start): the MCTS polish keeps these shares
only when they simulate faster, then corrects them by simulation (`mcts.balance_shares`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.strategy import Option, Strategy

if TYPE_CHECKING:
    from tag_tf.sim.simulator import Simulator

ROUNDS = 4              # fixed-point rounds over the groups' share sums
MIN_SHARE = 1e-3        # of the total: every replica keeps some samples


class ShareSolver:
    """Per-group compute of one simulator's graph, by device type, ready to balance any plan."""

    def __init__(self, sim: Simulator):
        """`sim`: the Simulator of the plans' groups (`sim.for_strategy(plan)` for refined groups)."""
        self.fixed, self.per_sample = sim.group_times()          # [group, device type]
        self.batch = float(sim.batch_size)
        self.dev_type = np.asarray(sim.device_type_index, dtype=np.int64)

    def solve(self, strategy: Strategy, start: Sequence[float] | None = None) -> tuple[float, ...] | None:
        """Shares for `strategy` (None when no group splits its batch over several devices)."""
        D = len(self.dev_type)
        s = np.asarray(start if start is not None else strategy.shares if strategy.shares is not None
                       else np.ones(D), dtype=np.float64)
        s = s / s.sum()
        split = [(g, np.asarray(p.devices)) for g, p in enumerate(strategy.groups)
                 if p.option in (Option.ALLREDUCE, Option.PS) and len(p.devices) > 1]
        if not split:
            return None
        a = np.zeros(D)
        for g, plan in enumerate(strategy.groups):
            devs = np.asarray(plan.devices)
            types = self.dev_type[devs]
            if plan.option is Option.MODEL_PARALLEL and len(devs) > 1:     # parts of the ops, whole batch
                a[devs] += (self.fixed[g, types] + self.per_sample[g, types] * self.batch) / len(devs)
            elif plan.option in (Option.ALLREDUCE, Option.PS) and len(devs) > 1:
                a[devs] += self.fixed[g, types]
            else:                                                             # whole batch on each
                a[devs] += self.fixed[g, types] + self.per_sample[g, types] * self.batch
        free = np.zeros(D, dtype=bool)
        for _, devs in split:
            free[devs] = True
        total = s[free].sum()
        for _ in range(ROUNDS):
            c = np.zeros(D)
            for g, devs in split:
                c[devs] += self.per_sample[g, self.dev_type[devs]] * self.batch / s[devs].sum()
            new = s.copy()
            new[free] = _level(a[free], c[free], total)
            if np.allclose(new, s, rtol=1e-4, atol=1e-9):
                s = new
                break
            s = new
        return tuple(float(x) for x in s / s.sum())


def _level(a: np.ndarray, c: np.ndarray, total: float) -> np.ndarray:
    """Shares s >= MIN_SHARE * total with sum `total` minimising max(a + s * c) (water-filling)."""
    floor = MIN_SHARE * total
    busy = c > 0
    if not busy.any():
        return np.full(len(a), total / len(a))

    def shares(level: float) -> np.ndarray:
        out = np.full(len(a), floor)
        out[busy] = np.maximum(floor, (level - a[busy]) / c[busy])
        return out

    lo, hi = float(a.min()), float((a + total * c).max())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if shares(mid).sum() > total:
            hi = mid
        else:
            lo = mid
    s = shares(hi)
    return s * (total / s.sum())


__all__ = ["ShareSolver"]
