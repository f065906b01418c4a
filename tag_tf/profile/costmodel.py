"""Analytical op-time model for device types we cannot measure: a roofline with per-class efficiencies.

    time(op, gpu) = overhead[class] + max(flops / (peak_flops * compute_eff[class]),
                                          bytes / (mem_bandwidth * mem_eff[class]))

overhead[class] is the kernel launch overhead: the GpuType's `launch_overhead_s` unless the constants
carry a calibrated one (one value, or one per class: a cuDNN convolution or a oneDNN primitive has a
larger fixed cost than an element-wise kernel). Ops of class "none" (Const, Reshape, Identity, variable
handles...: no device work) cost `host_overhead` only. `peak_flops`/`mem_bandwidth` come from the
datasheet `GpuType` (tag_tf.topology.gpus); efficiencies and overheads from `CostModelConstants`:

* `calibrate()` fits them to measured op times of one device type: per op class, a grid search over
  (overhead, compute efficiency, memory efficiency) minimising squared log errors weighted by
  sqrt(time) (pure log errors fit the many tiny ops and mispredict step totals, pure time weights fit
  totals but not op shapes), with a weak pull towards the prior so parameters the data cannot
  identify -- e.g. the compute efficiency of purely memory-bound ops -- keep their prior. The CPU
  profiles of this machine calibrate the "cpu" device; a GPU profile (when one is available)
  calibrates that GPU type the same way.
* Device types without calibrated constants use the constants calibrated on another GPU type when
  there are some (kernels of one software stack reach similar fractions of peak across NVIDIA
  generations), else `DEFAULT_GPU_CONSTANTS`: typical fractions of peak for FP32 cuBLAS/cuDNN and
  memory-bound kernels -- datasheet-based priors, not measurements.

On GPU types, matmuls and convolutions whose GEMM view is known (`GraphWork.kernels`) are costed by
the kernel model instead (profile/kernels.py: math modes -- TF32 by default from compute capability
8.0, `CostModel(tf32=False)` for a program that turns it off, FP16/BF16 tensor cores for half-precision
ops --, waves of tiles over the SMs, per-family efficiencies fitted on real H100 timings); calibrated
class efficiencies calibrated on a profile do not apply to it (they were fitted against the FP32
roofline).

Every term is non-decreasing in flops and bytes, and flops/bytes are non-decreasing in the batch
size, so predicted times are monotone in the batch size; for a fixed op and constants, a device with
more peak FLOP/s and bandwidth is never slower (H100 < V100 < T4 on a large matmul).
"""
from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from tag_tf.profile.flops import CLASS_INDEX, OP_CLASSES, KernelShapes, OpWork

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from tag_tf.ir.graph import Graph
    from tag_tf.profile.kernels import KernelTable
    from tag_tf.profile.op_profile import OpProfile
    from tag_tf.topology.gpus import GpuType

_NONE = CLASS_INDEX["none"]

# Priors (fractions of datasheet peak). FP32 GEMMs reach ~60-80% of peak on large shapes, cuDNN
# convolutions somewhat less; memory-bound kernels reach ~60-80% of peak bandwidth (STREAM-like).
_PRIOR_COMPUTE = {"matmul": 0.7, "conv": 0.55, "elementwise": 0.3, "reduction": 0.3, "data": 0.5,
                  "optimizer": 0.3, "none": 1.0}
_PRIOR_MEMORY = {"matmul": 0.7, "conv": 0.6, "elementwise": 0.75, "reduction": 0.6, "data": 0.6,
                 "optimizer": 0.75, "none": 1.0}


class CostModelConstantsDict(TypedDict):
    """`CostModelConstants.to_dict()` (JSON); `from_dict` needs the first three keys only."""

    device: str
    compute_eff: dict[str, float]
    mem_eff: dict[str, float]
    launch_overhead_s: NotRequired[float | None]
    host_overhead_s: NotRequired[float | None]
    class_overhead_s: NotRequired[dict[str, float]]
    calibrated: NotRequired[bool]
    fit: NotRequired[dict[str, object]]


# What `calibrate` fits to: the OpWork of each measured op, or (flops, bytes, classes) arrays.
Works = Sequence[OpWork] | tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class CostModelConstants:
    """Efficiency factors per op class and overheads for one device type (or the defaults).

    launch_overhead_s None: the GpuType's launch_overhead_s; class_overhead_s overrides it per class
    (calibrated constants); host_overhead_s None: a fifth of the launch overhead. `fit` holds
    calibration statistics (n, mape, log_corr, ...) when `calibrated`.
    """

    device: str
    compute_eff: Mapping[str, float]
    mem_eff: Mapping[str, float]
    launch_overhead_s: float | None = None
    host_overhead_s: float | None = None
    class_overhead_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    calibrated: bool = False
    fit: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for field in ("compute_eff", "mem_eff"):
            values = {str(k): float(v) for k, v in dict(getattr(self, field)).items()}
            missing = [c for c in OP_CLASSES if c not in values]
            if missing:
                raise ValueError(f"{field} lacks op classes {missing}")
            if any(not (v > 0 and math.isfinite(v)) for v in values.values()):
                raise ValueError(f"{field} must be positive and finite")
            object.__setattr__(self, field, types.MappingProxyType(values))
        overheads = {str(k): float(v) for k, v in dict(self.class_overhead_s).items()}
        unknown = [k for k in overheads if k not in CLASS_INDEX]
        if unknown or any(not (v >= 0 and math.isfinite(v)) for v in overheads.values()):
            raise ValueError(f"class_overhead_s must map op classes to non-negative seconds, got {overheads}")
        object.__setattr__(self, "class_overhead_s", types.MappingProxyType(overheads))
        object.__setattr__(self, "fit", types.MappingProxyType(dict(self.fit)))

    def compute_array(self) -> np.ndarray:
        return np.array([self.compute_eff[c] for c in OP_CLASSES])

    def memory_array(self) -> np.ndarray:
        return np.array([self.mem_eff[c] for c in OP_CLASSES])

    def overhead_array(self, launch: float, host: float) -> np.ndarray:
        """Per-class overhead (s); `launch`/`host` are the resolved defaults."""
        out = np.array([self.class_overhead_s.get(c, launch) for c in OP_CLASSES])
        out[CLASS_INDEX["none"]] = host
        return out

    def to_dict(self) -> CostModelConstantsDict:
        return {"device": self.device, "compute_eff": dict(self.compute_eff), "mem_eff": dict(self.mem_eff),
                "launch_overhead_s": self.launch_overhead_s, "host_overhead_s": self.host_overhead_s,
                "class_overhead_s": dict(self.class_overhead_s), "calibrated": self.calibrated,
                "fit": dict(self.fit)}

    @classmethod
    def from_dict(cls, d: CostModelConstantsDict) -> CostModelConstants:
        def opt(value: float | None) -> float | None:
            return None if value is None else float(value)

        return cls(device=str(d["device"]), compute_eff={k: float(v) for k, v in d["compute_eff"].items()},
                   mem_eff={k: float(v) for k, v in d["mem_eff"].items()},
                   launch_overhead_s=opt(d.get("launch_overhead_s")), host_overhead_s=opt(d.get("host_overhead_s")),
                   class_overhead_s={k: float(v) for k, v in dict(d.get("class_overhead_s") or {}).items()},
                   calibrated=bool(d.get("calibrated", False)), fit=dict(d.get("fit", {})))


DEFAULT_GPU_CONSTANTS = CostModelConstants(device="datasheet", compute_eff=_PRIOR_COMPUTE, mem_eff=_PRIOR_MEMORY)


def _resolve_gpu(gpu: GpuType | str) -> GpuType:
    if isinstance(gpu, str):
        from tag_tf.topology.gpus import gpu_type

        return gpu_type(gpu)
    return gpu


class CostModel:
    """Roofline op times for any GpuType; constants per device type (see the module docstring)."""

    def __init__(self, constants: CostModelConstants | Iterable[CostModelConstants] | None = None, *,
                 tf32: bool = True, kernel_table: KernelTable | None = None, kernel_model: bool = True):
        if constants is None:
            constants = ()
        elif isinstance(constants, CostModelConstants):
            constants = (constants,)
        self._by_device: dict[str, CostModelConstants] = {c.device: c for c in constants}
        self.tf32 = bool(tf32)
        self.kernel_table = kernel_table
        self.kernel_model = bool(kernel_model)    # False: the plain roofline everywhere (comparisons)

    def with_tf32(self, tf32: bool) -> CostModel:
        """The same model with TF32 on or off."""
        return CostModel(self.constants, tf32=tf32, kernel_table=self.kernel_table, kernel_model=self.kernel_model)

    def math_modes(self, gpu: GpuType | str) -> dict[str, str]:
        """The math mode each op class of a float32 graph is costed in on `gpu` (for JSON): "tf32"
        where the kernel model costs float32 matmuls and convolutions in TF32, "fp32" elsewhere."""
        from tag_tf.profile.kernels import class_modes

        g = _resolve_gpu(gpu)
        if not self.kernel_modelled(g):
            return {c: "fp32" for c in OP_CLASSES if c != "none"}
        return class_modes(g, self.tf32)

    @property
    def constants(self) -> tuple[CostModelConstants, ...]:
        return tuple(self._by_device.values())

    def constants_for(self, gpu: GpuType | str) -> CostModelConstants:
        """The device's own constants, else a calibrated GPU's, else the datasheet defaults."""
        name = _resolve_gpu(gpu).name
        if name in self._by_device:
            return self._by_device[name]
        if name != "cpu":
            gpu_sets = [c for c in self._by_device.values() if c.calibrated and c.device != "cpu"]
            if gpu_sets:
                return gpu_sets[0]
        return self._by_device.get("datasheet", DEFAULT_GPU_CONSTANTS)

    def overheads(self, gpu: GpuType | str) -> tuple[float, float]:
        """(launch overhead, host overhead) in seconds for this device type."""
        g = _resolve_gpu(gpu)
        c = self.constants_for(g)
        launch = g.launch_overhead_s if c.launch_overhead_s is None else c.launch_overhead_s
        host = launch / 5.0 if c.host_overhead_s is None else c.host_overhead_s
        return float(launch), float(host)

    def launch_times(self, classes: np.ndarray, gpu: GpuType | str) -> np.ndarray:
        """Each op's fixed per-kernel cost (s) on `gpu`: its class overhead (host overhead for "none")."""
        g = _resolve_gpu(gpu)
        launch, host = self.overheads(g)
        return self.constants_for(g).overhead_array(launch, host)[_class_indices(classes, np.shape(classes))]

    def kernel_modelled(self, gpu: GpuType | str) -> bool:
        """Whether matmuls and convolutions with a GEMM view may get the kernel model on `gpu` (GPU types)."""
        return self.kernel_model and _resolve_gpu(gpu).name != "cpu"

    def kernel_mask(self, kernels: KernelShapes | None, gpu: GpuType | str) -> np.ndarray | None:
        """Which ops the kernel model costs on `gpu` (None: none of them)."""
        if kernels is None or not self.kernel_modelled(gpu):
            return None
        from tag_tf.profile.kernels import covered

        return covered(kernels, _resolve_gpu(gpu), self.tf32)

    def op_time(self, work: OpWork, gpu: GpuType | str) -> float:
        """Predicted time (s) of one op on one device of type `gpu` (a GpuType or its name)."""
        return float(self.times(np.array([work.flops]), np.array([work.bytes]), gpu,
                                np.array([CLASS_INDEX[work.op_class]]))[0])

    def times(self, flops: np.ndarray, bytes: np.ndarray, gpu: GpuType | str,
              classes: np.ndarray | Sequence[str] | None = None, kernels: KernelShapes | None = None) -> np.ndarray:
        """Vectorised op times (s). `classes` are OP_CLASSES indices or names (default: element-wise;
        pass them -- `graph_work_detail(...).classes` -- for matmuls and convolutions), `kernels` the
        ops' GEMM views (`graph_work_detail(...).kernels`: on a GPU type, the kernel model costs them)."""
        g = _resolve_gpu(gpu)
        c = self.constants_for(g)
        launch, host = self.overheads(g)
        f = np.asarray(flops, dtype=np.float64)
        b = np.asarray(bytes, dtype=np.float64)
        cls = _class_indices(classes, f.shape)
        compute = f / (g.peak_flops * c.compute_array()[cls])
        memory = b / (g.mem_bandwidth * c.memory_array()[cls])
        t = c.overhead_array(launch, host)[cls] + np.maximum(compute, memory)
        t = np.where(cls == _NONE, host, t)
        if kernels is not None and self.kernel_modelled(g):
            from tag_tf.profile.kernels import kernel_times

            kt, mask = kernel_times(kernels, f, b, g, tf32=self.tf32, table=self.kernel_table)
            if mask.any():
                # Not scaled by calibrated class efficiencies: those were fitted against the FP32
                # roofline (an A100 profile's matmul efficiency already holds its TF32 gain); a
                # measured profile of the card gives its ops' times directly (costs.op_costs).
                t = np.where(mask, c.overhead_array(launch, host)[cls] + kt, t)
        return t


def _class_indices(classes: ArrayLike | None, shape: tuple[int, ...]) -> np.ndarray:
    if classes is None:
        return np.full(shape, CLASS_INDEX["elementwise"], dtype=np.int64)
    arr = np.asarray(classes)
    if arr.dtype.kind in ("U", "S", "O"):
        arr = np.array([CLASS_INDEX[str(c)] for c in arr.ravel()], dtype=np.int64).reshape(arr.shape)
    return arr.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------
def _works_arrays(works: Works) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flops, bytes, class index) from a sequence of OpWork or a (flops, bytes, classes) triple."""
    if isinstance(works, tuple) and len(works) == 3 and not isinstance(works[0], OpWork):
        f, b, c = works
        return np.asarray(f, float), np.asarray(b, float), _class_indices(c, np.shape(f))
    works = list(works)
    return (np.array([w.flops for w in works], dtype=float), np.array([w.bytes for w in works], dtype=float),
            np.array([CLASS_INDEX[w.op_class] for w in works], dtype=np.int64))


def fit_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Per-op fit quality: mean absolute percentage error, Pearson correlation of log times, and the
    relative error of the summed time."""
    p = np.asarray(predicted, float)
    m = np.asarray(measured, float)
    ok = (m > 0) & (p > 0)
    p, m = p[ok], m[ok]
    if p.size == 0:
        return {"n": 0}
    corr = float(np.corrcoef(np.log(p), np.log(m))[0, 1]) if p.size > 1 else float("nan")
    return {"n": int(p.size), "mape": float(np.mean(np.abs(p - m) / m)),
            "median_ape": float(np.median(np.abs(p - m) / m)), "log_corr": corr,
            "total_rel_err": float((p.sum() - m.sum()) / m.sum())}


def _fit_class(f: np.ndarray, b: np.ndarray, logt: np.ndarray, w: np.ndarray, peak: float, bw: float,
               grids: Sequence[np.ndarray], prior: tuple[float, float, float], reg: float
               ) -> tuple[float, float, float]:
    """Grid-search (overhead, compute eff, memory eff) of one op class: weighted squared log error
    plus `reg` * squared log distance to the prior (per parameter)."""
    g_l, g_c, g_m = grids
    comp = f[None, :] / (peak * g_c[:, None])                      # [C, n]
    mem = b[None, :] / (bw * g_m[:, None])                         # [M, n]
    roof = np.maximum(comp[:, None, :], mem[None, :, :])           # [C, M, n]
    pen_cm = reg * (((np.log(g_c) - math.log(prior[1])) ** 2)[:, None]
                    + ((np.log(g_m) - math.log(prior[2])) ** 2)[None, :])
    best = (math.inf, prior)
    for launch in g_l:
        err = (((np.log(launch + roof) - logt) ** 2) * w).sum(axis=-1)
        loss = err + pen_cm + reg * (math.log(launch) - math.log(prior[0])) ** 2
        i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
        if loss[i, j] < best[0]:
            best = (float(loss[i, j]), (float(launch), float(g_c[i]), float(g_m[j])))
    return best[1]


def _refine(values: Sequence[float], steps: Sequence[float], points: int = 9) -> tuple[np.ndarray, ...]:
    return tuple(v * np.geomspace(1 / s, s, points) for v, s in zip(values, steps))


_MAX_FIT_SAMPLES = 3000   # per class: a deterministic subsample keeps the grid search ~0.1 s per class


def calibrate(measured_times: Sequence[float] | np.ndarray, works: Works, device: GpuType | str, *,
              prior: CostModelConstants | None = None, reg: float = 0.2, weight_power: float = 0.5,
              eff_range: tuple[float, float] = (0.03, 3.0)) -> CostModelConstants:
    """Fit per-class overheads and efficiency factors of `device` (GpuType or name) to measured op
    times (s).

    `works` is a sequence of OpWork aligned with `measured_times` (or a (flops, bytes, classes)
    triple of arrays). Squared log errors weighted by time**weight_power (0: every op counts the
    same; 0.5, the default, balances per-op shape and step totals). `reg` pulls each parameter
    towards `prior` in log space, per sample (compare it with the mean squared log residual, ~0.3-0.5
    for CPU op times; 0 gives plain least squares), and efficiencies stay within `eff_range`: without
    these, overhead variations among the many small ops (thread-pool dispatch on a CPU) drive a
    class's efficiency to absurd values that then mispredict its large ops (settings chosen by
    leave-one-model-out tests on CPU profiles, see benchmarks/costmodel_calibrate.py).
    Non-positive/NaN times are dropped.
    """
    gpu = _resolve_gpu(device)
    prior = prior or DEFAULT_GPU_CONSTANTS
    f, b, cls = _works_arrays(works)
    t = np.asarray(measured_times, dtype=np.float64)
    if not (t.shape == f.shape == b.shape == cls.shape):
        raise ValueError("measured_times and works must be aligned")
    ok = np.isfinite(t) & (t > 0) & np.isfinite(f) & np.isfinite(b)
    f, b, cls, t = f[ok], b[ok], cls[ok], t[ok]
    if t.size < 3:
        raise ValueError("calibration needs at least 3 measured op times")

    prior_launch = prior.launch_overhead_s if prior.launch_overhead_s is not None else gpu.launch_overhead_s
    none = cls == _NONE
    host = float(np.exp(np.mean(np.log(t[none])))) if none.any() else None
    compute_eff = dict(prior.compute_eff)
    mem_eff = dict(prior.mem_eff)
    overheads: dict[str, float] = {}
    rng = np.random.default_rng(0)
    lo, hi = eff_range
    coarse = (np.geomspace(1e-8, 1e-2, 19), np.geomspace(lo, hi, 13), np.geomspace(lo, hi, 13))
    steps = tuple(float(g[1] / g[0]) for g in coarse)
    for c in np.unique(cls[~none]).tolist():
        name = OP_CLASSES[c]
        idx = np.flatnonzero(cls == c)
        if idx.size > _MAX_FIT_SAMPLES:
            idx = np.sort(rng.choice(idx, _MAX_FIT_SAMPLES, replace=False))
        w = t[idx] ** weight_power
        w = w / w.mean()
        p = (prior.class_overhead_s.get(name, prior_launch), prior.compute_eff[name], prior.mem_eff[name])
        args = (f[idx], b[idx], np.log(t[idx]), w, gpu.peak_flops, gpu.mem_bandwidth)
        # The prior's pull scales with the class's sample count, so it stays comparable to the data term.
        best = _fit_class(*args, coarse, p, reg * idx.size)
        # Zoom in: grids of +-one step around the best point; the step shrinks once the best point is
        # inside the grid (a best point on the grid's edge recentres it with the same step).
        step = steps
        for _ in range(10):
            fine = tuple(np.clip(g, lo_, hi_) for g, lo_, hi_ in zip(_refine(best, step), (1e-9, lo, lo), (1.0, hi, hi)))
            new = _fit_class(*args, fine, p, reg * idx.size)
            edge = any(v in (g[0], g[-1]) and not (v <= lo_ or v >= hi_)
                       for v, g, lo_, hi_ in zip(new, fine, (1e-9, lo, lo), (1.0, hi, hi)))
            best = new
            if not edge:
                step = tuple(s_ ** 0.5 for s_ in step)
                if max(step) < 1.02:
                    break
        overheads[name], compute_eff[name], mem_eff[name] = best
    counts = {OP_CLASSES[c]: int((cls == c).sum()) for c in np.unique(cls).tolist()}
    # The scalar launch overhead (used for classes absent from the data): the sample-weighted
    # geometric mean of the fitted class overheads.
    if overheads:
        logs = [math.log(v) * counts[k] for k, v in overheads.items()]
        launch = math.exp(sum(logs) / sum(counts[k] for k in overheads))
    else:
        launch = prior_launch
    constants = CostModelConstants(device=gpu.name, compute_eff=compute_eff, mem_eff=mem_eff,
                                   launch_overhead_s=launch, host_overhead_s=host, class_overhead_s=overheads,
                                   calibrated=True)
    pred = CostModel(constants).times(f, b, gpu, cls)
    stats: dict[str, object] = dict(fit_stats(pred, t))
    stats["classes"] = counts
    stats["weight_power"] = weight_power
    return dataclasses.replace(constants, fit=stats)


def calibration_samples(profile: OpProfile, graphs: Mapping[int, Graph]) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(measured times, (flops, bytes, classes)) of every profiled op at every profiled batch size.

    `graphs` maps each batch size of `profile` (an OpProfile) to the IR of the graph at that batch
    size. An op whose kernel absorbed others at run time (`profile.info["absorbed"]`: a Conv2D fused
    into its BiasAdd by oneDNN) is paired with the summed work of the group.
    """
    from tag_tf.profile.flops import graph_work_detail

    absorbed: Mapping[str, str] = profile.info.get("absorbed", {}) if hasattr(profile, "info") else {}
    index = profile.index()
    times, fl, by, cl = [], [], [], []
    for k, bs in enumerate(profile.batch_sizes):
        if bs not in graphs:
            continue
        g = graphs[bs]
        names = [n for n in profile.op_names if n in g]
        w = graph_work_detail(g, names)
        f = w.flops.copy()
        b = w.bytes.copy()
        pos = {n: i for i, n in enumerate(names)}
        for inner, outer in absorbed.items():
            if inner in g and outer in pos:
                iw = graph_work_detail(g, [inner])
                f[pos[outer]] += iw.flops[0]
                b[pos[outer]] += iw.bytes[0]
                # A fused conv+bias runs as a conv.
                if iw.classes[0] in (CLASS_INDEX["conv"], CLASS_INDEX["matmul"]):
                    w.classes[pos[outer]] = iw.classes[0]
        times.append(profile.times[[index[n] for n in names], k])
        fl.append(f)
        by.append(b)
        cl.append(w.classes.astype(np.int64))
    if not times:
        raise ValueError("no graph given for any profiled batch size")
    return np.concatenate(times), (np.concatenate(fl), np.concatenate(by), np.concatenate(cl))


def load_constants(source: str | Mapping[str, object]) -> tuple[CostModelConstants, ...]:
    """Constants from a JSON file or dict: {"constants": [...]} (costmodel.json) or one constants dict."""
    if isinstance(source, str):
        with open(source, encoding="utf-8") as fh:
            doc = json.load(fh)
    else:
        doc = source
    items = doc.get("constants", [doc]) if isinstance(doc, Mapping) else doc
    if isinstance(items, Mapping):
        items = list(items.values())
    return tuple(CostModelConstants.from_dict(d) for d in items)


__all__ = ["CostModel", "CostModelConstants", "DEFAULT_GPU_CONSTANTS", "calibrate", "calibration_samples",
           "fit_stats", "load_constants"]
