"""Graph IR: import from GraphDef/MetaGraphDef, immutable ops/tensors/variables, export back."""
from tag_tf.ir.graph import Graph, GraphMeta, Op, TensorInfo, TensorRef, Variable
from tag_tf.ir.importer import from_file, from_graph_def, infer_shapes, load_graph_file

__all__ = ["Graph", "GraphMeta", "Op", "TensorInfo", "TensorRef", "Variable", "from_file",
           "from_graph_def", "infer_shapes", "load_graph_file"]
