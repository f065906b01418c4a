"""Fetching a whole-valued replicated tensor runs every replica (tf-slim's create_train_op hang)."""
from __future__ import annotations

import numpy as np

from tag_tf.analysis import analyze
from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.ir import from_graph_def
from tag_tf.profile.weights import reference_weights
from tag_tf.strategy import Option, Strategy


def test_fetching_a_train_tensor_with_update_dependencies_does_not_hang():
    """`losses.sparse_softmax_cross_entropy` all-reduces its weights count, so the loss is whole on
    every replica; `with_dependencies([updates], loss)` (slim.learning.create_train_op) makes each
    replica's copy wait for that replica's updates and so its collectives. Fetching replica 0's copy
    alone left replica 1's collectives unissued: the step waited forever. With an operation
    timeout, the old graph fails in seconds instead of passing."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(3)
        x = tf.compat.v1.placeholder(tf.float32, [None, 12], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        h = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.relu)
        logits = tf.compat.v1.layers.dense(h, 5)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits)
        update = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.control_dependencies([update]):
            train = tf.identity(loss, name="train_tensor")
        init = tf.compat.v1.global_variables_initializer()
    with g.as_default():
        meta = tf.compat.v1.train.export_meta_graph(graph=g)
    ir = from_graph_def(g.as_graph_def(), meta, train_op="train_tensor")
    analysis = analyze(PassContext(), ir, batch_size=8, weight_fn=reference_weights)
    dp = Strategy.uniform(len(analysis.grouping.groups), (0, 1), Option.ALLREDUCE)
    compiled = compile_strategy(PassContext(), analysis, dp, DeviceMap.local_cpus(2), check=True,
                                fetches=["train_tensor:0"], run_ops=[init.name])
    rng = np.random.default_rng(0)
    feeds = [{"x:0": rng.standard_normal((8, 12), dtype=np.float32), "y:0": rng.integers(0, 5, 8)}
             for _ in range(3)]
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(init)
        plain = [sess.run(train, f) for f in feeds]
    dist = tf.Graph()
    with dist.as_default():
        tf.graph_util.import_graph_def(compiled.graph_def, name="")
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2}, operation_timeout_in_ms=20_000)
    with tf.compat.v1.Session(graph=dist, config=config) as sess:
        sess.run(compiled.run_ops[init.name])
        got = [sess.run(compiled.fetch_tensors["train_tensor:0"], f) for f in feeds]
    np.testing.assert_allclose(got, plain, rtol=1e-5)
