"""Gradient accumulation as forum answers write it: buffers zeroed by one run, gradients `assign_add`ed
by a run per micro-batch, and the accumulated average applied with Adam by a separate run every 2 steps."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (7,)
REFUSAL = None
ACCUMULATE = 2


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 6)).astype(np.float32)
    ys = rng.integers(0, 3, 64).astype(np.int64)
    x = tf.compat.v1.placeholder(tf.float32, [None, 6])
    y = tf.compat.v1.placeholder(tf.int64, [None])
    init = tf.compat.v1.glorot_uniform_initializer(seed=6)
    hidden = tf.compat.v1.layers.dense(x, 8, tf.nn.relu, kernel_initializer=init)
    logits = tf.compat.v1.layers.dense(hidden, 3, kernel_initializer=init)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    tvars = tf.compat.v1.trainable_variables()
    accum_vars = [tf.compat.v1.Variable(tf.zeros(v.shape), trainable=False) for v in tvars]
    zero_ops = [a.assign(tf.zeros_like(a)) for a in accum_vars]
    gvs = optimizer.compute_gradients(loss, tvars)
    accum_ops = [accum_vars[i].assign_add(g) for i, (g, v) in enumerate(gvs)]
    train_step = optimizer.apply_gradients([(accum_vars[i] / ACCUMULATE, v) for i, (g, v) in enumerate(gvs)])
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(3):
            sess.run(zero_ops)
            for k in range(ACCUMULATE):
                i = (step * ACCUMULATE + k) * 8
                sess.run(accum_ops, feed_dict=feed({x: xs[i:i + 8], y: ys[i:i + 8]}))
            sess.run(train_step)
        return {v.op.name: sess.run(v) for v in tvars}
