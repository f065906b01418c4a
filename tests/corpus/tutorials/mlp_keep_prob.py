"""A multilayer perceptron with dropout controlled by a shapeless `keep_prob` placeholder (fed 1.0 so
that the plain and distributed runs draw no random masks), Adam, and an accuracy op built before
training but fetched only after it."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (1, 2)
REFUSAL = None


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    train_x = rng.standard_normal((64, 10)).astype(np.float32)
    train_y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 64)]
    x = tf.compat.v1.placeholder(tf.float32, [None, 10])
    y = tf.compat.v1.placeholder(tf.float32, [None, 3])
    keep_prob = tf.compat.v1.placeholder(tf.float32)
    weights = {"h1": tf.Variable(tf.random.normal([10, 16], seed=1)), "out": tf.Variable(tf.random.normal([16, 3], seed=2))}
    biases = {"b1": tf.Variable(tf.zeros([16])), "out": tf.Variable(tf.zeros([3]))}
    layer_1 = tf.nn.relu(tf.add(tf.matmul(x, weights["h1"]), biases["b1"]))
    layer_1 = tf.nn.dropout(layer_1, rate=1 - keep_prob)
    logits = tf.matmul(layer_1, weights["out"]) + biases["out"]
    loss_op = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(logits=logits, labels=y))
    train_op = tf.compat.v1.train.AdamOptimizer(learning_rate=0.01).minimize(loss_op)
    correct_pred = tf.equal(tf.argmax(logits, 1), tf.argmax(y, 1))
    accuracy = tf.reduce_mean(tf.cast(correct_pred, tf.float32))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(4):
            sess.run(train_op, feed_dict=feed({x: train_x[step * 16:(step + 1) * 16],
                                               y: train_y[step * 16:(step + 1) * 16], keep_prob: 1.0}))
        out = {"h1": sess.run(weights["h1"]), "out": sess.run(weights["out"]), "b1": sess.run(biases["b1"])}
        out["accuracy"] = sess.run(accuracy, feed_dict={x: train_x, y: train_y, keep_prob: 1.0})
        return out
