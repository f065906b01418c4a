"""A regression MLP whose loss is a per-example reduce_sum over the last axis then a reduce_mean,
with a dropout layer switched off (training=False), L2 weight regularisation through
tf.compat.v1.losses.get_regularization_loss, and RMSProp."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3


def build():
    x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
    target = tf.compat.v1.placeholder(tf.float32, [None, 4], name="target")
    reg = tf.keras.regularizers.l2(1e-3)
    h = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.elu, kernel_regularizer=reg, name="fc1")
    h = tf.compat.v1.layers.dropout(h, rate=0.5, training=False)
    h = tf.compat.v1.layers.dense(h, 16, activation=tf.nn.elu, kernel_regularizer=reg, name="fc2")
    prediction = tf.compat.v1.layers.dense(h, 4, name="out")
    per_example = tf.reduce_sum(tf.square(prediction - target), axis=-1)
    loss = tf.reduce_mean(per_example) + tf.compat.v1.losses.get_regularization_loss()
    train_op = tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5).minimize(loss)
    return (x, target), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((batch, 6)).astype(np.float32)
    return {inputs[0]: x, inputs[1]: np.tanh(x[:, :4] * 2.0 + 0.1 * rng.standard_normal((batch, 4))).astype(np.float32)}
