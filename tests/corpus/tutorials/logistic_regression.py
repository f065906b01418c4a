"""Logistic regression in the MNIST-tutorial style: zero-initialised W and b, softmax, cross-entropy,
gradient descent; accuracy built after the training loop and fetched on the test set (50 samples:
not a multiple of 4), then one test example predicted (a batch smaller than the replicas)."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (1, 4)
REFUSAL = None


def data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 12)).astype(np.float32)
    y = np.argmax(x @ np.linspace(-1, 1, 36).reshape(12, 3), 1)
    return x, np.eye(3, dtype=np.float32)[y]


def main(feed=lambda d: d):
    train_x, train_y = data(64, 0)
    test_x, test_y = data(50, 1)
    x = tf.compat.v1.placeholder(tf.float32, [None, 12])
    y = tf.compat.v1.placeholder(tf.float32, [None, 3])
    W = tf.Variable(tf.zeros([12, 3]))
    b = tf.Variable(tf.zeros([3]))
    pred = tf.nn.softmax(tf.matmul(x, W) + b)
    cost = tf.reduce_mean(-tf.reduce_sum(y * tf.math.log(pred + 1e-9), axis=1))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(cost)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(4):
            sess.run([optimizer, cost], feed_dict=feed({x: train_x[i * 16:(i + 1) * 16], y: train_y[i * 16:(i + 1) * 16]}))
        correct_prediction = tf.equal(tf.argmax(pred, 1), tf.argmax(y, 1))
        accuracy = tf.reduce_mean(tf.cast(correct_prediction, tf.float32))
        return {"W": sess.run(W), "b": sess.run(b),
                "accuracy": accuracy.eval({x: test_x, y: test_y}),
                "one_prediction": sess.run(pred, feed_dict={x: test_x[:1]})}
