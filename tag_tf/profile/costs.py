"""Per-op, per-device-type compute times: the one entry the simulator and the planner use.

    costs = op_costs(g_b1, g_b2, b1, b2, op_names, ("cpu", "V100-32GB"), profile=cpu_profile)
    t = costs.fixed[d, i] + costs.per_sample[d, i] * samples

`samples` is the number of the global batch's samples one instance of the op processes (a replica
of a data-parallel group processes its share); per_sample is 0 for ops whose work does not depend on
the batch (optimizer updates, ops on parameters).

Where the times come from, per device type:
* the measured `OpProfile` when it was measured on that device type: its fitted line per op. Ops a
  runtime pass fused into another kernel (`profile.info["absorbed"]`) cost 0 there, their time being
  part of the absorbing op's; ops the profile does not have fall back to the model;
* otherwise the analytical `CostModel` applied to the op's static work at two batch sizes: graph_b1
  and graph_b2 are the IR of the same graph at batch sizes b1 and b2, and the line through the two
  predicted times gives fixed and per_sample (exact when the work is linear in the batch and both
  points are on the same side of the roofline).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

import numpy as np

from tag_tf.errors import ProfileError, TagError
from tag_tf.ir.graph import Graph
from tag_tf.profile.costmodel import CostModel
from tag_tf.profile.flops import GraphWork, graph_work_detail

if TYPE_CHECKING:
    from tag_tf.profile.op_profile import OpProfile
    from tag_tf.topology.gpus import GpuType


class OpCostsDict(TypedDict):
    """`OpCosts.to_dict()` (JSON)."""

    op_names: list[str]
    device_types: list[str]
    fixed: list[list[float]]
    per_sample: list[list[float]]
    source: dict[str, str]
    modes: NotRequired[dict[str, dict[str, str]]]


@dataclasses.dataclass(frozen=True, eq=False)
class OpCosts:
    """Linear op-time models [device type, op] in seconds: t = fixed + per_sample * samples."""

    op_names: tuple[str, ...]
    device_types: tuple[str, ...]
    fixed: np.ndarray
    per_sample: np.ndarray
    source: dict[str, str]
    # device type -> op class -> the math mode its modelled ops were costed in ("tf32", "fp32",
    # "half"; "measured" where a profile gave every op's time)
    modes: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        shape = (len(self.device_types), len(self.op_names))
        if self.fixed.shape != shape or self.per_sample.shape != shape:
            raise ValueError(f"fixed/per_sample must be [device types, ops] = {shape}")

    def op_index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.op_names)}

    def device_index(self, device_type: str) -> int:
        try:
            return self.device_types.index(device_type)
        except ValueError:
            raise ProfileError(f"no op costs for device type {device_type!r} "
                               f"(have: {', '.join(self.device_types)})") from None

    def times(self, device_type: str, samples: float | np.ndarray) -> np.ndarray:
        """Time of every op on one device type with `samples` samples (scalar or per-op array)."""
        d = self.device_index(device_type)
        return self.fixed[d] + self.per_sample[d] * np.asarray(samples, dtype=np.float64)

    def time(self, op_name: str, device_type: str, samples: float) -> float:
        d = self.device_index(device_type)
        i = self.op_index()[op_name]
        return float(self.fixed[d, i] + self.per_sample[d, i] * samples)

    def to_dict(self) -> OpCostsDict:
        return {"op_names": list(self.op_names), "device_types": list(self.device_types),
                "fixed": self.fixed.tolist(), "per_sample": self.per_sample.tolist(), "source": dict(self.source),
                "modes": {k: dict(v) for k, v in self.modes.items()}}

    @classmethod
    def from_dict(cls, d: OpCostsDict) -> OpCosts:
        return cls(tuple(d["op_names"]), tuple(d["device_types"]), np.asarray(d["fixed"], dtype=np.float64),
                   np.asarray(d["per_sample"], dtype=np.float64), dict(d["source"]),
                   {k: dict(v) for k, v in dict(d.get("modes") or {}).items()})


def canonical_device_type(device_type: str) -> str:
    """GPU_TYPES name for a type or alias; other names ("cpu", an unknown local GPU) as given."""
    from tag_tf.topology.gpus import gpu_type

    try:
        return gpu_type(device_type).name
    except TagError:
        return device_type


def model_line(model: CostModel, work_b1: GraphWork, work_b2: GraphWork, b1: int, b2: int,
               device_type: str | GpuType) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, per_sample) through the model's times at two batch sizes, clipped non-negative.

    A matmul or convolution the kernel model costs (a GPU type) and whose work grows with the batch
    gets its launch as the fixed part and the rest proportional to the batch: its waves of tiles make
    time a staircase in the batch size, and a line through two nearby points of a staircase (the
    analysis' b1 and b2 are often a few samples apart) would be flat or steep by accident."""
    t1 = model.times(work_b1.flops, work_b1.bytes, device_type, work_b1.classes, work_b1.kernels)
    t2 = model.times(work_b2.flops, work_b2.bytes, device_type, work_b2.classes, work_b2.kernels)
    per = np.maximum((t2 - t1) / float(b2 - b1), 0.0)
    fixed = np.maximum(t1 - per * b1, 0.0)
    covered = model.kernel_mask(work_b2.kernels, device_type)
    if covered is not None:
        scaled = covered & (work_b2.flops != work_b1.flops)
        if scaled.any():
            launch = model.launch_times(work_b2.classes, device_type)
            per = np.where(scaled, np.maximum(t2 - launch, 0.0) / float(b2), per)
            fixed = np.where(scaled, launch, fixed)
    return fixed, per


def op_costs(graph_b1: Graph, graph_b2: Graph, b1: int, b2: int, op_names: Sequence[str],
             device_types: Sequence[str], profile: OpProfile | Iterable[OpProfile] | None = None,
             model: CostModel | None = None, resolve: Callable[[str], GpuType] | None = None) -> OpCosts:
    """Op times for every device type: measured where a profile's device type matches, else the
    analytical model (see the module docstring). `profile` is an OpProfile, several (one per device
    type; the first of a type wins) or None; `resolve` gives a type name's GpuType (a topology's own
    custom types; default: the built-in table)."""
    if b1 == b2 or b1 < 1 or b2 < 1:
        raise ProfileError(f"op_costs needs two distinct positive batch sizes, got {b1} and {b2}")
    names = tuple(op_names)
    missing = [n for n in names if n not in graph_b1 or n not in graph_b2]
    if missing:
        raise ProfileError(f"op {missing[0]!r} is not in both graphs given to op_costs")
    types = tuple(device_types)
    model = model or CostModel()
    n = len(names)
    fixed = np.zeros((len(types), n))
    per_sample = np.zeros((len(types), n))
    source: dict[str, str] = {}
    modes: dict[str, dict[str, str]] = {}
    works: tuple[GraphWork, GraphWork] | None = None

    def gpu(dt: str) -> str | GpuType:
        return resolve(dt) if resolve is not None else dt

    def modelled(dt: str) -> tuple[np.ndarray, np.ndarray]:
        nonlocal works
        if works is None:   # computed once, only if some device type needs the model
            works = (graph_work_detail(graph_b1, names), graph_work_detail(graph_b2, names))
        return model_line(model, works[0], works[1], b1, b2, gpu(dt))

    if profile is None:
        profiles: tuple[OpProfile, ...] = ()
    elif hasattr(profile, "device_type"):         # one profile
        profiles = (cast("OpProfile", profile),)
    else:
        profiles = tuple(cast("Iterable[OpProfile]", profile))
    measured: dict[str, OpProfile] = {}
    for given in profiles:
        measured.setdefault(canonical_device_type(given.device_type), given)
    for d, dt in enumerate(types):
        prof = measured.get(canonical_device_type(dt))
        if prof is not None:
            index = prof.index()
            absorbed = prof.info.get("absorbed", {})
            rows = np.array([index.get(name, -1) for name in names], dtype=np.int64)
            have = rows >= 0
            fused = np.array([name in absorbed for name in names], dtype=bool) & ~have
            fixed[d, have] = prof.fixed[rows[have]]
            per_sample[d, have] = prof.per_sample[rows[have]]
            rest = ~have & ~fused
            if rest.any():
                f, p = modelled(dt)
                fixed[d, rest], per_sample[d, rest] = f[rest], p[rest]
                source[dt] = f"profile ({int(have.sum())} ops, {int(fused.sum())} fused) + model ({int(rest.sum())} ops)"
                modes[dt] = model.math_modes(gpu(dt))
            else:
                source[dt] = f"profile ({int(have.sum())} ops, {int(fused.sum())} fused)"
                modes[dt] = {"all": "measured"}
        else:
            fixed[d], per_sample[d] = modelled(dt)
            consts = model.constants_for(gpu(dt))
            kind = f"calibrated on {consts.device}" if consts.calibrated else "datasheet defaults"
            modes[dt] = model.math_modes(gpu(dt))
            mode = modes[dt].get("matmul", "fp32")
            source[dt] = f"model ({kind})" if mode == "fp32" else f"model ({kind}; matmul/conv in {mode})"
    return OpCosts(names, types, fixed, per_sample, source, modes)


__all__ = ["OpCosts", "op_costs", "model_line", "canonical_device_type"]
