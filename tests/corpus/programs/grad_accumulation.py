"""Gradient accumulation in non-trainable accumulator variables: every run adds this batch's gradients
(assign_add) and, after that, applies the accumulated average with Momentum."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3


def build():
    x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
    y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
    hidden = tf.compat.v1.layers.dense(x, 10, activation=tf.nn.relu, name="hidden")
    logits = tf.compat.v1.layers.dense(hidden, 3, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))

    tvars = tf.compat.v1.trainable_variables()
    accumulators = [tf.compat.v1.get_variable(v.op.name + "/accum", v.shape, trainable=False,
                                              initializer=tf.zeros_initializer()) for v in tvars]
    count = tf.compat.v1.get_variable("accum_count", [], trainable=False, initializer=tf.zeros_initializer())
    grads = tf.gradients(loss, tvars)
    accumulate = [a.assign_add(g) for a, g in zip(accumulators, grads)] + [count.assign_add(1.0)]
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)
    with tf.control_dependencies(accumulate):
        averaged = [a.read_value() / count.read_value() for a in accumulators]
        train_op = optimizer.apply_gradients(zip(averaged, tvars))
    return (x, y), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.standard_normal((batch, 6)).astype(np.float32),
            inputs[1]: rng.integers(0, 3, batch).astype(np.int32)}
