"""Op weights for the analysis pass's METIS grouping: the paper groups by op compute time, which
before any profile exists is estimated statically (work counts and the roofline cost model) on one
reference GPU type. Only the ratios between ops matter to the partition."""
from __future__ import annotations

import numpy as np

from tag_tf.analysis.simplify import PlanningGraph
from tag_tf.ir import Graph
from tag_tf.profile.costmodel import CostModel
from tag_tf.profile.flops import graph_work
from tag_tf.topology.gpus import gpu_type

REFERENCE_DEVICE = "V100-32GB"


def reference_weights(graph_b1: Graph, planning: PlanningGraph) -> np.ndarray:
    """Estimated compute time of each planned op (its folded members included) on REFERENCE_DEVICE."""
    members = planning.members()
    names = [m for p in planning.ops for m in members[p]]
    flops, nbytes = graph_work(graph_b1, names)
    times = CostModel().times(np.asarray(flops), np.asarray(nbytes), gpu_type(REFERENCE_DEVICE))
    weights = np.zeros(len(planning.ops))
    k = 0
    for i, p in enumerate(planning.ops):
        n = len(members[p])
        weights[i] = float(np.sum(times[k:k + n]))
        k += n
    return np.maximum(weights, 1e-9)


__all__ = ["REFERENCE_DEVICE", "reference_weights"]
