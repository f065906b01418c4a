"""The tutorials' hand-written SGD: tf.Variable weights, tf.gradients, `w.assign_sub(lr * g)` grouped,
no Optimizer class (a softmax regression with one hidden layer)."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3


def build():
    x = tf.compat.v1.placeholder(tf.float32, [None, 10], name="x")
    y_ = tf.compat.v1.placeholder(tf.float32, [None, 3], name="y_")
    W1 = tf.Variable(tf.random.truncated_normal([10, 12], stddev=0.1), name="W1")
    b1 = tf.Variable(tf.constant(0.1, shape=[12]), name="b1")
    W2 = tf.Variable(tf.random.truncated_normal([12, 3], stddev=0.1), name="W2")
    b2 = tf.Variable(tf.zeros([3]), name="b2")
    h = tf.nn.sigmoid(tf.matmul(x, W1) + b1)
    y = tf.nn.softmax(tf.matmul(h, W2) + b2)
    cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf.math.log(y + 1e-8), axis=1))
    params = [W1, b1, W2, b2]
    grads = tf.gradients(cross_entropy, params)
    lr = 0.5
    train_op = tf.group(*[p.assign_sub(lr * g) for p, g in zip(params, grads)])
    return (x, y_), train_op, cross_entropy


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.standard_normal((batch, 10)).astype(np.float32),
            inputs[1]: np.eye(3, dtype=np.float32)[rng.integers(0, 3, batch)]}
