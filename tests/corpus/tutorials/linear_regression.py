"""Linear regression in the classic tutorial style: `tf.placeholder("float")` for X and Y (no rank),
a learning rate fed through a shapeless placeholder, the whole training set fed each epoch, and the
cost fetched after training."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (2,)
REFUSAL = None


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    train_X = rng.uniform(0, 10, 24).astype(np.float32)
    train_Y = (0.3 * train_X + 1.0 + rng.normal(0, 0.1, 24)).astype(np.float32)
    n_samples = train_X.shape[0]
    X = tf.compat.v1.placeholder("float")
    Y = tf.compat.v1.placeholder("float")
    learning_rate = tf.compat.v1.placeholder(tf.float32)
    W = tf.Variable(0.5, name="weight")
    b = tf.Variable(0.1, name="bias")
    pred = tf.add(tf.multiply(X, W), b)
    cost = tf.reduce_sum(tf.pow(pred - Y, 2)) / (2 * n_samples)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate).minimize(cost)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for epoch in range(4):
            sess.run(optimizer, feed_dict=feed({X: train_X, Y: train_Y, learning_rate: 0.01}))
        training_cost = sess.run(cost, feed_dict={X: train_X, Y: train_Y})
        return {"W": sess.run(W), "b": sess.run(b), "cost": training_cost}
