"""Baseline strategies: the paper's DP-NCCL and DP-NCCL-P, Horovod (DP with fused gradient buckets)
and its proportional variant, plus seeded random strategies (tests, and the search's starting
points), and the best-subset baseline (Horovod-P on the fastest machines). HeteroG's searched baseline
lives in tag_tf/search/heterog.py.

REGISTRY is the one list of baselines: every list the planner, the CLI, the demo, calibration and the
benchmarks show is derived from it (`baseline_names`, `fixed_baselines`, ...). Adding a baseline is
one `register` call and the function that makes its plan.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, overload

import numpy as np

from tag_tf.placement.fusion import HOROVOD_FUSION_BYTES
from tag_tf.strategy import GroupPlan, Option, Strategy

if TYPE_CHECKING:
    from tag_tf.sim.simulator import Simulator
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


@dataclasses.dataclass(frozen=True)
class BaselineSpec:
    """One baseline: its request name, its label in tables, one line on what it does, and how its
    plan is made. `rule(num_groups, topology)` for a fixed rule; `searched(sim, topology, budget_s)`
    for one that simulates candidates (the plan depends on the costs). Roles: `whole_replicas`
    (data parallelism over every device: what a task-driven cluster may fall back to, see
    frontend/planning.between_graph_choice), `fallback` (a plan that fallback may choose),
    `fittable` (its measured steps can fit a calibration: `tag-tf calibrate`), `template` (the
    plan whose buckets and shares the search's candidates start from; one baseline is)."""

    name: str
    label: str
    about: str
    rule: Callable[[int, Topology], Strategy] | None = None
    searched: Callable[[Simulator, Topology, float], Strategy] | None = None
    whole_replicas: bool = False
    fallback: bool = False
    fittable: bool = False
    template: bool = False

    def __post_init__(self) -> None:
        if (self.rule is None) == (self.searched is None):
            raise ValueError(f"baseline {self.name!r}: give exactly one of rule and searched")
        if self.whole_replicas and self.rule is None:
            raise ValueError(f"baseline {self.name!r}: whole-replica baselines are fixed rules")


REGISTRY: dict[str, BaselineSpec] = {}


class Names(Sequence[str]):
    """A read-only list of names derived from REGISTRY when read (it follows `register`)."""

    def __init__(self, derive: Callable[[], tuple[str, ...]]):
        self._derive = derive

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self._derive()[i]

    def __len__(self) -> int:
        return len(self._derive())

    def __contains__(self, name: object) -> bool:
        return name in self._derive()

    def __iter__(self) -> Iterator[str]:
        return iter(self._derive())

    def __repr__(self) -> str:
        return repr(self._derive())


def register(spec: BaselineSpec) -> BaselineSpec:
    """Add `spec` to the registry (after those there: the tables' column order)."""
    if spec.name in REGISTRY or spec.name in ("auto", "random") or "+" in spec.name:
        raise ValueError(f"baseline name {spec.name!r} is taken or reserved")
    if spec.template and any(s.template for s in REGISTRY.values()):
        raise ValueError(f"baseline {spec.name!r}: the search already has a template baseline")
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a baseline `register` added (tests)."""
    del REGISTRY[name]


def baseline_names() -> tuple[str, ...]:
    """Every baseline a user may request, in the tables' order."""
    return tuple(REGISTRY)


def fixed_baselines() -> tuple[str, ...]:
    """The baselines made by a fixed rule (no simulation): every search's starting points."""
    return tuple(n for n, s in REGISTRY.items() if s.rule is not None)


def whole_replica_baselines() -> tuple[str, ...]:
    return tuple(n for n, s in REGISTRY.items() if s.whole_replicas)


def fallback_baselines() -> tuple[str, ...]:
    return tuple(n for n, s in REGISTRY.items() if s.fallback)


def fittable_baselines() -> tuple[str, ...]:
    return tuple(n for n, s in REGISTRY.items() if s.fittable)


def template_baseline() -> str:
    """The fixed baseline whose fusion and shares the search's candidates start from."""
    return next(n for n, s in REGISTRY.items() if s.template)


def label(name: str) -> str:
    """A baseline's name in tables ("DP-NCCL (dp)"); other names as they are."""
    spec = REGISTRY.get(name)
    return name if spec is None else f"{spec.label} ({name})"


def baseline(name: str, num_groups: int, topology: Topology) -> Strategy:
    """The plan of a fixed-rule baseline (`fixed_baselines`) for `num_groups` groups on `topology`."""
    spec = REGISTRY.get(name)
    if spec is None or spec.rule is None:
        raise ValueError(f"unknown baseline {name!r} (the fixed rules: {', '.join(fixed_baselines())}; "
                         f"searched: {', '.join(n for n in REGISTRY if n not in fixed_baselines())})")
    return spec.rule(num_groups, topology)


def make_baseline(name: str, num_groups: int, topology: Topology, sim: Callable[[], Simulator],
                  budget_s: float = 10.0) -> Strategy:
    """Any registered baseline's plan: a fixed rule's, or a searched one's judged by `sim()` (made
    only when needed) within `budget_s`."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown baseline {name!r} (expected one of {', '.join(REGISTRY)})")
    if spec.rule is not None:
        return spec.rule(num_groups, topology)
    assert spec.searched is not None
    return spec.searched(sim(), topology, budget_s)


def _heterog(sim: Simulator, topology: Topology, budget_s: float) -> Strategy:
    from tag_tf.search.heterog import heterog

    return heterog(sim, topology, budget_s)


def _best_subset(sim: Simulator, topology: Topology, budget_s: float) -> Strategy:
    from tag_tf.search.moves import Evaluator

    return best_subset(Evaluator(sim), sim.num_groups, topology, singles=sim.client is not None)[0]


register(BaselineSpec("dp", "DP-NCCL", "every group on every device, even batch shares, one AllReduce per gradient "
                      "after the backward pass", rule=lambda n, t: data_parallel(n, t.num_devices),
                      whole_replicas=True, fallback=True, fittable=True))
register(BaselineSpec("dp-p", "DP-NCCL-P", "DP with batch shares proportional to device capacity",
                      rule=lambda n, t: data_parallel_proportional(n, device_capacities(t)),
                      whole_replicas=True, fallback=True, fittable=True))
register(BaselineSpec("horovod", "Horovod", "DP with gradients fused into 64 MB buckets, overlapping the backward pass",
                      rule=lambda n, t: horovod(n, t.num_devices), whole_replicas=True, fallback=True, fittable=True))
register(BaselineSpec("horovod-p", "Horovod-P", "Horovod with batch shares proportional to device capacity",
                      rule=lambda n, t: horovod_proportional(n, device_capacities(t)),
                      whole_replicas=True, fallback=True, fittable=True, template=True))
register(BaselineSpec("heterog", "HeteroG", "HeteroG's decision space (replicate with AllReduce or PS, or one "
                      "device, per group) searched from the best fixed baseline", searched=_heterog))
register(BaselineSpec(BEST_SUBSET, "Best subset", "Horovod-P on the k fastest machines, the best k simulated",
                      searched=_best_subset, fallback=True))
