"""GPU kernel model for matmuls and convolutions: math modes, waves of tiles, per-family efficiency.

The plain roofline (costmodel.py) charges a matmul flops / (FP32 peak x one class efficiency). On a
real H100 that is 1.4x-3.9x off (../shared/gpu/h100_ops.json, measured 2026-11-26): TensorFlow runs
float32 matmuls and convolutions on TF32 tensor cores from compute capability 8.0 on (8x the FP32
rate), half-precision inputs on FP16/BF16 tensor cores, 3x3 convolutions beat FLOPs/peak (Winograd),
1x1 and strided ones do not, and small or thin products leave most of the chip idle. For every op whose
GEMM view flops.py knows (`KernelShapes`), on a GPU type:

    mode   = "half" for 2-byte outputs; "tf32" for float32 when the card has TF32 (capability >= 8.0)
             and the program has not turned it off; else "fp32"
    rate   = the type's datasheet rate of that mode (GpuType.rate)
    e      = eff[mode][family][forward|backward]       (per-family table, fitted; 3x3 conv > 1 in FP32)
             x waves(batch, m, n, k, SMs)              (tiles of 128x128 / 128x64 / 64x64 output
                                                        elements in FP32, 256x128 ... 128x64 on tensor
                                                        cores; split-K when tiles < SMs: the share
                                                        of the SMs' slots the busiest wave fills,
                                                        times the useful share of partial tiles)
             x k / (k + k0[mode])                      (a short reduction cannot hide the pipeline's
                                                        prologue and epilogue)
             x d / (d + n0[mode]), d = min(m, n)       (a thin output -- few channels -- reuses each
                                                        loaded operand less)
             x transposed[mode] for a forward matmul with a transposed operand
             x winograd[mode][forward|backward] for a 3x3 stride-1 convolution cuDNN can run as
               Winograd. FP32 forward: >= 128 input channels, an output of >= 14x14, an input of
               <= 256 MiB (its transformed copies must fit the workspace frameworks allow); FP32
               backward: >= 128 channels and >= 28x28, whatever the input's size (the H100 timings:
               the gradients of 14x14 and 7x7 convolutions ran at 42-52 TFLOP/s, under the FP32
               peak, those of 28x28 and larger at 75-132, over it). Winograd F(4x4,3x3) does a
               quarter of the multiplies on CUDA cores, so in FP32 it beats FLOPs/peak (the fit: ~2x);
               the tensor-core modes have no Winograd, and the factor the fit finds there (1.2-1.7x)
               stands for what makes every wide (>= 128 channels) 3x3 convolution faster than thin
               ones, whatever its size.
    t      = launch + ramp[mode] + (compute^p + memory^p)^(1/p) + epilogue + convert
             compute = flops / (rate e);  launch: the GpuType's (or calibrated) per-kernel overhead,
             as for every other op; ramp: filling and draining the SMs, per kernel;
             convolutions: memory = bytes / (HBM bw mem_eff), epilogue 0,
                           convert = convert[mode] x bytes / HBM bw;
             matmuls:      memory = operand bytes / (HBM bw mem_eff), p = p_mm[mode],
                           epilogue = output bytes / (HBM bw mem_eff), convert 0

p blends the roofline's max (p large) into a sum (p = 1): near the ridge point tensor-core kernels
overlap loads and math poorly. A matmul writes each output tile after its reduction, so the output's
write adds to the time instead of overlapping it (the transformer's 30720 x 40000 logits: a 4.9 GB
output, 1.5 ms of writing beside 3 ms of TF32 math, measured 4.9 ms). `convert` is the layout
conversion cuDNN's tensor-core convolutions run as separate passes over their tensors (their kernels
want channels-last tiles; a channels-first tensor is transposed in and out): it dominates thin, wide
convolutions (64 channels at 224x224: the tensors are large, the math small). The fit gives it to
FP32 too (there it stands for whatever else makes those thin convolutions slow: the table is a fit,
the terms' names say what they were meant for). The table (`data/gpu_kernels.json`) is fitted per
math mode by
`benchmarks/costmodel_gpu.py --fit` on the shared H100 single-op timings (forward, and forward plus
the gradients), and judged there leave-one-op-out; its efficiencies are fractions of each card's own
datasheet rate, so the same table serves every GPU type (other generations reach similar fractions
with the same cuBLAS/cuDNN kernels -- an assumption until a card of another generation is measured:
`benchmarks/gpu_ops.py` measures one).

Single-op timings carry a cost no kernel has: the framework's dispatch between the timing events
(PyTorch's eager call, ~40 us; its autograd engine's backward pass, ~200-300 us). The CPU dispatches
while the GPU runs what it was given, so a timing reads about the larger of the two, not their sum
(`timed`: (kernels^q + dispatch^q)^(1/q), q fitted per mode; q = 16, a plain max, in TF32, where
small products take less GPU time than their dispatch: BERT-Large's 2048x1024x1024 matmul with its
gradients timed 0.37 ms with TF32 on and off alike). The fit estimates the dispatch as `harness_s` (per
forward call, per backward pass; batched matmuls more) and `harness_q` so that they do not leak into
the kernels' efficiencies, and the benchmark applies them when it compares with those timings. A
training step does not pay them per kernel (TensorFlow's executor runs ahead of the GPU; its own
per-op dispatch is the calibrations' `op_overhead_s`), so `kernel_times` leaves them out.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from tag_tf.profile.flops import KERNEL_FAMILIES, OP_CLASSES, KernelShapes

if TYPE_CHECKING:
    from tag_tf.topology.gpus import GpuType

MODES: tuple[str, ...] = ("fp32", "tf32", "half")
FAMILIES: tuple[str, ...] = KERNEL_FAMILIES[1:]
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpu_kernels.json")
FORMAT = "tag_tf.gpu_kernels/1"
# Output tiles cuBLAS/cuDNN choose among (rows, cols, relative per-tile efficiency: smaller tiles
# reuse operands less): FP32 SIMT kernels tile 128x128 and smaller; tensor-core kernels need larger
# tiles (256x128 on Ampere/Hopper) to feed their math, so small products fill fewer SMs.
_TILES = {"fp32": ((128, 128, 1.0), (128, 64, 0.95), (64, 64, 0.85)),
          "tensor": ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.85), (128, 64, 0.7))}
_SPLIT_K_MIN = 256     # split-K keeps at least this much of the reduction per split
_WINOGRAD_MIN_CHANNELS = 128
_WINOGRAD_MIN_SPATIAL = 14 * 14
_WINOGRAD_MAX_INPUT = 256 * 2**20
_WINOGRAD_MIN_SPATIAL_BACKWARD = 28 * 28


class ModeParamsDict(TypedDict):
    """`ModeParams.to_dict()` (JSON); `from_dict` defaults the keys not required."""

    eff: dict[str, list[float]]
    harness_s: list[float]
    harness_bmm_s: float
    mem_eff: float
    k0: float
    p: float
    transposed: float
    n0: NotRequired[float]
    winograd: NotRequired[list[float]]
    convert: NotRequired[float]
    p_mm: NotRequired[float]
    harness_q: NotRequired[float]
    ramp_s: NotRequired[float]


class KernelTableDict(TypedDict):
    """`KernelTable.to_dict()`: the layout of data/gpu_kernels.json."""

    format: str
    source: NotRequired[dict[str, object]]
    modes: dict[str, ModeParamsDict]


@dataclasses.dataclass(frozen=True)
class ModeParams:
    """One math mode's kernel parameters (see the module docstring)."""

    eff: Mapping[str, tuple[float, float]]    # family -> (forward, backward) efficiency
    harness_s: tuple[float, float]            # single-op timing's dispatch: per forward call, per backward pass
    harness_bmm_s: float                      # ... and what a batched matmul adds to each
    mem_eff: float
    k0: float
    p: float
    transposed: float
    n0: float = 0.0
    winograd: tuple[float, float] = (1.0, 1.0)
    convert: float = 0.0
    p_mm: float = 0.0                         # matmuls' roofline blend (0: the same p as convolutions)
    harness_q: float = 1.0                    # how single-op timing's dispatch meets the kernels (`timed`)
    ramp_s: float = 0.0                       # per kernel: filling and draining the SMs (beyond the launch)

    def __post_init__(self) -> None:
        missing = [f for f in FAMILIES if f not in self.eff]
        if missing:
            raise ValueError(f"kernel table lacks families {missing}")
        eff = {str(k): (float(v[0]), float(v[1])) for k, v in dict(self.eff).items()}
        values = [x for pair in eff.values() for x in pair] + [self.mem_eff, self.transposed, *self.winograd]
        if (any(not (v > 0 and math.isfinite(v)) for v in values) or not self.p >= 1
                or not (self.p_mm == 0 or self.p_mm >= 1) or not self.harness_q >= 1
                or not min(self.k0, self.n0, self.convert, self.ramp_s) >= 0):
            raise ValueError("kernel efficiencies must be positive and finite, p, p_mm and harness_q >= 1, "
                             "k0 and n0 >= 0")
        object.__setattr__(self, "winograd", (float(self.winograd[0]), float(self.winograd[1])))
        object.__setattr__(self, "eff", MappingProxyType(eff))
        object.__setattr__(self, "harness_s", (float(self.harness_s[0]), float(self.harness_s[1])))

    def to_dict(self) -> ModeParamsDict:
        return {"eff": {k: list(v) for k, v in self.eff.items()}, "harness_s": list(self.harness_s),
                "harness_bmm_s": self.harness_bmm_s, "mem_eff": self.mem_eff, "k0": self.k0, "p": self.p,
                "transposed": self.transposed, "n0": self.n0, "winograd": list(self.winograd), "convert": self.convert,
                "p_mm": self.p_mm, "harness_q": self.harness_q, "ramp_s": self.ramp_s}

    @classmethod
    def from_dict(cls, d: ModeParamsDict) -> ModeParams:
        return cls(eff={k: (float(v[0]), float(v[1])) for k, v in d["eff"].items()},
                   harness_s=(float(d["harness_s"][0]), float(d["harness_s"][1])),
                   harness_bmm_s=float(d["harness_bmm_s"]), mem_eff=float(d["mem_eff"]), k0=float(d["k0"]),
                   p=float(d["p"]), transposed=float(d["transposed"]), n0=float(d.get("n0", 0.0)),
                   winograd=tuple(d.get("winograd", (1.0, 1.0))),  # type: ignore[arg-type]
                   convert=float(d.get("convert", 0.0)), p_mm=float(d.get("p_mm", 0.0)),
                   harness_q=float(d.get("harness_q", 1.0)), ramp_s=float(d.get("ramp_s", 0.0)))


@dataclasses.dataclass(frozen=True)
class KernelTable:
    """Per-mode kernel parameters and where they come from."""

    modes: Mapping[str, ModeParams]
    source: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [m for m in MODES if m not in self.modes]
        if missing:
            raise ValueError(f"kernel table lacks math modes {missing}")
        object.__setattr__(self, "modes", MappingProxyType(dict(self.modes)))
        object.__setattr__(self, "source", MappingProxyType(dict(self.source)))

    def to_dict(self) -> KernelTableDict:
        return {"format": FORMAT, "source": dict(self.source),
                "modes": {m: p.to_dict() for m, p in self.modes.items()}}

    @classmethod
    def from_dict(cls, d: KernelTableDict) -> KernelTable:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} table (format {d.get('format')!r})")
        return cls({m: ModeParams.from_dict(p) for m, p in d["modes"].items()}, dict(d.get("source", {})))


_TABLE: KernelTable | None = None


def default_table() -> KernelTable:
    """The shipped table (data/gpu_kernels.json), read once."""
    global _TABLE
    if _TABLE is None:
        with open(TABLE_PATH, encoding="utf-8") as fh:
            _TABLE = KernelTable.from_dict(json.load(fh))
    return _TABLE


def table_digest() -> str:
    """12 hex digits of the shipped table's content (plan cache keys: a re-fitted table is other physics)."""
    import hashlib

    return hashlib.sha256(json.dumps(default_table().to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def math_mode(gpu: GpuType, itemsize: int, tf32: bool = True) -> str:
    """The math mode a matmul/convolution with `itemsize`-byte elements runs in on `gpu`."""
    if itemsize == 2:
        return "half"
    if tf32 and gpu.tf32_flops > 0:
        return "tf32"
    return "fp32"


def class_modes(gpu: GpuType, tf32: bool = True) -> dict[str, str]:
    """What `simulate`/`plan` JSON report: the mode each op class of a float32 graph is costed in
    (half-precision matmuls and convolutions: "half")."""
    mode = math_mode(gpu, 4, tf32)
    return {c: mode if c in ("matmul", "conv") else "fp32" for c in OP_CLASSES if c != "none"}


def timed(kernels_s: np.ndarray, dispatch_s: np.ndarray | float, q: float) -> np.ndarray:
    """What single-op timing reads for one phase (a forward call, or a backward pass) whose kernels take
    `kernels_s` on the GPU and whose framework dispatch takes `dispatch_s` on the CPU: the two overlap
    (the CPU queues kernels while earlier ones run), so the timing is near the larger of them once one
    dominates, and near their sum only where each waits on the other. q = 1: their sum; q large: the
    larger one."""
    k = np.asarray(kernels_s, float)
    h = np.asarray(dispatch_s, float)
    return (k ** q + h ** q) ** (1.0 / q)


def untimed(measured_s: np.ndarray | float, dispatch_s: np.ndarray | float, q: float) -> np.ndarray:
    """`timed`'s inverse: the kernel time a timing implies, NaN where the timing is no longer than the
    dispatch (dispatch-bound: it says only that the kernels took at most that long)."""
    m = np.asarray(measured_s, float)
    h = np.asarray(dispatch_s, float)
    rest = m ** q - h ** q
    return np.where(rest > 0, np.maximum(rest, 0.0) ** (1.0 / q), np.nan)


def waves(batch: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, sm_count: int, mode: str = "fp32"
          ) -> np.ndarray:
    """Share of the GPU a GEMM keeps busy: the best of the tile shapes, each scored by the fill of its
    waves over `sm_count` SMs (split-K over the reduction when there are fewer tiles than SMs) times
    the useful share of its partial tiles (at least a quarter: thin operands get narrower kernels).
    With sm_count 0 (an unknown card) only the partial-tile term counts."""
    b = np.maximum(np.asarray(batch, float), 1.0)
    m = np.maximum(np.asarray(m, float), 1.0)
    n = np.maximum(np.asarray(n, float), 1.0)
    k = np.maximum(np.asarray(k, float), 1.0)
    best = np.zeros(np.broadcast(b, m, n, k).shape)
    for tm, tn, per_tile in _TILES["fp32" if mode == "fp32" else "tensor"]:
        rows, cols = np.ceil(m / tm), np.ceil(n / tn)
        pad = np.maximum(m * n / (rows * tm * cols * tn), 0.25)
        if sm_count > 0:
            tiles = b * rows * cols
            split = np.where(tiles < sm_count, np.maximum(1.0, np.minimum(np.floor(sm_count / tiles),
                                                                          np.floor(k / _SPLIT_K_MIN))), 1.0)
            work = tiles * split
            fill = work / (np.ceil(work / sm_count) * sm_count)
        else:
            fill = 1.0
        best = np.maximum(best, fill * pad * per_tile)
    return best


def winograd_eligible(kernels: KernelShapes, mode: str = "fp32") -> np.ndarray:
    """Convolutions that get the `winograd` factor (see the module docstring): in FP32 those cuDNN can
    run as Winograd; in the tensor-core modes (no Winograd there) every wide 3x3 stride-1 convolution."""
    fam = np.asarray(kernels.family, dtype=np.int64)
    wide = (fam == KERNEL_FAMILIES.index("conv3x3")) & (kernels.channels >= _WINOGRAD_MIN_CHANNELS)
    if mode != "fp32":
        return wide
    rows = np.maximum(kernels.m, kernels.k)          # N*H*W: the input's pixels, whatever the direction
    input_bytes = rows * kernels.channels * kernels.itemsize
    forward = (kernels.spatial >= _WINOGRAD_MIN_SPATIAL) & (input_bytes <= _WINOGRAD_MAX_INPUT)
    backward = kernels.spatial >= _WINOGRAD_MIN_SPATIAL_BACKWARD
    return wide & np.where(np.asarray(kernels.backward, bool), backward, forward)


def covered(kernels: KernelShapes, gpu: GpuType, tf32: bool = True) -> np.ndarray:
    """The ops the kernel model costs on `gpu`: those with a GEMM view, except FP32 ops on cards
    before Ampere (compute capability < 8.0, or unknown). The table comes from Hopper's cuBLAS and
    cuDNN; refitted with it, the testbed calibration (V100, P100, GTX 1080 Ti in FP32 under the
    paper's TensorFlow 1) fitted the paper's measured steps worse than with the plain roofline
    (MAPE 13.6% fitted, 17.7% held out, against 11.2% and 18.2% re-fitted on the same code without the
    kernel model, and 11.4% and 11.4% for the shipped calibration), so FP32 on those cards keeps the
    roofline. Half-precision ops use the model on cards with tensor cores (V100, T4 and later); other
    dtypes (float64, integers) and empty products keep the roofline everywhere."""
    fam = np.asarray(kernels.family, dtype=np.int64)
    size = np.asarray(kernels.itemsize, dtype=np.int64)
    # float32 and half-precision floats only (flops.py gives other dtypes itemsize 0), and no empty
    # products (0/0 below)
    ok = (fam > 0) & np.isin(size, (2, 4)) & (kernels.m > 0) & (kernels.n > 0) & (kernels.k > 0)
    tensor_cores = gpu.half_flops > 0 and gpu.capability >= 7.0
    half = ok & (size == 2) & tensor_cores       # P100, GTX 1080 Ti: no tensor cores, the roofline
    if gpu.capability >= 8.0:
        return (ok & (size == 4)) | half
    return half


def kernel_times(kernels: KernelShapes, flops: np.ndarray, nbytes: np.ndarray, gpu: GpuType, *,
                 tf32: bool = True, table: KernelTable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, mask): modelled kernel times of the ops the model covers (mask True, see `covered`;
    without the launch overhead, which the caller adds), NaN elsewhere."""
    table = table or default_table()
    fam = np.asarray(kernels.family, dtype=np.int64)
    mask = covered(kernels, gpu, tf32)
    out = np.full(fam.shape, np.nan)
    if not mask.any():
        return out, mask
    f = np.asarray(flops, float)
    b = np.asarray(nbytes, float)
    size = np.asarray(kernels.itemsize, dtype=np.int64)
    float32_mode = math_mode(gpu, 4, tf32)
    for mode in MODES:
        sel = mask & ((size == 2) if mode == "half" else (size != 2) & (mode == float32_mode))
        if not sel.any():
            continue
        p = table.modes[mode]
        back = kernels.backward[sel].astype(np.int64)
        fams = fam[sel]
        # family x direction efficiencies as one array (row 0: not a kernel, never selected)
        table_eff = np.array([(1.0, 1.0)] + [p.eff[f] for f in KERNEL_FAMILIES[1:]])
        eff = table_eff[fams, back]
        k = kernels.k[sel]
        e = eff * waves(kernels.batch[sel], kernels.m[sel], kernels.n[sel], k, gpu.sm_count, mode) * k / (k + p.k0)
        forward_mm = (fams == KERNEL_FAMILIES.index("mm")) & (back == 0) & kernels.transposed[sel]
        e = np.where(forward_mm, e * p.transposed, e)
        if p.n0 > 0:
            d = np.minimum(kernels.m[sel], kernels.n[sel])
            e = e * d / (d + p.n0)
        wino = winograd_eligible(kernels, mode)[sel]
        e = np.where(wino, e * np.where(back == 1, p.winograd[1], p.winograd[0]), e)
        compute = f[sel] / (gpu.rate(mode) * e)
        convs = fams >= KERNEL_FAMILIES.index("conv3x3")
        # a matmul's epilogue writes its output tiles after their reduction: not overlapped with the
        # math, it adds; its operand loads overlap the math (the blend p_mm)
        epilogue = np.where(convs, 0.0, np.minimum(kernels.batch[sel] * kernels.m[sel] * kernels.n[sel]
                                                    * size[sel], b[sel]))
        memory = (b[sel] - epilogue) / (gpu.mem_bandwidth * p.mem_eff)
        convert = np.where(convs, p.convert * b[sel] / gpu.mem_bandwidth, 0.0)
        blend = np.where(convs, p.p, p.p_mm or p.p)
        out[sel] = ((compute ** blend + memory ** blend) ** (1.0 / blend) + convert + p.ramp_s
                    + epilogue / (gpu.mem_bandwidth * p.mem_eff))
    return out, mask


__all__ = ["MODES", "FAMILIES", "KernelTable", "ModeParams", "default_table", "math_mode", "class_modes", "waves",
           "winograd_eligible", "covered", "kernel_times", "table_digest", "TABLE_PATH", "timed", "untimed"]
