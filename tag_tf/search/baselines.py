"""Baseline strategies: the paper's DP-NCCL and DP-NCCL-P, Horovod (DP with fused gradient buckets)
and its proportional variant, plus seeded random strategies (tests, and the search's starting
points), and the best-subset baseline (Horovod-P on the fastest machines). HeteroG's searched baseline
lives in tag_tf/search/heterog.py.
The registry of baselines (names, labels, roles) is tag_tf/search/registry.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.placement.fusion import HOROVOD_FUSION_BYTES
from tag_tf.strategy import GroupPlan, Option, Strategy

if TYPE_CHECKING:
    from tag_tf.topology.spec import Topology

# Caps a random strategy draws from (None: one collective per tensor); also the caps the planner
# tries when it picks a latency-aware bucket size.
FUSION_CHOICES = (None, 4096, 2**20, 4 * 2**20, 16 * 2**20, HOROVOD_FUSION_BYTES)


def data_parallel(num_groups: int, num_devices: int, **kw) -> Strategy:
    """DP-NCCL: every group replicated on every device, even batch split, one AllReduce per
    gradient, started after the backward pass (in-graph replication; the paper credits Horovod,
    not DP-NCCL, with overlapping AllReduce and backward computation)."""
    return Strategy.uniform(num_groups, range(num_devices), Option.ALLREDUCE, name="dp",
                            sync_after_backward=True, **kw)


def data_parallel_proportional(num_groups: int, capacities: Sequence[float], **kw) -> Strategy:
    """DP-NCCL-P: like DP, with each device's batch share proportional to its compute capacity."""
    caps = np.asarray(capacities, dtype=float)
    if np.any(caps <= 0):
        raise ValueError("device capacities must be positive")
    shares = tuple(float(c) for c in caps / caps.sum())
    return Strategy.uniform(num_groups, range(len(caps)), Option.ALLREDUCE, shares=shares, name="dp-p",
                            sync_after_backward=True, **kw)


def horovod(num_groups: int, num_devices: int, **kw) -> Strategy:
    """Horovod: DP with gradients packed into 64 MB buckets in backward order (Tensor Fusion)."""
    return Strategy.uniform(num_groups, range(num_devices), Option.ALLREDUCE, name="horovod",
                            fusion_bytes=HOROVOD_FUSION_BYTES, **kw)


def horovod_proportional(num_groups: int, capacities: Sequence[float], **kw) -> Strategy:
    """Horovod with batch shares proportional to each device's compute capacity."""
    dp_p = data_parallel_proportional(num_groups, capacities, **kw)
    return dataclasses.replace(dp_p, name="horovod-p", fusion_bytes=HOROVOD_FUSION_BYTES, sync_after_backward=False)


def random_strategy(num_groups: int, num_devices: int, rng: np.random.Generator, *,
                    options: Sequence[Option] = tuple(Option), uneven: bool = True, **kw) -> Strategy:
    """Each group on a random non-empty device subset (random order) with a random option, and a
    random gradient fusion cap (drawn last, so the placements of a seed do not depend on it)."""
    groups = []
    for _ in range(num_groups):
        k = int(rng.integers(1, num_devices + 1))
        devices = tuple(int(d) for d in rng.permutation(num_devices)[:k])
        groups.append(GroupPlan(devices, options[int(rng.integers(len(options)))]))
    shares = tuple(float(x) for x in rng.uniform(0.5, 2.0, num_devices)) if uneven else None
    fusion = FUSION_CHOICES[int(rng.integers(len(FUSION_CHOICES)))]
    return Strategy(tuple(groups), shares, name="random", fusion_bytes=fusion, **kw)


def device_capacities(topology: Topology) -> list[float]:
    """Compute capacity of each device: its type's peak FLOP/s times its machine's measured speed
    (equal for identical devices)."""
    return [float(topology.gpu_type(d.type).peak_flops) * topology.machines[d.machine].speed
            for d in topology.devices]


BEST_SUBSET = "best-subset"


def machine_subsets(topology: Topology) -> list[tuple[int, ...]]:
    """The devices of the k fastest machines, for k = 1..machines (a machine's speed: the mean
    capacity of its devices; ties keep the topology's order)."""
    caps = device_capacities(topology)
    speed = {m: float(np.mean([caps[d] for d in range(topology.num_devices) if topology.devices[d].machine == m]))
             for m in range(topology.num_machines)}
    order = sorted(speed, key=lambda m: -speed[m])
    return [tuple(d for d in range(topology.num_devices) if topology.devices[d].machine in set(order[:k]))
            for k in range(1, len(order) + 1)]


def best_subset(cost: Callable[[Strategy], float], num_groups: int, topology: Topology, *, singles: bool = False
                ) -> tuple[Strategy, float]:
    """The baseline a user tries first on a mixed cluster (Sailor's observation: leave the slow
    machines out): Horovod-fused data parallelism with batch shares proportional to capacity, on
    the k fastest machines, for the k whose plan `cost` (a simulator) rates fastest. Returns the
    plan and its cost (inf when no subset fits). `singles`: every machine alone is a candidate too
    (where `cost` charges a client for feeding and driving other machines, sim/client.py, the
    fastest machine alone may be the worst one to keep: on the other side of a slow link)."""
    caps = np.asarray(device_capacities(topology), dtype=float)
    shares = tuple(float(c) for c in caps / caps.sum())
    best: tuple[Strategy | None, float] = (None, float("inf"))
    candidates = machine_subsets(topology)
    if singles:
        candidates += [alone for m in range(topology.num_machines)
                       if (alone := tuple(d.id for d in topology.devices if d.machine == m)) not in candidates]
    for devices in candidates:
        plan = Strategy.uniform(num_groups, devices, Option.ALLREDUCE, shares=shares, name=BEST_SUBSET,
                                fusion_bytes=HOROVOD_FUSION_BYTES)
        t = cost(plan)
        if best[0] is None or t < best[1]:
            best = (plan, t)
    assert best[0] is not None       # a topology has at least one machine
    return best[0], best[1]
