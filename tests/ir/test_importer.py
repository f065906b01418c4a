"""The IR built from real TF graphs: ops, shapes, variables, train op/loss/inputs, files, errors."""
from __future__ import annotations

import pytest
from conftest import hand_built, zoo

from tag_tf.errors import GraphError
from tag_tf.ir import TensorRef, from_file, from_graph_def, load_graph_file


def test_small_graph_structure(small_graph):
    g = small_graph
    assert g.meta.train_op == "train_op"
    assert g.meta.loss == "loss:0"
    assert g.meta.feeds == ("x:0", "y:0")
    assert g.meta.batch_size == 8
    assert g.tensor("MatMul:0").shape == (8, 3)
    assert g.tensor("loss:0").shape == ()
    trainable = {v.name for v in g.variables.values() if v.trainable}
    assert trainable == {"w", "b"}
    w = g.variables["w"]
    assert w.kind == "resource" and w.shape == (4, 3) and w.initializer == "w/Assign"
    assert any(g.op(x).type == "ResourceApplyAdam" for x in w.writers)
    # Topological order: every input comes before its consumer.
    pos = {n: i for i, n in enumerate(g.order)}
    for op in g:
        for ref in op.inputs:
            assert pos[ref.op] < pos[op.name]
        for c in op.control_inputs:
            assert pos[c] < pos[op.name]


def test_ref_variables_and_colocation():
    g = hand_built(8, resource=False)
    w = g.variables["w"]
    assert w.kind == "ref"
    assert g.tensor("w:0").is_ref
    assert any(g.op(x).type == "ApplyAdam" for x in w.writers)
    assert "w" in g.op("w/read").colocate_with


def test_shape_override(small_graph):
    dyn = hand_built(None)
    assert dyn.meta.batch_size is None and dyn.tensor("MatMul:0").shape == (-1, 3)
    at5 = from_graph_def(dyn.to_graph_def(), input_shapes={"x:0": (5, 4), "y:0": (5,)})
    assert at5.tensor("MatMul:0").shape == (5, 3)
    assert at5.meta.batch_size == 5
    # A static graph has its batch size folded into constants: overriding it cannot type-check.
    with pytest.raises(GraphError, match="shape inference failed"):
        from_graph_def(small_graph.to_graph_def(), input_shapes={"x:0": (5, 4), "y:0": (5,)})


def test_fingerprint_is_stable(small_graph):
    assert small_graph.fingerprint == from_graph_def(small_graph.to_graph_def()).fingerprint
    assert small_graph.fingerprint != hand_built(7).fingerprint


def test_zoo_model_meta_graph_collections():
    model, graph, _ = zoo("mlp")
    assert graph.meta.train_op == model.train_op
    assert graph.meta.loss == TensorRef.parse(model.loss).name
    assert set(graph.meta.feeds) == {f"{s.name}:0" for s in model.inputs}
    assert sum(1 for v in graph.variables.values() if v.trainable) > 0


@pytest.mark.parametrize("fmt", ["pb", "pbtxt", "meta"])
def test_graph_files_round_trip(tmp_path, fmt):
    import tensorflow as tf

    model, graph, _ = zoo("mlp")
    path = tmp_path / f"g.{fmt}"
    if fmt == "pb":
        path.write_bytes(model.graph_def.SerializeToString())
    elif fmt == "pbtxt":
        tf.io.write_graph(model.graph_def, str(tmp_path), "g.pbtxt", as_text=True)
    else:
        path.write_bytes(model.meta_graph_def.SerializeToString())
    gd, meta = load_graph_file(str(path))
    assert len(gd.node) == len(model.graph_def.node)
    assert (meta is not None) == (fmt == "meta")
    loaded = from_file(str(path))
    assert loaded.meta.train_op == graph.meta.train_op
    assert len(loaded) == len(graph)


def test_bad_files(tmp_path):
    with pytest.raises(GraphError, match="no such graph file"):
        load_graph_file(str(tmp_path / "missing.pb"))
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\x00\x01not a graph")
    with pytest.raises(GraphError, match="junk.pb"):
        load_graph_file(str(junk))
    other = tmp_path / "g.onnx"
    other.write_bytes(b"x")
    with pytest.raises(GraphError, match="unknown graph file type"):
        load_graph_file(str(other))


def test_graph_without_train_op(tmp_path):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 2], name="x")
        tf.reduce_sum(x * 2.0, name="out")
    path = tmp_path / "inference.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    with pytest.raises(GraphError, match="no train op"):
        from_file(str(path))


def test_dangling_input_is_reported():
    from tensorflow.core.framework import graph_pb2

    gd = graph_pb2.GraphDef()
    node = gd.node.add()
    node.name, node.op = "a", "Identity"
    node.input.append("missing:0")
    with pytest.raises(GraphError, match="missing"):
        from_graph_def(gd, require_train_op=False)


def _cond_graph():
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 2], name="x")
        w = tf.compat.v1.get_variable("w", [2, 1])
        step = tf.compat.v1.train.get_or_create_global_step()
        y = tf.cond(step > 3, lambda: tf.matmul(x, w), lambda: tf.matmul(x, w) * 2.0)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(y, name="loss"),
                                                                  global_step=step, name="train_op")
    return g


def test_fingerprint_ignores_function_counters_and_shape_annotations():
    """TF names cond/while functions with process-wide counters: the same model rebuilt in one
    process, or exported with shapes, must keep its fingerprint (it keys the plan cache)."""
    g1, g2 = _cond_graph(), _cond_graph()
    names = lambda g: {f.signature.name for f in g.as_graph_def().library.function}
    assert names(g1) != names(g2)
    fingerprints = {from_graph_def(g1.as_graph_def()).fingerprint, from_graph_def(g2.as_graph_def()).fingerprint,
                    from_graph_def(g1.as_graph_def(add_shapes=True)).fingerprint}
    assert len(fingerprints) == 1


def _keras_graph(seed: int, units: int = 4, initial: float = 0.0):
    """A tf.keras Dense layer in graph mode: Keras 2.15 draws its initialiser's seed from `random`."""
    import random

    import tensorflow as tf

    random.seed(seed)
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.keras.layers.Dense(units)(x)
        shift = tf.compat.v1.get_variable("shift", [], initializer=tf.constant_initializer(initial))
        loss = tf.reduce_mean(tf.square(y + shift), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    return from_graph_def(g.as_graph_def())


def test_fingerprint_ignores_values_only_initialisation_reads():
    """Keras seeds its initialisers from Python's `random`: one script builds other seed constants in
    every process. Values only variable initialisers read do not change the computation (sessions
    load every variable anyway): the fingerprint ignores them, and nothing else."""
    a, b = _keras_graph(1), _keras_graph(2)
    seeds = [n for n in a.initial_value_ops() if a.op(n).type == "Const" and "seed" in n]
    assert seeds and all(a.attr(n, "value").tolist() != b.attr(n, "value").tolist() for n in seeds)
    assert a.fingerprint == b.fingerprint
    assert _keras_graph(1, initial=5.0).fingerprint == a.fingerprint          # another initial value
    assert _keras_graph(1, units=5).fingerprint != a.fingerprint             # another model
    # What training reads is never an initial value (the loss, the learning rate, the inputs).
    train = a.ancestors([a.meta.train_op])
    assert not (a.initial_value_ops() & train)


def test_queue_inputs_get_shapes_from_the_queue():
    import tensorflow as tf

    from tag_tf.analysis import analyze
    from tag_tf.analysis.analyzer import uniform_weights
    from tag_tf.analysis.states import Kind
    from tag_tf.context import PassContext

    g = tf.Graph()
    with g.as_default():
        q = tf.queue.FIFOQueue(100, [tf.float32, tf.int32], shapes=[[4], []])
        q.enqueue_many([tf.random.normal([32, 4]), tf.zeros([32], tf.int32)])
        x, y = q.dequeue_many(8)
        w = tf.compat.v1.get_variable("w", [4, 3])
        logits = tf.matmul(x, w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
    ir = from_graph_def(g.as_graph_def())
    assert len(ir.meta.feeds) == 2 and ir.meta.batch_size == 8
    assert ir.tensor(logits.name).shape == (8, 3)
    a = analyze(PassContext(), ir, weight_fn=uniform_weights)
    assert a.unclassified() == []
    assert a.annotations[logits.op.name].outputs[0].kind is Kind.SPLIT
