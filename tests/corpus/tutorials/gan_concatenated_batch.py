"""A GAN discriminator step in a common style: real and generated samples concatenated into one batch,
labelled by one feed of twice the size. tag_tf splits every batch input of a step into the same shares,
so it refuses this graph before training, naming the feeds."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (5,)
REFUSAL = r"batch inputs .*'real:0'.*'noise:0'.*'labels:0'.* do not share one batch size"


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((32, 6)).astype(np.float32)
    real = tf.compat.v1.placeholder(tf.float32, [None, 6], name="real")
    noise = tf.compat.v1.placeholder(tf.float32, [None, 2], name="noise")
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
    with tf.compat.v1.variable_scope("generator"):
        fake = tf.compat.v1.layers.dense(noise, 6)
    with tf.compat.v1.variable_scope("discriminator"):
        logits = tf.compat.v1.layers.dense(tf.concat([real, fake], 0), 1)
    d_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    d_vars = tf.compat.v1.trainable_variables("discriminator")
    train_d = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(d_loss, var_list=d_vars)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(2):
            sess.run(train_d, feed_dict={real: data[step * 8:(step + 1) * 8],
                                         noise: rng.standard_normal((8, 2)).astype(np.float32),
                                         labels: np.concatenate([np.ones((8, 1)), np.zeros((8, 1))]).astype(np.float32)})
        return {v.op.name: sess.run(v) for v in d_vars}
