"""A tiny AlexNet-shaped tf-slim net (arg_scope, conv2d, max_pool2d, flatten, fully_connected with
dropout off), L2 regularisation, slim.losses total loss and slim.learning.create_train_op."""
import numpy as np
import tensorflow as tf
import tf_slim as slim

BATCH_NORM = False
STEPS = 3


def build():
    images = tf.compat.v1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    with slim.arg_scope([slim.conv2d, slim.fully_connected], activation_fn=tf.nn.relu,
                        weights_regularizer=slim.l2_regularizer(1e-4),
                        weights_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1)):
        net = slim.conv2d(images, 8, [3, 3], scope="conv1")
        net = slim.max_pool2d(net, [2, 2], scope="pool1")
        net = slim.conv2d(net, 12, [3, 3], scope="conv2")
        net = slim.max_pool2d(net, [2, 2], scope="pool2")
        net = slim.flatten(net)
        net = slim.fully_connected(net, 16, scope="fc6")
        net = slim.dropout(net, 0.5, is_training=False, scope="dropout6")
        logits = slim.fully_connected(net, 5, activation_fn=None, scope="fc8")
    one_hot = tf.one_hot(labels, 5)
    slim.losses.softmax_cross_entropy(logits, one_hot)
    total_loss = slim.losses.get_total_loss()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    train_op = slim.learning.create_train_op(total_loss, optimizer)
    return (images, labels), train_op, total_loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.standard_normal((batch, 8, 8, 3)).astype(np.float32),
            inputs[1]: rng.integers(0, 5, batch).astype(np.int32)}
