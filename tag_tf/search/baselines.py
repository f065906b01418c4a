"""Baseline strategies: the paper's DP-NCCL and DP-NCCL-P, plus seeded random strategies (tests,
and the search's starting points)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tag_tf.strategy import GroupPlan, Option, Strategy


def data_parallel(num_groups: int, num_devices: int, **kw) -> Strategy:
    """DP-NCCL: every group replicated on every device, even batch split, AllReduce."""
    return Strategy.uniform(num_groups, range(num_devices), Option.ALLREDUCE, name="dp", **kw)


def data_parallel_proportional(num_groups: int, capacities: Sequence[float], **kw) -> Strategy:
    """DP-NCCL-P: like DP, with each device's batch share proportional to its compute capacity."""
    caps = np.asarray(capacities, dtype=float)
    if np.any(caps <= 0):
        raise ValueError("device capacities must be positive")
    shares = tuple(float(c) for c in caps / caps.sum())
    return Strategy.uniform(num_groups, range(len(caps)), Option.ALLREDUCE, shares=shares, name="dp-p", **kw)


def random_strategy(num_groups: int, num_devices: int, rng: np.random.Generator, *,
                    options: Sequence[Option] = tuple(Option), uneven: bool = True, **kw) -> Strategy:
    """Each group on a random non-empty device subset (random order) with a random option."""
    groups = []
    for _ in range(num_groups):
        k = int(rng.integers(1, num_devices + 1))
        devices = tuple(int(d) for d in rng.permutation(num_devices)[:k])
        groups.append(GroupPlan(devices, options[int(rng.integers(len(options)))]))
    shares = tuple(float(x) for x in rng.uniform(0.5, 2.0, num_devices)) if uneven else None
    return Strategy(tuple(groups), shares, name="random", **kw)


def device_capacities(topology) -> list[float]:
    """Compute capacity of each device: its type's peak FLOP/s (equal for identical devices)."""
    return [float(topology.gpu_type(d.type).peak_flops) for d in topology.devices]


BASELINES = ("dp", "dp-p")


def baseline(name: str, num_groups: int, topology, **kw) -> Strategy:
    """A named baseline for a topology: "dp" (DP-NCCL) or "dp-p" (DP-NCCL-P)."""
    if name == "dp":
        return data_parallel(num_groups, topology.num_devices, **kw)
    if name == "dp-p":
        return data_parallel_proportional(num_groups, device_capacities(topology), **kw)
    raise ValueError(f"unknown baseline {name!r} (expected one of {', '.join(BASELINES)})")
