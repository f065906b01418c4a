"""The one list of baselines: REGISTRY. Every list the planner, the CLI, the demo, calibration and the
benchmarks show is derived from it (`baseline_names`, `fixed_baselines`, ...); adding a baseline is
one `register` call and the function that makes its plan (tests/search/test_baseline_registry.py
adds one). The plans themselves: search/baselines.py (the fixed rules, best-subset) and
search/heterog.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, overload

from tag_tf.search.baselines import (
    BEST_SUBSET,
    best_subset,
    data_parallel,
    data_parallel_proportional,
    device_capacities,
    horovod,
    horovod_proportional,
)
from tag_tf.search.heterog import heterog
from tag_tf.search.moves import Evaluator
from tag_tf.search.stages import PIPELINE, best_pipeline
from tag_tf.strategy import Strategy

if TYPE_CHECKING:
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.spec import Topology


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
    starts = {name: baseline(name, sim.num_groups, topology) for name in fixed_baselines()}
    return heterog(sim, topology, starts, budget_s)


def _best_subset(sim: Simulator, topology: Topology, budget_s: float) -> Strategy:
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
register(BaselineSpec(PIPELINE, "Pipeline", "stages of consecutive layers over the machines, each data-parallel over "
                      "its machines, the batch in micro-batches (GPipe); the best stage count and micro-batches "
                      "simulated", searched=best_pipeline))
