"""A sequence classifier in the TF1 RNN-tutorial style, built with TF1 control flow (as under
`tf.compat.v1.disable_v2_behavior()`): `tf.compat.v1.nn.dynamic_rnn` (a while loop of Enter, Merge,
Switch, Exit and NextIteration ops) and a `tf.cond` on a training flag."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (3,)
REFUSAL = None
V1_CONTROL_FLOW = True


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    sequences = rng.standard_normal((32, 5, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 32).astype(np.int32)
    x = tf.compat.v1.placeholder(tf.float32, [None, 5, 4])
    y = tf.compat.v1.placeholder(tf.int32, [None])
    training = tf.compat.v1.placeholder_with_default(False, [])
    cell = tf.compat.v1.nn.rnn_cell.BasicRNNCell(8)
    outputs, state = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
    features = tf.cond(training, lambda: state * 1.0, lambda: tf.identity(state))
    logits = tf.compat.v1.layers.dense(features, 3, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=4))
    cost = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(cost)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(3):
            sess.run(train_op, feed_dict=feed({x: sequences[step * 8:(step + 1) * 8],
                                               y: labels[step * 8:(step + 1) * 8], training: True}))
        out = {v.op.name: sess.run(v) for v in tf.compat.v1.trainable_variables()}
        out["cost"] = sess.run(cost, feed_dict={x: sequences, y: labels})
        return out
