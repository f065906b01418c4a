"""Replication semantics of individual ops on small hand-built graphs (the traps included)."""
from __future__ import annotations

import pytest
import tensorflow as tf

from tag_tf.analysis.annotate import annotate_graph
from tag_tf.analysis.batch_dims import compare
from tag_tf.analysis.states import Category, Flag, Kind
from tag_tf.ir import from_graph_def

B1, B2 = 6, 9


def annotations(body, exact=False):
    """Build `body(x, y)` at two batch sizes (x: [B, 4, 5] float, y: [B] int) and annotate."""
    graphs = []
    for b in (B1, B2):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [b, 4, 5], name="x")
            y = tf.compat.v1.placeholder(tf.int32, [b], name="y")
            w = tf.compat.v1.get_variable("w", [5, 3], use_resource=True)
            out = body(x, y, w)
            # Every probe also trains w, so the graph always has gradients.
            loss = tf.add(tf.reduce_mean(tf.square(out)),
                          tf.reduce_mean(tf.matmul(tf.reshape(x, [-1, 5]), w)), name="loss")
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        graphs.append(from_graph_def(g.as_graph_def()))
    batch = compare(graphs[0], graphs[1], B1, B2)
    return graphs[0], annotate_graph(graphs[0], batch, exact_batch_stats=exact)


def op_of(graph, op_type, prefix=""):
    return next(op.name for op in graph if op.type == op_type and op.name.startswith(prefix))


def test_matmul_forward_split_and_weight_gradient_partial():
    g, ann = annotations(lambda x, y, w: tf.matmul(tf.reshape(x, [-1, 5]), w))
    fwd = ann[op_of(g, "MatMul", "MatMul")]
    assert fwd.category is Category.CONCAT and fwd.outputs[0].kind is Kind.SPLIT
    assert fwd.outputs[0].mult == 4                     # [B*4, 3]: four rows per sample
    grad = next(a for n, a in ann.items() if g.op(n).type == "MatMul" and a.rule == "matmul-contract-batch")
    assert grad.category is Category.SUM and grad.outputs[0].kind is Kind.PARTIAL
    apply = ann[op_of(g, "ResourceApplyGradientDescent")]
    assert all(s.kind is Kind.FULL for s in apply.requires)      # gradients aggregated before the update


def test_reshape_keeps_batch_outermost_only():
    ok_g, ok = annotations(lambda x, y, w: tf.matmul(tf.reshape(x, [-1, 5]), w))
    assert ok[op_of(ok_g, "Reshape", "Reshape")].outputs[0].kind is Kind.SPLIT
    # [B,4,5] -> [4,B,5] -> [4B,5]: the batch is no longer the outer factor: rows interleave.
    g, ann = annotations(lambda x, y, w: tf.matmul(tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, 5]), w))
    bad = ann[op_of(g, "Reshape", "Reshape")]
    assert bad.category is Category.OTHER and all(s.kind is Kind.FULL for s in bad.requires[:1])


def test_reshape_target_built_from_constants_keeps_the_split():
    """tf.stack([-1, n]) with n a constant reads no batch value: the shards reshape on their own
    (a computed target that reads the batch, e.g. a partitioned lookup's Shape, runs whole instead:
    tests/corpus partitioned_embeddings)."""
    g, ann = annotations(lambda x, y, w: tf.matmul(tf.reshape(x, tf.stack([-1, tf.constant(5)])), w))
    reshape = ann[op_of(g, "Reshape", "Reshape")]
    assert reshape.rule == "reshape-batch-outer" and reshape.outputs[0].kind is Kind.SPLIT


@pytest.mark.parametrize("body, expect_split", [
    (lambda x, y, w: tf.concat([x, x], axis=2), True),       # features: fine
    (lambda x, y, w: tf.concat([x, x], axis=0), False),      # along the batch: reorders rows
    (lambda x, y, w: tf.tile(x, [1, 2, 1]), True),
    (lambda x, y, w: tf.tile(x, [2, 1, 1]), False),          # repeats the whole batch
    (lambda x, y, w: x[:, 0], True),
    (lambda x, y, w: x[::-1], False),                        # reverses the samples
])
def test_ops_that_may_mix_samples(body, expect_split):
    g, ann = annotations(lambda x, y, w: tf.identity(body(x, y, w), name="probe"))
    producer = g.op("probe").inputs[0].op
    a = ann[producer]
    assert (a.outputs[0].kind is Kind.SPLIT) == expect_split, (g.op(producer).type, a.rule)


def test_reductions():
    g, ann = annotations(lambda x, y, w: tf.stack([tf.reduce_mean(x, name="m"), tf.reduce_max(x, name="mx"),
                                                  tf.reduce_sum(x, axis=[1, 2], name="per_sample")[0]]))
    assert Flag.MEAN_SCALE in ann["m"].flags and ann["m"].outputs[0].kind is Kind.PARTIAL
    assert ann["mx"].category is Category.OTHER
    assert ann["per_sample"].outputs[0].kind is Kind.SPLIT


def test_shape_values_are_local_and_globalised_for_data():
    def body(x, y, w):
        # raw Shape: tf.shape() of a statically shaped tensor folds to a Const.
        n = tf.cast(tf.raw_ops.Shape(input=x)[0], tf.float32, name="n")
        return x / n
    g, ann = annotations(body)
    shape = ann[op_of(g, "Shape", "Shape")]
    assert shape.outputs[0].kind is Kind.LOCAL
    cast = ann["n"]
    assert cast.requires[0].kind is Kind.FULL                      # a float needs the global count


def test_batch_norm_statistics():
    def body(x, y, w):
        scale = tf.compat.v1.get_variable("gamma", [1], initializer=tf.ones_initializer(), use_resource=True)
        offset = tf.compat.v1.get_variable("beta", [1], initializer=tf.zeros_initializer(), use_resource=True)
        out, _, _ = tf.compat.v1.nn.fused_batch_norm(tf.expand_dims(x, -1), scale, offset, is_training=True)
        return out
    g, ann = annotations(body)
    bn = ann[op_of(g, "FusedBatchNormV3")]
    assert Flag.BATCH_STATS in bn.flags and bn.outputs[0].kind is Kind.SPLIT
    g, ann = annotations(body, exact=True)
    assert ann[op_of(g, "FusedBatchNormV3")].category is Category.OTHER


def test_local_row_gather():
    """BERT's masked-LM pattern: rows picked from a flattened [B*T, H] tensor with offsets built
    from tf.range(batch) * T."""
    def body(x, y, w):
        flat = tf.reshape(x, [-1, 5])
        batch = tf.raw_ops.Shape(input=x)[0]
        offsets = tf.reshape(tf.range(0, batch) * 4, [-1, 1])
        positions = tf.reshape(tf.stack([y % 4, (y + 1) % 4], axis=1) + offsets, [-1])
        return tf.gather(flat, positions, name="picked")
    g, ann = annotations(body)
    assert ann[op_of(g, "Range")].outputs[0].kind is Kind.LOCAL
    picked = ann["picked"]
    assert picked.rule == "gather-local-rows" and picked.outputs[0].kind is Kind.SPLIT
    assert picked.requires[1].kind is Kind.LOCAL
