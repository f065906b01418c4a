"""A GAN in the TF1-tutorial style: generator and discriminator weights as reference variables
(`tf.Variable` under v1 behaviour), one Adam optimizer each, `train_D` and `train_G` run alternately
(the generator step feeds only the noise)."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (7,)
REFUSAL = None


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((32, 6)).astype(np.float32)
    noise = rng.standard_normal((32, 2)).astype(np.float32)
    X = tf.compat.v1.placeholder(tf.float32, [None, 6])
    Z = tf.compat.v1.placeholder(tf.float32, [None, 2])

    def variable(shape, name, seed):
        return tf.compat.v1.Variable(tf.random.normal(shape, stddev=0.1, seed=seed), name=name, use_resource=False)

    G_W = variable([2, 6], "G_W", 1)
    G_b = variable([6], "G_b", 2)
    D_W = variable([6, 1], "D_W", 3)
    D_b = variable([1], "D_b", 4)
    fake = tf.nn.tanh(tf.matmul(Z, G_W) + G_b)
    D_real = tf.matmul(X, D_W) + D_b
    D_fake = tf.matmul(fake, D_W) + D_b
    D_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(D_real), logits=D_real)) + \
        tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.zeros_like(D_fake), logits=D_fake))
    G_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(D_fake), logits=D_fake))
    D_solver = tf.compat.v1.train.AdamOptimizer(0.01).minimize(D_loss, var_list=[D_W, D_b])
    G_solver = tf.compat.v1.train.AdamOptimizer(0.01).minimize(G_loss, var_list=[G_W, G_b])
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for it in range(3):
            batch = slice(it * 8, (it + 1) * 8)
            sess.run([D_solver, D_loss], feed_dict=feed({X: data[batch], Z: noise[batch]}))
            sess.run([G_solver, G_loss], feed_dict=feed({Z: noise[batch]}))
        return dict(zip(["G_W", "G_b", "D_W", "D_b"], sess.run([G_W, G_b, D_W, D_b])))
