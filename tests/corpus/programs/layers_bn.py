"""A tf.compat.v1.layers conv net with batch_normalization(training=True), the UPDATE_OPS control
dependency idiom, max pooling, flatten, dense and a Momentum optimizer."""
import numpy as np
import tensorflow as tf

BATCH_NORM = True
STEPS = 3


def build():
    images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
    labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
    net = tf.compat.v1.layers.conv2d(images, 8, 3, padding="same", use_bias=False, name="conv1")
    net = tf.compat.v1.layers.batch_normalization(net, training=True, name="bn1")
    net = tf.nn.relu(net)
    net = tf.compat.v1.layers.max_pooling2d(net, 2, 2)
    net = tf.compat.v1.layers.conv2d(net, 8, 3, padding="same", activation=tf.nn.relu, name="conv2")
    net = tf.compat.v1.layers.flatten(net)
    logits = tf.compat.v1.layers.dense(net, 4, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9)
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        train_op = optimizer.minimize(loss, global_step=global_step)
    return (images, labels), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.standard_normal((batch, 8, 8, 3)).astype(np.float32),
            inputs[1]: rng.integers(0, 4, batch)}
