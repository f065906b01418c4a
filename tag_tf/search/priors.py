"""The names of the strategy creator's MCTS priors, and which one plans by default (kept
import-free: the CLI's options read them)."""
from __future__ import annotations

from typing import Iterable

PRIORS = ("gnn", "uniform")
# The trained GNN shipped in search/weights/gnn.pt guides planning; "uniform" is pure MCTS.
DEFAULT_PRIOR = "gnn"


def default_prior(device_types: Iterable[str]) -> str:
    """The shipped GNN on clusters with GPUs; pure MCTS where every device is a CPU. The GNN was
    trained on GPU clusters only (a CPU's features lie outside anything it saw), and a CPU cluster's
    plans are few enough for the tree to converge in about a second, less than loading torch and
    torch-geometric takes (distribute's first step pays that)."""
    return "uniform" if all(t == "cpu" for t in device_types) else DEFAULT_PRIOR


__all__ = ["DEFAULT_PRIOR", "PRIORS", "default_prior"]
