"""Calibration: named physical parameters that make a simulated cluster behave like a measured one.

The datasheet simulator (cost model priors, nominal link rates) predicts the paper's testbed 1.5x-8.6x
too fast. A `Calibration` corrects it with a handful of physical quantities, never per model:

    compute_eff:<GPU type>   achieved fraction of the cost model's per-class efficiencies
    op_overhead_s            host time TensorFlow's executor spends dispatching each op on a GPU
    inter_bw_eff             fraction of the nominal inter-machine rate a transfer reaches
    inter_latency_s          fixed cost of one inter-machine message or ring step
    intra_bw_eff             fraction of the nominal intra-machine (NVLink/PCIe) rate reached

Each parameter has a unit, a plausible range and the reason for it (`PARAMETERS`); a calibration
file records every value's provenance (datasheet, fitted, measured) and the fit's residuals.
`apply` rewrites the arrays the native simulator reads (`sim/prepare.py`); CPU devices (this
machine's virtual devices, profiled for real) are never touched.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tag_tf.errors import TagError

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.sim.prepare import Prepared
    from tag_tf.topology.spec import Topology

FORMAT = "tag_tf.calibration/1"


@dataclasses.dataclass(frozen=True)
class Parameter:
    name: str
    unit: str
    nominal: float            # the datasheet simulator's value: a calibration with all nominals changes nothing
    low: float
    high: float
    why: str                  # why this range


PARAMETERS: Mapping[str, Parameter] = {p.name: p for p in (
    Parameter("compute_eff", "fraction", 1.0, 0.05, 1.4,
              "TF1 kernels reach a fraction of the cost model's cuBLAS/cuDNN priors (no op fusion, "
              "default algorithms, NCHW/NHWC transposes); below 5% a GPU would be slower than a CPU core, "
              "above 1.4x the priors (55-75% of peak) a kernel would exceed the datasheet peak"),
    Parameter("op_overhead_s", "s/op", 0.0, 0.0, 300e-6,
              "TensorFlow's executor dispatches every op from the host: 5-50 us each on GPU (kernel "
              "launch, allocator, inter-op threads); 300 us is a badly oversubscribed host"),
    Parameter("inter_bw_eff", "fraction", 1.0, 0.02, 1.0,
              "gRPC over TCP (TF's transport across machines) copies and serialises every tensor: "
              "measured rates are a few % to ~60% of line rate; it cannot beat the NIC"),
    Parameter("inter_latency_s", "s", 25e-6, 5e-6, 5e-3,
              "one inter-machine message or ring step: ~25 us on a switch for RDMA, 0.1-1 ms for gRPC "
              "round trips with TF's rendezvous"),
    Parameter("intra_bw_eff", "fraction", 1.0, 0.1, 1.0,
              "NCCL over NVLink/PCIe reaches 50-90% of the link's nominal rate; host staging less"),
)}


# What every calibration file must give (compute_eff:* covers GPU types without their own value).
REQUIRED = ("compute_eff:*", "op_overhead_s", "inter_bw_eff", "inter_latency_s", "intra_bw_eff")


def parameter_of(name: str) -> Parameter:
    """The spec of `name` (`compute_eff:<GPU type>` is a `compute_eff`)."""
    spec = PARAMETERS.get(name.partition(":")[0])
    if spec is None or (spec.name == "compute_eff") != (":" in name):
        known = ", ".join(["compute_eff:<GPU type>"] + [p for p in PARAMETERS if p != "compute_eff"])
        raise TagError(f"unknown calibration parameter {name!r} (known: {known})")
    return spec


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Parameter values by name; `provenance[name]` says where each came from. GPU types without a
    `compute_eff:<type>` use `compute_eff:*` (derived for types outside the fit), else nominal."""

    name: str
    values: Mapping[str, float]
    provenance: Mapping[str, str] = dataclasses.field(default_factory=dict)
    fit: Mapping[str, Any] = dataclasses.field(default_factory=dict)   # residuals, errors, inputs

    def __post_init__(self) -> None:
        for key, value in self.values.items():
            spec = parameter_of(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TagError(f"calibration {self.name!r}: parameter {key!r} must be a finite number, got {value!r}")
            if not spec.low <= value <= spec.high:
                raise TagError(f"calibration {self.name!r}: parameter {key!r} = {value:g} {spec.unit} is outside "
                               f"its plausible range [{spec.low:g}, {spec.high:g}] ({spec.why})")

    # -- values --------------------------------------------------------------------------------
    def value(self, name: str) -> float:
        if name in self.values:
            return float(self.values[name])
        if name.startswith("compute_eff:") and "compute_eff:*" in self.values:
            return float(self.values["compute_eff:*"])
        return parameter_of(name).nominal

    def describe(self) -> dict[str, object]:
        """What `simulate`/`plan` JSON name as the calibration in use."""
        return {"name": self.name, "values": dict(self.values)}

    # -- the simulator's arrays ------------------------------------------------------------------
    def apply(self, prepared: Prepared, members: np.ndarray, topology: Topology) -> Prepared:
        """A copy of `prepared` (see sim/prepare.py) with this calibration's physics; `members`:
        `member_counts` of the analysis (computed once per simulator, not per calibration)."""
        n = int(prepared.num_ops)
        types = list(prepared.device_types)
        fixed = np.array(prepared.op_fixed, dtype=np.float64).reshape(len(types), n)
        per_sample = np.array(prepared.op_per_sample, dtype=np.float64).reshape(len(types), n)
        overhead = self.value("op_overhead_s")
        for t, gpu in enumerate(types):
            if gpu == "cpu":
                continue
            scale = self.value(f"compute_eff:{gpu}")
            fixed[t] = fixed[t] / scale + overhead * members
            per_sample[t] = per_sample[t] / scale
        devices = topology.devices
        D = len(devices)
        bw = np.array(prepared.link_bw, dtype=np.float64).reshape(D, D)
        lat = np.array(prepared.link_lat, dtype=np.float64).reshape(D, D)
        machine = np.array([d.machine for d in devices])
        gpu_dev = np.array([d.type != "cpu" for d in devices])
        pair = gpu_dev[:, None] & gpu_dev[None, :] & ~np.eye(D, dtype=bool)
        inter = pair & (machine[:, None] != machine[None, :])
        intra = pair & (machine[:, None] == machine[None, :])
        bw[inter] *= self.value("inter_bw_eff")
        bw[intra] *= self.value("intra_bw_eff")
        if "inter_latency_s" in self.values and not self.provenance.get("inter_latency_s", "").startswith("datasheet"):
            # An absolute figure: only a fitted or measured one replaces the topology's own.
            lat[inter] = self.value("inter_latency_s")
        return dataclasses.replace(prepared, op_fixed=np.ascontiguousarray(fixed.reshape(-1)),
                                   op_per_sample=np.ascontiguousarray(per_sample.reshape(-1)),
                                   link_bw=np.ascontiguousarray(bw.reshape(-1)),
                                   link_lat=np.ascontiguousarray(lat.reshape(-1)))

    # -- files -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        return {"format": FORMAT, "name": self.name, "values": dict(self.values),
                "provenance": dict(self.provenance), "parameters": {
                    k: dataclasses.asdict(parameter_of(k)) for k in self.values}, "fit": dict(self.fit)}

    def save(self, path: str) -> None:
        """Written whole or not at all (temp file, then rename)."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)

    @staticmethod
    def from_dict(data: object, where: str = "calibration") -> Calibration:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise TagError(f"{where}: not a tag_tf calibration (field 'format' must be {FORMAT!r})")
        values = data.get("values")
        if not isinstance(values, Mapping) or not values:
            raise TagError(f"{where}: field 'values' must map parameter names to numbers")
        # A file states all of its physics: a parameter left out would silently stay at its
        # datasheet value, which is exactly what a calibration exists to replace.
        missing = [k for k in REQUIRED if k not in values]
        if missing:
            raise TagError(f"{where}: parameter {missing[0]!r} is missing from 'values' (a calibration file "
                           f"gives every parameter: {', '.join(REQUIRED)}, and compute_eff:<GPU type> as needed)")
        try:
            return Calibration(str(data.get("name") or where), {str(k): v for k, v in values.items()},
                               dict(data.get("provenance") or {}), dict(data.get("fit") or {}))
        except TagError as e:
            raise TagError(f"{where}: {e}") from None

    @staticmethod
    def load(path: str) -> Calibration:
        from tag_tf.datafiles import CALIBRATION_FILE_LIMIT, read_text

        if not os.path.exists(path):
            raise TagError(f"no such calibration file: {path}")
        try:
            data = json.loads(read_text(path, "a calibration file", CALIBRATION_FILE_LIMIT, TagError))
        except json.JSONDecodeError as e:
            raise TagError(f"{path}: not JSON ({e})") from None
        return Calibration.from_dict(data, path)


def member_counts(analysis: Analysis) -> np.ndarray:
    """Ops TensorFlow dispatches per planned op (the op and everything folded into it)."""
    index = {name: i for i, name in enumerate(analysis.planning.ops)}
    counts = np.zeros(len(index))
    for host in analysis.planning.host.values():
        counts[index[host]] += 1
    return counts


# What a simulator is told to simulate with (see `resolve`).
CalibrationChoice = Calibration | str | os.PathLike[str] | None

# Presets whose default simulation uses a shipped calibration (the `-nominal` presets do not).
_SHIPPED = {"testbed": "calibration_testbed.json", "cloud": "calibration_cloud.json"}


def shipped_path(preset: str) -> str | None:
    name = _SHIPPED.get(preset)
    return None if name is None else os.path.join(os.path.dirname(os.path.dirname(__file__)), "profile", "data", name)


def default_calibration(topology: Topology) -> Calibration | None:
    """The calibration a preset simulates with by default: `testbed`/`cloud` use the shipped fit
    (when it exists), everything else (files, `-nominal` presets, local CPUs) the datasheet."""
    path = shipped_path(getattr(topology, "name", ""))
    if path is None or not os.path.exists(path):
        return None
    return Calibration.load(path)


def resolve(calibration: CalibrationChoice, topology: Topology) -> Calibration | None:
    """`calibration`: "default" (per preset), None/"nominal" (datasheet), a path, or a Calibration."""
    if isinstance(calibration, Calibration):
        return calibration
    if calibration is None or calibration == "nominal":
        return None
    if calibration == "default":
        return default_calibration(topology)
    return Calibration.load(os.fspath(calibration))


__all__ = ["Calibration", "PARAMETERS", "REQUIRED", "Parameter", "default_calibration", "member_counts", "parameter_of",
           "resolve", "shipped_path"]
