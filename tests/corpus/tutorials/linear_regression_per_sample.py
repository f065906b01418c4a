"""Linear regression fed one (x, y) pair of Python floats per step, as the tutorial's inner loop does:
no feed is a batch, so there is nothing to split (tag_tf trains it on one device and says so)."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (2,)
REFUSAL = None


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    train_X = rng.uniform(0, 10, 12).astype(np.float32)
    train_Y = (0.3 * train_X + 1.0).astype(np.float32)
    X = tf.compat.v1.placeholder("float")
    Y = tf.compat.v1.placeholder("float")
    W = tf.Variable(0.5, name="weight")
    b = tf.Variable(0.1, name="bias")
    pred = tf.add(tf.multiply(X, W), b)
    cost = tf.reduce_sum(tf.pow(pred - Y, 2)) / (2 * 12)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(cost)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for (x, y) in zip(train_X, train_Y):
            sess.run(optimizer, feed_dict={X: float(x), Y: float(y)})
        return {"W": sess.run(W), "b": sess.run(b)}
