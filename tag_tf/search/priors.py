"""The names of the strategy creator's MCTS priors, and which one plans by default (kept
import-free: the CLI's options read them)."""
from __future__ import annotations

from collections.abc import Iterable

PRIORS = ("gnn", "uniform")
# "uniform" (pure MCTS) plans by default; "gnn" (the trained GNN shipped in search/weights/gnn.pt) on
# request. Chosen by benchmarks/gnn_wallclock.py (RESULTS.md: the GNN prior at equal wall-clock): given
# the same seconds, on held-out random topologies and on 64-256 GPU clusters, at 5, 15 and 60 s budgets,
# the GNN's final plans were never faster than pure MCTS's, and its inference cost the tree simulations.
DEFAULT_PRIOR = "uniform"
# Where the GNN would be the default, it is still never used on CPU clusters: it was trained on GPU
# clusters only (a CPU's features lie outside anything it saw).
GPU_ONLY = ("gnn",)


def default_prior(device_types: Iterable[str]) -> str:
    """DEFAULT_PRIOR, except that a prior trained on GPU clusters only never plans a cluster of CPUs."""
    return "uniform" if DEFAULT_PRIOR in GPU_ONLY and all(t == "cpu" for t in device_types) else DEFAULT_PRIOR


__all__ = ["DEFAULT_PRIOR", "PRIORS", "default_prior"]
