"""The names of the strategy creator's MCTS priors (kept import-free: the CLI's options read them)."""
from __future__ import annotations

PRIORS = ("gnn", "uniform")
# The trained GNN shipped in search/weights/gnn.pt guides planning; "uniform" is pure MCTS.
DEFAULT_PRIOR = "gnn"

__all__ = ["DEFAULT_PRIOR", "PRIORS"]
