"""Preset topologies: the paper's testbed and cloud clusters (YAML files next to this module, which
double as examples of the file format) and `local`, the devices of this machine."""
from __future__ import annotations

import logging
import os
from importlib import resources

from tag_tf.errors import TopologyError
from tag_tf.topology.gpus import GPU_TYPES, GpuType, type_from_device_name
from tag_tf.topology.parse import topology_from_dict
from tag_tf.topology.spec import GpuSpec, Machine, Topology

log = logging.getLogger("tag_tf.topology")

# Virtual CPU devices live in one process: TensorFlow hands tensors between them by reference, so a
# "transfer" costs next to nothing. 100 GB/s (a few times DRAM bandwidth) keeps the simulator from
# charging for copies that do not happen; a measured CommModel replaces it.
LOCAL_CPU_BANDWIDTH = 100e9
# Local GPUs: we cannot tell NVLink from PCIe through TensorFlow, so assume PCIe 3.0 x16.
LOCAL_GPU_BANDWIDTH = 15.75e9
DEFAULT_LOCAL_DEVICES = 4


def _preset(name: str) -> Topology:
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs

    path = resources.files("tag_tf.topology").joinpath("presets", f"{name}.yaml")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return topology_from_dict(data, source=f"preset {name}")


def testbed() -> Topology:
    """1x (4x V100-32GB, NVLink) + 4x (2x GTX1080Ti, PCIe) + 2x (2x P100, PCIe); 100 Gbps switch."""
    return _preset("testbed")


def cloud() -> Topology:
    """2x (8x V100-16GB, NVLink) + 4x (4x T4, PCIe); 10 Gbps switch."""
    return _preset("cloud")


def _visible_gpus() -> list[str]:
    """CUDA device names TensorFlow sees ([] without TensorFlow or GPUs)."""
    try:
        import tensorflow as tf
    except ImportError:
        return []
    names = []
    for d in tf.config.list_physical_devices("GPU"):
        try:
            names.append(tf.config.experimental.get_device_details(d).get("device_name", ""))
        except Exception:   # details are best-effort; the device is still there
            names.append("")
    return names


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return GPU_TYPES["cpu"].memory_bytes


def local(num_devices: int | None = None) -> Topology:
    """This machine. With GPUs visible to TensorFlow: those GPUs (the first `num_devices` if given),
    typed from their CUDA names (an unknown card gets a custom type with V100-32GB placeholder
    numbers), linked by PCIe. Without GPUs: `num_devices` (default 4) virtual CPU devices of type
    "cpu" on one machine, each with an equal share of host memory, linked "local" at 100 GB/s."""
    if num_devices is not None and (isinstance(num_devices, bool) or not isinstance(num_devices, int)
                                    or num_devices < 1):
        raise TopologyError(f"local: num_devices must be a positive integer, got {num_devices!r}")
    names = _visible_gpus()
    if names:
        if num_devices is not None:
            if num_devices > len(names):
                raise TopologyError(f"local:{num_devices}: only {len(names)} GPU(s) visible")
            names = names[:num_devices]
        return _local_gpus(names)
    n = num_devices or DEFAULT_LOCAL_DEVICES
    memory = max(1, _host_memory() // n) >> 20 << 20   # whole MiB
    machine = Machine("localhost", (GpuSpec("cpu", memory),) * n, LOCAL_CPU_BANDWIDTH, "local")
    return Topology("local", (machine,))


def _local_gpus(names: list[str]) -> Topology:
    custom: dict[str, GpuType] = {}
    specs = []
    for name in names:
        t = type_from_device_name(name)
        if t is None:
            label = name.strip() or "unknown-gpu"
            log.warning("local GPU %r is not a known type; using V100-32GB numbers as placeholders",
                        label)
            base = GPU_TYPES["V100-32GB"]
            custom.setdefault(label, GpuType(label, base.peak_flops, base.mem_bandwidth,
                                             base.memory_bytes, base.launch_overhead_s))
            specs.append(GpuSpec(label, base.memory_bytes))
        else:
            specs.append(GpuSpec(t, GPU_TYPES[t].memory_bytes))
    machine = Machine("localhost", tuple(specs), LOCAL_GPU_BANDWIDTH, "pcie")
    return Topology("local", (machine,), gpu_types=tuple(custom.values()))


# The scale study's clusters (`mixed:N`): eight-GPU machines, a quarter H100 and the rest A100-80GB
# and V100-32GB in equal parts; NVLink inside each machine, 200 Gbps NICs on the H100 and A100
# machines, 100 Gbps on the V100 ones, one non-blocking switch; all-reduces hierarchical (NCCL's
# two-level form: at hundreds of GPUs a flat ring pays two latencies per GPU); every machine reads
# its own part of each batch (one client feeding 256 GPUs through one port would set every step).
MIXED_TYPES = (("h100", "H100", 450e9, 200e9 / 8), ("a100", "A100-80GB", 300e9, 200e9 / 8),
               ("v100", "V100-32GB", 150e9, 100e9 / 8))


def mixed(num_gpus: int) -> Topology:
    """A mixed cluster of `num_gpus` GPUs (a multiple of 8, at least 16) in eight-GPU machines:
    round(machines / 4) H100 machines (at least one), the rest split between A100-80GB and
    V100-32GB (the V100s take the odd one)."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 16 or num_gpus % 8:
        raise TopologyError(f"mixed:{num_gpus}: the GPU count must be a multiple of 8, at least 16")
    m = num_gpus // 8
    h = max(1, round(m / 4))
    a = (m - h) // 2
    counts = (h, a, m - h - a)
    machines = []
    for (prefix, gpu, intra, nic), count in zip(MIXED_TYPES, counts, strict=True):
        for i in range(count):
            machines.append(Machine.of(f"{prefix}-{i}", gpu, 8, intra, "nvlink", nic_bandwidth=nic))
    return Topology(f"mixed:{num_gpus}", tuple(machines), collectives="hierarchical", input="local")
