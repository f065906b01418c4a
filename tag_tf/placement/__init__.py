"""How a strategy maps onto the graph's ops: each op's Layout, colocation, model-parallel parts and
gradient buckets. The compiler acts on these facts and the simulator predicts from the same ones,
so both sit above this package."""
from tag_tf.placement.layout import HOST, ColocationSets, Layout, Mode, Placement, resolve

__all__ = ["HOST", "ColocationSets", "Layout", "Mode", "Placement", "resolve"]
