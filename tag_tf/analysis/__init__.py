"""Graph analysis: batch dimensions, replication semantics, planning graph, METIS grouping."""
from tag_tf.analysis.analyzer import Analysis, analyze, batch_variants
from tag_tf.analysis.states import Category, Flag, Kind, OpAnnotation, State

__all__ = ["Analysis", "analyze", "batch_variants", "Category", "Flag", "Kind", "OpAnnotation", "State"]
