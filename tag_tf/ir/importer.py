"""Build the IR from a GraphDef, a MetaGraphDef, or a file holding either.

Shapes come from TensorFlow's own C++ shape inference (importing the GraphDef into a fresh graph);
`input_shapes` overrides the shapes of the batch inputs, which is how the analyzer infers shapes at
a second batch size without rebuilding the user's model.
"""
from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tag_tf.errors import GraphError, tf_reason
from tag_tf.ir import opsets
from tag_tf.ir.graph import Graph, GraphMeta, Op, TensorInfo, TensorRef, Variable, shape_proto_to_tuple

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef
    from tensorflow.core.framework.tensor_shape_pb2 import TensorShapeProto
    from tensorflow.core.protobuf.meta_graph_pb2 import MetaGraphDef

_BATCH_SOURCE_OPS = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext",
                               "QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeueMany"})


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
def load_graph_file(path: str) -> tuple[GraphDef, MetaGraphDef | None]:
    """Read a .pb (binary GraphDef or MetaGraphDef), .pbtxt (text GraphDef/MetaGraphDef) or .meta file.

    Returns (graph_def, meta_graph_def or None). Raises GraphError naming the file on any problem.
    """
    from google.protobuf import message, text_format
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    if not os.path.isfile(path):
        raise GraphError(f"{path}: no such graph file")
    ext = os.path.splitext(path)[1].lower()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GraphError(f"{path}: cannot read graph file ({e.strerror})") from None
    if ext not in (".pb", ".pbtxt", ".meta", ".txt"):
        raise GraphError(f"{path}: unknown graph file type {ext!r} (expected .pb, .pbtxt or .meta)")

    def parse_binary(cls: type[GraphDef | MetaGraphDef]) -> GraphDef | MetaGraphDef:
        proto = cls()
        proto.ParseFromString(data)
        return proto

    def parse_text(cls: type[GraphDef | MetaGraphDef]) -> GraphDef | MetaGraphDef:
        proto = cls()
        text_format.Parse(data.decode("utf-8"), proto)
        return proto

    parsers = (parse_text,) if ext in (".pbtxt", ".txt") else (parse_binary,)
    # A .meta file is a MetaGraphDef; a .pb may be either, so try MetaGraphDef only when it has one.
    for parse in parsers:
        for cls in ((meta_graph_pb2.MetaGraphDef, graph_pb2.GraphDef) if ext == ".meta"
                    else (graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef)):
            try:
                proto = parse(cls)
            except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, ValueError):
                continue
            if isinstance(proto, meta_graph_pb2.MetaGraphDef):
                if len(proto.graph_def.node):
                    return proto.graph_def, proto
            elif len(proto.node):
                return proto, None
    raise GraphError(f"{path}: not a TensorFlow GraphDef or MetaGraphDef (or it holds no ops)")


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------
def infer_shapes(graph_def: GraphDef, input_shapes: Mapping[str, tuple[int, ...]] | None = None
                 ) -> dict[str, tuple[TensorInfo, ...]]:
    """Run TF shape inference on `graph_def`; `input_shapes` maps batch-input tensor names to new shapes.

    Returns op name -> output TensorInfos.
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    gd = graph_def
    dequeues = [n for n in graph_def.node if n.op in _DEQUEUE_OPS]
    if input_shapes or dequeues:
        gd = graph_pb2.GraphDef()
        gd.CopyFrom(graph_def)
        _standin_dequeues(gd, input_shapes or {})
        override_input_shapes(gd, input_shapes or {})
    g = tf.Graph()
    try:
        with g.as_default():
            tf.graph_util.import_graph_def(gd, name="")
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"shape inference failed: {first}") from None
    out: dict[str, tuple[TensorInfo, ...]] = {}
    for op in g.get_operations():
        out[op.name] = tuple(_tensor_info(t) for t in op.outputs)
    return out


def _tensor_info(t: tf.Tensor) -> TensorInfo:
    shape = t.shape
    dims = None if shape.rank is None else tuple(-1 if d is None else int(d) for d in shape.as_list())
    return TensorInfo(t.dtype.name, dims)


_DEQUEUE_OPS = frozenset({"QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeueMany", "QueueDequeueUpTo"})


def _standin_dequeues(gd: GraphDef, overrides: Mapping[str, tuple[int, ...]]) -> None:
    """TF cannot type a queue dequeue from its GraphDef (the element shapes live on the queue op).
    For shape inference only, replace each dequeue by IdentityN over placeholders of the queue's
    component types and shapes, batch `n` first (or the override): consumers keep reading `deq:i`."""
    from tensorflow.core.framework import tensor_shape_pb2
    from tensorflow.python.framework import tensor_util

    by_name = {n.name: n for n in gd.node}
    for node in list(gd.node):
        if node.op not in _DEQUEUE_OPS or not node.input:
            continue
        queue = by_name.get(TensorRef.parse(node.input[0]).op)
        if queue is None or "shapes" not in queue.attr or not queue.attr["shapes"].list.shape:
            continue
        n_node = by_name.get(TensorRef.parse(node.input[1]).op) if len(node.input) > 1 else None
        batch = -1
        if n_node is not None and n_node.op == "Const" and node.op.startswith("QueueDequeueMany"):
            batch = int(tensor_util.MakeNdarray(n_node.attr["value"].tensor))
        types = list(queue.attr["component_types"].list.type)
        names = []
        for k, (dtype, elem) in enumerate(zip(types, queue.attr["shapes"].list.shape)):
            dims = overrides.get(f"{node.name}:{k}")
            if dims is None:
                dims = (batch,) + tuple(d.size for d in elem.dim)
            ph = gd.node.add()
            ph.name = f"{node.name}/tag_standin_{k}"
            ph.op = "Placeholder"
            ph.attr["dtype"].type = dtype
            shape = tensor_shape_pb2.TensorShapeProto()
            for d in dims:
                shape.dim.add().size = int(d)
            ph.attr["shape"].shape.CopyFrom(shape)
            names.append(ph.name)
        control = [x for x in node.input if x.startswith("^")]
        node.op = "IdentityN"
        node.ClearField("attr")
        node.attr["T"].list.type.extend(types)
        del node.input[:]
        node.input.extend(names + control)


def override_input_shapes(gd: GraphDef, input_shapes: Mapping[str, tuple[int, ...]]) -> None:
    from tensorflow.core.framework import tensor_shape_pb2

    def shape_proto(dims: tuple[int, ...]) -> TensorShapeProto:
        p = tensor_shape_pb2.TensorShapeProto()
        for d in dims:
            p.dim.add().size = int(d)
        return p

    by_op: dict[str, dict[int, tuple[int, ...]]] = {}
    for name, shape in input_shapes.items():
        ref = TensorRef.parse(name)
        by_op.setdefault(ref.op, {})[ref.index] = tuple(shape)
    found = set()
    for node in gd.node:
        if node.name not in by_op:
            continue
        found.add(node.name)
        if node.op in _DEQUEUE_OPS:
            continue        # typed by _standin_dequeues (from the queue's shapes and `n`)
        if node.op in ("Placeholder", "PlaceholderWithDefault"):
            node.attr["shape"].shape.CopyFrom(shape_proto(by_op[node.name][0]))
        elif "output_shapes" in node.attr:
            shapes = node.attr["output_shapes"].list.shape
            for idx, dims in by_op[node.name].items():
                shapes[idx].CopyFrom(shape_proto(dims))
        else:
            raise GraphError(f"cannot override the shape of {node.name!r} ({node.op})")
    missing = set(by_op) - found
    if missing:
        raise GraphError(f"no input op named {sorted(missing)[0]!r} in the graph")


def measure_shapes(graph: Graph, input_shapes: Mapping[str, tuple[int, ...]], tensors: Iterable[str],
                   timeout_ms: int = 120_000, alternate: bool = False) -> dict[str, tuple[int, ...]]:
    """The run-time shapes of `tensors`: one run of their ancestors on a scratch session, the batch
    inputs fed zeros of `input_shapes` (zero is a valid id for embeddings and labels), or with
    `alternate` zeros but a 1 first (two fills tell value-sized tensors, such as a Unique's or a
    DynamicPartition's, from batch-sized ones); variables initialised by their own
    initialisers. Shape inference cannot see through functional control flow (an RNN's `While`
    returns `[?, ?, H]`); running it does. Nothing is written anywhere but in that scratch session."""
    import numpy as np
    import tensorflow as tf

    tensors = list(tensors)
    for name, dims in input_shapes.items():
        if any(d < 0 for d in dims):
            raise GraphError(f"cannot run the graph to measure shapes: input {name!r} has unknown dims {dims} "
                             f"besides the batch")
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph.to_graph_def(), name="")
        shapes = [tf.shape(g.get_tensor_by_name(t), out_type=tf.int64) for t in tensors]
    def zeros(name: str, dims: tuple[int, ...]) -> np.ndarray:
        dtype = tf.as_dtype(graph.tensor(name).base_dtype)
        # Strings: "0"/"1", not "": feature columns drop empty strings as missing values.
        value = np.full(dims, b"0", dtype=object) if dtype == tf.string else np.zeros(dims, dtype.as_numpy_dtype)
        if alternate and value.size and dtype != tf.bool:
            value.flat[0] = b"1" if dtype == tf.string else 1   # one element differs: no per-sample pattern
        return value

    feeds = {name: zeros(name, dims) for name, dims in input_shapes.items()}
    # Other placeholders (a learning rate, keep_prob) with a static shape: zeros too.
    for op in graph:
        ref = f"{op.name}:0"
        if op.type == "Placeholder" and ref not in feeds and op.outputs and op.outputs[0].shape is not None \
                and all(d >= 0 for d in op.outputs[0].shape):
            feeds[ref] = zeros(ref, op.outputs[0].shape)
    inits = [v.initializer for v in graph.variables.values() if v.initializer]
    inits += [op.name for op in graph if op.type.startswith("InitializeTable")]
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=timeout_ms, device_count={"CPU": 1},
                                      allow_soft_placement=True)
    try:
        with tf.compat.v1.Session(graph=g, config=config) as sess:
            if inits:
                sess.run(inits)
            values = sess.run(shapes, feeds)
    except (tf.errors.OpError, ValueError, TypeError) as e:
        first = tf_reason(e)
        raise GraphError(f"cannot find the run-time shapes of {tensors[0]!r} and {len(tensors) - 1} other "
                         f"tensor(s) that shape inference leaves unknown (running the graph on zeros "
                         f"failed: {first}); give the graph static shapes") from None
    return {t: tuple(int(d) for d in v) for t, v in zip(tensors, values)}


# ---------------------------------------------------------------------------------------------
# Graph
# ---------------------------------------------------------------------------------------------
def from_graph_def(graph_def: GraphDef, meta_graph_def: MetaGraphDef | None = None, *, train_op: str | None = None,
                   loss: str | None = None, inputs: Iterable[str] | None = None,
                   input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                   require_train_op: bool = True, shapes: Mapping[str, tuple[TensorInfo, ...]] | None = None
                   ) -> Graph:
    """Build the IR. Missing `train_op`/`loss`/`inputs` are found from the MetaGraph's collections or
    from the graph's structure; a graph without optimizer updates raises GraphError."""
    nodes = {}
    for node in graph_def.node:
        if node.name in nodes:
            raise GraphError(f"duplicate op name {node.name!r} in the GraphDef")
        nodes[node.name] = node
    if not nodes:
        raise GraphError("the graph has no ops")
    for node in graph_def.node:
        for inp in node.input:
            src = inp[1:] if inp.startswith("^") else TensorRef.parse(inp).op
            if src not in nodes:
                raise GraphError(f"op {node.name!r} reads {inp!r}, which is not in the graph")

    if shapes is None:
        shapes = infer_shapes(graph_def, input_shapes)
    order = topological_order(graph_def, nodes)
    ops = []
    for name in order:
        node = nodes[name]
        data, control = [], []
        for inp in node.input:
            if inp.startswith("^"):
                control.append(inp[1:])
            else:
                data.append(TensorRef.parse(inp))
        coloc = tuple(s.decode()[5:] for s in node.attr["_class"].list.s
                      if s.startswith(b"loc:@")) if "_class" in node.attr else ()
        ops.append(Op(name=name, type=node.op, inputs=tuple(data), control_inputs=tuple(control),
                      outputs=shapes.get(name, ()), device=node.device, colocate_with=coloc))

    collections = _collections(meta_graph_def)
    provisional = Graph(ops, nodes, GraphMeta(collections=collections), library=graph_def.library,
                        versions=graph_def.versions)
    train_op = train_op or _find_train_op(provisional, collections)
    if train_op is None and require_train_op:
        raise GraphError("no train op found: nothing in the graph writes a variable with a value computed from "
                         "gradients (an optimizer's Apply* op, or an assign of a gradient-derived value) "
                         "reachable from a final op; pass the train op's name explicitly")
    if train_op is not None and train_op not in nodes:
        raise GraphError(f"train op {train_op!r} is not an op of the graph")
    loss = loss or _find_loss(provisional, collections)
    if loss is not None:
        ref = TensorRef.parse(loss)
        if ref.op not in nodes:
            raise GraphError(f"loss tensor {loss!r} is not in the graph")
        loss = ref.name
    if inputs is None:
        inputs = _find_batch_inputs(provisional, train_op)
    inputs = tuple(TensorRef.parse(i).name for i in inputs)
    for i in inputs:
        provisional.tensor(i)   # raises KeyError on a bad name
    batch_size = _batch_size(provisional, inputs)
    saver_def = (meta_graph_def.saver_def.SerializeToString()
                 if meta_graph_def is not None and meta_graph_def.HasField("saver_def") else None)
    meta = GraphMeta(train_op=train_op, loss=loss, feeds=inputs, collections=collections,
                     saver_def=saver_def, batch_size=batch_size)
    variables = _find_variables(provisional, collections, train_op)
    return Graph(ops, nodes, meta, variables, graph_def.library, graph_def.versions)


def from_file(path: str, *, train_op: str | None = None, loss: str | None = None,
              inputs: Iterable[str] | None = None, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
              require_train_op: bool = True, shapes: Mapping[str, tuple[TensorInfo, ...]] | None = None) -> Graph:
    """`from_graph_def` of the graph in file `path` (see `load_graph_file`)."""
    graph_def, meta = load_graph_file(path)
    try:
        return from_graph_def(graph_def, meta, train_op=train_op, loss=loss, inputs=inputs, input_shapes=input_shapes,
                              require_train_op=require_train_op, shapes=shapes)
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from None


def topological_order(graph_def: GraphDef, nodes: Mapping[str, NodeDef]) -> list[str]:
    """Kahn's algorithm, stable in GraphDef order; loop back-edges (NextIteration) are ignored."""
    index = {node.name: i for i, node in enumerate(graph_def.node)}
    indegree = {name: 0 for name in nodes}
    succ: dict[str, list[str]] = {name: [] for name in nodes}
    for node in graph_def.node:
        if node.op in ("Merge", "RefMerge"):
            preds = [p for p in _input_ops(node) if nodes[p].op not in ("NextIteration", "RefNextIteration")]
        else:
            preds = _input_ops(node)
        for p in set(preds):
            succ[p].append(node.name)
            indegree[node.name] += 1
    heap = [index[n] for n, d in indegree.items() if d == 0]
    heapq.heapify(heap)
    names = [node.name for node in graph_def.node]
    order = []
    while heap:
        name = names[heapq.heappop(heap)]
        order.append(name)
        for s in succ[name]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(heap, index[s])
    if len(order) != len(nodes):
        stuck = next(n for n in names if indegree[n] > 0)
        raise GraphError(f"the graph has a cycle through op {stuck!r}")
    return order


def _input_ops(node: NodeDef) -> list[str]:
    return [i[1:] if i.startswith("^") else TensorRef.parse(i).op for i in node.input]


# ---------------------------------------------------------------------------------------------
# Finding the train op, loss, inputs and variables
# ---------------------------------------------------------------------------------------------
def _collections(meta: MetaGraphDef | None) -> dict[str, tuple[str, ...]]:
    """Collections as names: node_list values as-is, VariableDefs as their variable op names."""
    if meta is None:
        return {}
    from tensorflow.core.framework import variable_pb2

    out: dict[str, tuple[str, ...]] = {}
    for key, col in meta.collection_def.items():
        kind = col.WhichOneof("kind")
        if kind == "node_list":
            out[key] = tuple(col.node_list.value)
        elif kind == "bytes_list" and key in ("variables", "trainable_variables", "local_variables",
                                              "model_variables", "global_step"):
            names = []
            for raw in col.bytes_list.value:
                vd = variable_pb2.VariableDef()
                vd.ParseFromString(raw)
                names.append(TensorRef.parse(vd.variable_name).op)
            out[key] = tuple(names)
    return out


def _find_train_op(graph: Graph, collections: Mapping[str, tuple[str, ...]]) -> str | None:
    for name in collections.get("train_op", ()):
        op_name = TensorRef.parse(name).op
        if op_name in graph:
            return op_name
    training = graph.training_updates()
    updates = [name for name in graph.order if name in training]
    if not updates:
        return None
    # The train op is a sink downstream of the optimizer updates (TF groups them under one final op).
    downstream: set[str] = set()
    stack = list(updates)
    while stack:
        name = stack.pop()
        if name in downstream:
            continue
        downstream.add(name)
        stack.extend(graph.op_consumers(name))
        stack.extend(graph.control_consumers(name))
    sinks = [n for n in graph.order if n in downstream
             and not graph.op_consumers(n) and not graph.control_consumers(n)]
    update_set = set(updates)
    best, best_key = None, None
    for position, name in enumerate(sinks):
        ancestors = graph.ancestors([name])
        # Most updates covered, then the sink that depends on the most (the final op, not a trailing read).
        key = (len(update_set & ancestors), len(ancestors), "train" in name.lower(), -position)
        if best_key is None or key > best_key:
            best, best_key = name, key
    return best


def _find_loss(graph: Graph, collections: Mapping[str, tuple[str, ...]]) -> str | None:
    for key in ("losses", "total_loss"):
        for name in collections.get(key, ()):
            ref = TensorRef.parse(name)
            if ref.op in graph:
                return ref.name
    # tf.gradients seeds the backward pass with Fill(ones) named gradients/grad_ys_N (or gradients/Fill)
    # and differentiates the loss op under the name scope "gradients/<loss op>_grad/".
    for seed in ("gradients/grad_ys_0", "gradients/Fill"):
        if seed not in graph:
            continue
        for consumer in graph.op_consumers(seed):
            rest = consumer[len("gradients/"):] if consumer.startswith("gradients/") else ""
            head = rest.split("_grad/")[0] if "_grad/" in rest else ""
            if head and head in graph:
                op = graph.op(head)
                if op.outputs and op.outputs[0].shape == () and op.outputs[0].base_dtype.startswith(("float", "bfloat", "half")):
                    return f"{head}:0"
    return None


def _find_batch_inputs(graph: Graph, train_op: str | None) -> tuple[str, ...]:
    """Batch sources: placeholders / iterator outputs with rank >= 1 that the train op depends on."""
    reach = graph.ancestors([train_op]) if train_op else set(graph.order)
    out = []
    for op in graph:
        if op.type not in _BATCH_SOURCE_OPS or op.name not in reach:
            continue
        for i, t in enumerate(op.outputs):
            if t.shape is None or len(t.shape) >= 1:
                out.append(f"{op.name}:{i}")
    return tuple(out)


def _batch_size(graph: Graph, inputs: tuple[str, ...]) -> int | None:
    shapes = [graph.tensor(i).shape for i in inputs]
    sizes = {shape[0] for shape in shapes if shape}
    sizes.discard(-1)
    return sizes.pop() if len(sizes) == 1 else None


def _find_variables(graph: Graph, collections: Mapping[str, tuple[str, ...]], train_op: str | None
                    ) -> list[Variable]:
    trainable_names = set(collections.get("trainable_variables", ()))
    updates = graph.training_updates()
    variables = []
    for op in graph:
        if op.type not in opsets.VARIABLE_OPS:
            continue
        kind = "resource" if op.type == "VarHandleOp" else "ref"
        writers, initializer, applied = [], None, False
        for consumer, idx in graph.consumers(op.output(0)):
            ctype = graph.op(consumer).type
            if idx == 0 and opsets.is_variable_writer(ctype):
                writers.append(consumer)
                applied |= consumer in updates
                if initializer is None and ctype in ("Assign", "AssignVariableOp") and consumer == f"{op.name}/Assign":
                    initializer = consumer
        if initializer is None:
            for w in writers:
                if graph.op(w).type in ("Assign", "AssignVariableOp"):
                    initializer = w
                    break
        shape = graph.attr(op.name, "shape") or ()
        dtype = graph.attr(op.name, "dtype") or "float32"
        trainable = op.name in trainable_names if trainable_names else applied
        variables.append(Variable(op.name, kind, dtype, tuple(shape or ()), trainable, tuple(writers),
                                  initializer))
    return variables


__all__ = ["from_graph_def", "from_file", "load_graph_file", "infer_shapes", "measure_shapes",
           "shape_proto_to_tuple"]
