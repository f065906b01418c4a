"""The paper's random topologies (used to train the GNN on many clusters).

Per the paper: 1-6 machines; 1-8 GPUs per machine; each machine's GPUs are all of one type drawn
from three types; intra-machine bandwidth uniform in [64, 160] Gbps; inter-machine bandwidth uniform
in [20, 50] Gbps. We draw the inter-machine bandwidth per machine pair (a symmetric matrix), the most
heterogeneous reading. The link kind is only a label for the contention model: "nvlink" for the
NVLink-era data-center cards (V100, A100, H100), "pcie" otherwise. Deterministic per seed (own numpy
Generator, no global RNG).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tag_tf.errors import TopologyError
from tag_tf.topology.gpus import GPU_TYPES, gpu_type
from tag_tf.topology.spec import GpuSpec, Machine, Topology

MACHINES = (1, 6)             # inclusive
GPUS_PER_MACHINE = (1, 8)     # inclusive
INTRA_GBPS = (64.0, 160.0)
INTER_GBPS = (20.0, 50.0)
_NVLINK_TYPES = ("V100-32GB", "V100-16GB", "A100-40GB", "A100-80GB", "H100")
_GBPS = 1e9 / 8   # bytes/s per Gbps


def random_topology(seed: int, types: Sequence[str] = ("V100-32GB", "GTX1080Ti", "P100")) -> Topology:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TopologyError(f"random topology: seed must be an integer, got {seed!r}")
    canonical = [gpu_type(t).name for t in types]
    if not canonical or "cpu" in canonical:
        raise TopologyError(f"random topology: types must name one or more GPU types, got {types!r}")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(MACHINES[0], MACHINES[1] + 1))
    machines = []
    for i in range(n):
        t = canonical[int(rng.integers(len(canonical)))]
        count = int(rng.integers(GPUS_PER_MACHINE[0], GPUS_PER_MACHINE[1] + 1))
        bw = float(rng.uniform(*INTRA_GBPS)) * _GBPS
        link = "nvlink" if t in _NVLINK_TYPES else "pcie"
        machines.append(Machine(f"m{i}", (GpuSpec(t, GPU_TYPES[t].memory_bytes),) * count, bw, link))
    matrix = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            matrix[i, j] = matrix[j, i] = float(rng.uniform(*INTER_GBPS)) * _GBPS
    return Topology(f"random:{seed}", tuple(machines), tuple(map(tuple, matrix.tolist())))
