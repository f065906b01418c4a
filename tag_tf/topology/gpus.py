"""GPU types: the per-device numbers the cost model starts from.

Every number below is a vendor datasheet figure (cited next to it), not a measurement:
``peak_flops`` is dense FP32 FLOP/s (no tensor cores, no sparsity), ``mem_bandwidth`` is the peak
device-memory bandwidth in bytes/s, ``memory_bytes`` is the on-board memory (the marketed "32GB" of a
GPU is 32 GiB, so we store GiB). ``launch_overhead_s`` is not a datasheet figure: it is the usual
host-side cost of launching one kernel through TensorFlow's executor (a few microseconds), a starting
point the cost model replaces with profiled values.

Aliases (case-insensitive; spaces, '-', '_' and vendor words such as "nvidia", "tesla", "geforce" are
ignored): "v100" means V100-32GB (the paper's testbed card); "v100-16" / "v100-16gb" the cloud card;
"1080ti" / "gtx1080ti" GTX1080Ti; "a100" A100-40GB; "a100-80" A100-80GB; "h100" the H100 SXM5.
"""
from __future__ import annotations

import dataclasses
import re
from types import MappingProxyType
from typing import Mapping

from tag_tf.errors import TopologyError

GiB = 1 << 30
T = 1e12
GBs = 1e9  # datasheets quote memory bandwidth in decimal GB/s


@dataclasses.dataclass(frozen=True)
class GpuType:
    name: str
    peak_flops: float          # dense FP32 FLOP/s
    mem_bandwidth: float       # device memory, bytes/s
    memory_bytes: int          # on-board memory, bytes
    launch_overhead_s: float   # per-kernel launch cost, seconds (placeholder, calibrated later)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "GpuType":
        return cls(name=str(d["name"]), peak_flops=float(d["peak_flops"]),
                   mem_bandwidth=float(d["mem_bandwidth"]), memory_bytes=int(d["memory_bytes"]),
                   launch_overhead_s=float(d["launch_overhead_s"]))


_LAUNCH = 5e-6  # typical TF GPU kernel launch cost; calibrated by the op profiler

_TYPES = (
    # Tesla V100 SXM2 32GB datasheet: 15.7 TFLOPS FP32, 900 GB/s HBM2, 32 GB.
    GpuType("V100-32GB", 15.7 * T, 900 * GBs, 32 * GiB, _LAUNCH),
    # Tesla V100 SXM2 16GB (AWS p3.16xlarge): same chip and clocks, 16 GB HBM2.
    GpuType("V100-16GB", 15.7 * T, 900 * GBs, 16 * GiB, _LAUNCH),
    # Tesla P100 for PCIe, 16GB datasheet: 9.3 TFLOPS FP32, 732 GB/s HBM2, 16 GB.
    # (The paper's P100 machines use PCIe inside, so the PCIe card, not the 10.6 TFLOPS SXM2 one.)
    GpuType("P100", 9.3 * T, 732 * GBs, 16 * GiB, _LAUNCH),
    # GeForce GTX 1080 Ti spec sheet: 3584 CUDA cores x 1582 MHz boost x 2 = 11.34 TFLOPS FP32,
    # 484 GB/s GDDR5X (11 Gbps x 352-bit), 11 GB.
    GpuType("GTX1080Ti", 11.34 * T, 484 * GBs, 11 * GiB, _LAUNCH),
    # Tesla T4 datasheet: 8.1 TFLOPS FP32, 320 GB/s GDDR6, 16 GB.
    GpuType("T4", 8.1 * T, 320 * GBs, 16 * GiB, _LAUNCH),
    # A100 SXM4 40GB datasheet: 19.5 TFLOPS FP32, 1,555 GB/s HBM2, 40 GB.
    GpuType("A100-40GB", 19.5 * T, 1555 * GBs, 40 * GiB, _LAUNCH),
    # A100 SXM4 80GB datasheet: 19.5 TFLOPS FP32, 2,039 GB/s HBM2e, 80 GB.
    GpuType("A100-80GB", 19.5 * T, 2039 * GBs, 80 * GiB, _LAUNCH),
    # H100 SXM5 datasheet: 67 TFLOPS FP32, 3.35 TB/s HBM3, 80 GB. (PCIe H100: 51 TFLOPS, 2 TB/s.)
    GpuType("H100", 67 * T, 3350 * GBs, 80 * GiB, _LAUNCH),
    # A generic CPU device. PLACEHOLDERS, not a datasheet: roughly one server socket (100 GFLOP/s
    # FP32, 20 GB/s DRAM, 16 GiB, 10 us per op dispatch). The cost model calibrates them from
    # profiles; `presets.local()` overrides memory_bytes per virtual device.
    GpuType("cpu", 1e11, 20 * GBs, 16 * GiB, 10e-6),
)

GPU_TYPES: Mapping[str, GpuType] = MappingProxyType({t.name: t for t in _TYPES})


def _norm(name: str) -> str:
    s = name.lower()
    for word in ("nvidia", "tesla", "geforce"):
        s = s.replace(word, "")
    return re.sub(r"[\s\-_]+", "", s)


_ALIASES: Mapping[str, str] = MappingProxyType({
    **{_norm(n): n for n in GPU_TYPES},
    "v100": "V100-32GB", "v10032": "V100-32GB", "v100sxm232gb": "V100-32GB",
    "v10016": "V100-16GB", "v100sxm216gb": "V100-16GB",
    "p100pcie": "P100", "p10016gb": "P100", "p100pcie16gb": "P100",
    "1080ti": "GTX1080Ti", "gtx1080ti": "GTX1080Ti",
    "t416gb": "T4",
    "a100": "A100-40GB", "a10040": "A100-40GB", "a100sxm440gb": "A100-40GB",
    "a10080": "A100-80GB", "a100sxm480gb": "A100-80GB",
    "h100sxm": "H100", "h100sxm5": "H100", "h10080gb": "H100", "h100sxm580gb": "H100",
})


def gpu_type(name: str) -> GpuType:
    """The GpuType for a canonical name or alias (case-insensitive). Raises TopologyError."""
    if isinstance(name, str):
        canonical = _ALIASES.get(_norm(name))
        if canonical is not None:
            return GPU_TYPES[canonical]
    raise TopologyError(f"unknown GPU type {name!r}; known types: {', '.join(GPU_TYPES)}")


def type_from_device_name(device_name: str) -> str | None:
    """Best-effort canonical type from a CUDA device name as TensorFlow reports it
    (e.g. "Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce GTX 1080 Ti");
    None when it is not one of our types."""
    s = _norm(device_name)
    if "v100" in s:
        return "V100-16GB" if "16gb" in s else "V100-32GB"
    if "a100" in s:
        return "A100-80GB" if "80gb" in s else "A100-40GB"
    for key, canonical in (("h100", "H100"), ("p100", "P100"), ("1080ti", "GTX1080Ti")):
        if key in s:
            return canonical
    if re.search(r"\bt4\b", device_name.lower()):   # "Tesla T4", not "RTX 4000"
        return "T4"
    return None
