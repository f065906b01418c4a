"""GPU types: the per-device numbers the cost model starts from.

Every number below is a vendor datasheet figure (cited next to it), not a measurement:
``peak_flops`` is dense FP32 FLOP/s on the CUDA cores (no tensor cores, no sparsity); ``tf32_flops``
the dense TF32 tensor-core rate (0: the card has none -- compute capability below 8.0), ``half_flops``
the dense FP16/BF16 tensor-core rate with FP32 accumulation, or the plain FP16 rate on cards without
tensor cores (what a mixed-precision graph's matmuls and convolutions run at); ``mem_bandwidth`` the
peak device-memory bandwidth in bytes/s; ``memory_bytes`` the on-board memory (the marketed "32GB" of
a GPU is 32 GiB, so we store GiB); ``sm_count`` the streaming multiprocessors (the cost model's waves
of GEMM tiles); ``capability`` the CUDA compute capability (TensorFlow runs float32 matmuls and
convolutions in TF32 from 8.0 on unless the program turns it off). Datasheets quote tensor-core rates
"with sparsity" too: we always store the dense figure (half the sparse one). ``launch_overhead_s`` is
not a datasheet figure: it is the usual host-side cost of launching one kernel through TensorFlow's
executor (a few microseconds), a starting point the cost model replaces with profiled values.

Aliases (case-insensitive; spaces, '-', '_' and vendor words such as "nvidia", "tesla", "geforce" are
ignored): "v100" means V100-32GB (the paper's testbed card); "v100-16" / "v100-16gb" the cloud card;
"1080ti" / "gtx1080ti" GTX1080Ti; "a100" A100-40GB; "a100-80" A100-80GB; "h100" the H100 SXM5;
"h100-pcie" the H100 PCIe; "a10g" the AWS A10G; "3090" / "rtx3090" and "4090" / "rtx4090" the GeForce cards.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

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
    tf32_flops: float = 0.0    # dense TF32 tensor-core FLOP/s; 0: none (capability < 8.0)
    half_flops: float = 0.0    # dense FP16/BF16 FLOP/s (tensor cores, FP32 accumulate); 0: as FP32
    sm_count: int = 0          # streaming multiprocessors; 0: unknown (no wave quantisation)
    capability: float = 0.0    # CUDA compute capability, e.g. 8.0; 0: unknown / not a CUDA GPU
    source: str = ""           # where the figures come from

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> GpuType:
        return cls(name=str(d["name"]), peak_flops=float(d["peak_flops"]),
                   mem_bandwidth=float(d["mem_bandwidth"]), memory_bytes=int(d["memory_bytes"]),
                   launch_overhead_s=float(d["launch_overhead_s"]),
                   tf32_flops=float(d.get("tf32_flops", 0.0)), half_flops=float(d.get("half_flops", 0.0)),
                   sm_count=int(d.get("sm_count", 0)), capability=float(d.get("capability", 0.0)),
                   source=str(d.get("source", "")))

    def rate(self, mode: str) -> float:
        """Dense FLOP/s of one math mode ("fp32", "tf32", "half"); a mode the card lacks runs at FP32."""
        if mode == "tf32" and self.tf32_flops > 0:
            return self.tf32_flops
        if mode == "half" and self.half_flops > 0:
            return self.half_flops
        return self.peak_flops


_LAUNCH = 5e-6  # typical TF GPU kernel launch cost; calibrated by the op profiler

_TYPES = (
    # Tesla V100 SXM2 32GB datasheet (NVIDIA, 2018): 15.7 TFLOPS FP32, 125 TFLOPS tensor (FP16), 900 GB/s
    # HBM2, 32 GB; 80 SMs, compute capability 7.0 (no TF32).
    GpuType("V100-32GB", 15.7 * T, 900 * GBs, 32 * GiB, _LAUNCH, 0.0, 125 * T, 80, 7.0,
            "Tesla V100 datasheet (SXM2)"),
    # Tesla V100 SXM2 16GB (AWS p3.16xlarge): same chip and clocks, 16 GB HBM2.
    GpuType("V100-16GB", 15.7 * T, 900 * GBs, 16 * GiB, _LAUNCH, 0.0, 125 * T, 80, 7.0,
            "Tesla V100 datasheet (SXM2)"),
    # Tesla P100 for PCIe, 16GB datasheet: 9.3 TFLOPS FP32, 18.7 TFLOPS FP16 (no tensor cores), 732 GB/s
    # HBM2, 16 GB; 56 SMs, capability 6.0. (The paper's P100 machines use PCIe inside, so the PCIe
    # card, not the 10.6 TFLOPS SXM2 one.)
    GpuType("P100", 9.3 * T, 732 * GBs, 16 * GiB, _LAUNCH, 0.0, 18.7 * T, 56, 6.0, "Tesla P100 datasheet (PCIe)"),
    # GeForce GTX 1080 Ti spec sheet: 3584 CUDA cores x 1582 MHz boost x 2 = 11.34 TFLOPS FP32,
    # 484 GB/s GDDR5X (11 Gbps x 352-bit), 11 GB; 28 SMs, capability 6.1. FP16 runs at 1/64 rate on
    # GP102, so half precision gains nothing: half_flops 0 (= FP32).
    GpuType("GTX1080Ti", 11.34 * T, 484 * GBs, 11 * GiB, _LAUNCH, 0.0, 0.0, 28, 6.1,
            "GeForce GTX 1080 Ti specifications; Pascal GP102"),
    # Tesla T4 datasheet: 8.1 TFLOPS FP32, 65 TFLOPS mixed precision (FP16/FP32), 320 GB/s GDDR6, 16 GB;
    # 40 SMs, capability 7.5.
    GpuType("T4", 8.1 * T, 320 * GBs, 16 * GiB, _LAUNCH, 0.0, 65 * T, 40, 7.5, "Tesla T4 datasheet"),
    # A100 SXM4 40GB datasheet: 19.5 TFLOPS FP32, 156 TFLOPS TF32, 312 TFLOPS BF16/FP16 (dense), 1,555 GB/s
    # HBM2, 40 GB; 108 SMs, capability 8.0.
    GpuType("A100-40GB", 19.5 * T, 1555 * GBs, 40 * GiB, _LAUNCH, 156 * T, 312 * T, 108, 8.0,
            "A100 Tensor Core GPU datasheet (SXM4 40GB)"),
    # A100 SXM4 80GB datasheet: the same rates, 2,039 GB/s HBM2e, 80 GB.
    GpuType("A100-80GB", 19.5 * T, 2039 * GBs, 80 * GiB, _LAUNCH, 156 * T, 312 * T, 108, 8.0,
            "A100 Tensor Core GPU datasheet (SXM4 80GB)"),
    # A100 PCIe 80GB datasheet: the same rates, 1,935 GB/s HBM2e, 80 GB (300 W).
    GpuType("A100-PCIe", 19.5 * T, 1935 * GBs, 80 * GiB, _LAUNCH, 156 * T, 312 * T, 108, 8.0,
            "A100 Tensor Core GPU datasheet (PCIe 80GB)"),
    # H100 SXM5 datasheet: 67 TFLOPS FP32, 989 TFLOPS TF32 and 1,979 BF16 *with sparsity* (dense: half),
    # 3.35 TB/s HBM3, 80 GB; 132 SMs, capability 9.0.
    GpuType("H100", 67 * T, 3350 * GBs, 80 * GiB, _LAUNCH, 494.7 * T, 989.4 * T, 132, 9.0,
            "H100 Tensor Core GPU datasheet (SXM5)"),
    # H100 PCIe datasheet: 51 TFLOPS FP32, 756 TF32 / 1,513 BF16 with sparsity (dense: half), 2.0 TB/s
    # HBM2e, 80 GB; 114 SMs, capability 9.0.
    GpuType("H100-PCIe", 51 * T, 2000 * GBs, 80 * GiB, _LAUNCH, 378 * T, 756 * T, 114, 9.0,
            "H100 Tensor Core GPU datasheet (PCIe)"),
    # H200 SXM datasheet: the H100 SXM's compute (67 FP32, 989/1,979 TF32/BF16 sparse), 4.8 TB/s HBM3e,
    # 141 GB; 132 SMs, capability 9.0.
    # (Its marketed "141 GB" is decimal.)
    GpuType("H200", 67 * T, 4800 * GBs, 141 * 10**9, _LAUNCH, 494.7 * T, 989.4 * T, 132, 9.0,
            "H200 Tensor Core GPU datasheet (SXM)"),
    # L4 datasheet: 30.3 TFLOPS FP32, 120 TF32 / 242 BF16 with sparsity (dense: half), 300 GB/s GDDR6,
    # 24 GB; 58 SMs, capability 8.9.
    GpuType("L4", 30.3 * T, 300 * GBs, 24 * GiB, _LAUNCH, 60 * T, 121 * T, 58, 8.9, "L4 Tensor Core GPU datasheet"),
    # A10G (AWS G5): NVIDIA's A10 datasheet figures (31.2 TFLOPS FP32, 125 TF32 / 250 BF16 with sparsity,
    # dense: half), 600 GB/s GDDR6, 24 GB; 80 SMs, capability 8.6. AWS publishes no separate sheet.
    GpuType("A10G", 31.2 * T, 600 * GBs, 24 * GiB, _LAUNCH, 62.5 * T, 125 * T, 80, 8.6,
            "A10 Tensor Core GPU datasheet (AWS's A10G variant)"),
    # L40S datasheet: 91.6 TFLOPS FP32, 366 TF32 / 733 BF16 with sparsity (dense: half), 864 GB/s GDDR6,
    # 48 GB; 142 SMs, capability 8.9.
    GpuType("L40S", 91.6 * T, 864 * GBs, 48 * GiB, _LAUNCH, 183 * T, 366 * T, 142, 8.9, "L40S GPU datasheet"),
    # GeForce RTX 3090 (NVIDIA Ampere GA102 whitepaper): 35.6 TFLOPS FP32, 35.6 TF32 and 71 FP16/BF16 tensor
    # with FP32 accumulate (dense), 936 GB/s GDDR6X, 24 GB; 82 SMs, capability 8.6.
    GpuType("RTX3090", 35.6 * T, 936 * GBs, 24 * GiB, _LAUNCH, 35.6 * T, 71 * T, 82, 8.6,
            "NVIDIA Ampere GA102 GPU architecture whitepaper"),
    # GeForce RTX 4090 (NVIDIA Ada Lovelace whitepaper): 82.6 TFLOPS FP32, 82.6 TF32 and 165.2 FP16/BF16
    # tensor with FP32 accumulate (dense), 1,008 GB/s GDDR6X, 24 GB; 128 SMs, capability 8.9.
    GpuType("RTX4090", 82.6 * T, 1008 * GBs, 24 * GiB, _LAUNCH, 82.6 * T, 165.2 * T, 128, 8.9,
            "NVIDIA Ada GPU architecture whitepaper"),
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
    "a100pcie80gb": "A100-PCIe", "a10080gbpcie": "A100-PCIe", "h100pcie80gb": "H100-PCIe",
    "h200sxm": "H200", "h200sxm141gb": "H200", "a10": "A10G",
    "3090": "RTX3090", "4090": "RTX4090", "l40s48gb": "L40S", "l424gb": "L4",
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
    (e.g. "Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe",
    "NVIDIA H100 PCIe", "NVIDIA GeForce RTX 4090", "NVIDIA A10G", "NVIDIA L40S"); None when it is not
    one of our types."""
    s = _norm(device_name)
    if "v100" in s:
        return "V100-16GB" if "16gb" in s else "V100-32GB"
    if "a100" in s:
        if "pcie" in s and "80gb" in s:
            return "A100-PCIe"          # the 80 GB PCIe card; the 40 GB PCIe one has the A100-40GB's memory
        return "A100-80GB" if "80gb" in s else "A100-40GB"
    if "gh200" in s:
        return None                     # Grace Hopper: not one of our types (not an H200)
    if "h100" in s:
        return "H100-PCIe" if "pcie" in s else "H100"
    for key, canonical in (("h200", "H200"), ("l40s", "L40S"), ("a10g", "A10G"), ("rtx3090", "RTX3090"),
                           ("rtx4090", "RTX4090"), ("p100", "P100"), ("1080ti", "GTX1080Ti")):
        if key in s:
            return canonical
    lowered = device_name.lower()
    if re.search(r"\bt4\b", lowered):   # "Tesla T4", not "RTX 4000"
        return "T4"
    if re.search(r"\bl4\b", lowered):   # "NVIDIA L4", not "L40S"
        return "L4"
    if re.search(r"\ba10\b", lowered):  # the A10 (same figures as the A10G)
        return "A10G"
    return None
