"""A wide linear model over string categorical columns (a vocabulary list and a hash bucket) in the
feature-column tutorials' style, its weighted sum meeting the labels in the sigmoid loss. The sum's
size along the batch follows sparse values, so tag_tf refuses it before training, naming the op."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (8,)
REFUSAL = r"cannot split this graph's batch consistently: op 'logistic_loss/mul' combines .*weighted_sum"


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    colors = rng.choice(["red", "green", "blue", "gray"], (32, 1))
    cities = rng.choice(["a", "b", "c", "d", "e"], (32, 1))
    labels = rng.integers(0, 2, (32, 1)).astype(np.float32)
    features = {"color": tf.compat.v1.placeholder(tf.string, [None, 1]),
                "city": tf.compat.v1.placeholder(tf.string, [None, 1])}
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    columns = [tf.feature_column.categorical_column_with_vocabulary_list("color", ["red", "green", "blue", "gray"]),
               tf.feature_column.categorical_column_with_hash_bucket("city", 8)]
    logits = tf.compat.v1.feature_column.linear_model(features, columns)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = tf.compat.v1.train.FtrlOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()])
        for step in range(3):
            batch = slice(step * 8, (step + 1) * 8)
            sess.run(train_op, feed_dict=feed({features["color"]: colors[batch], features["city"]: cities[batch],
                                               y: labels[batch]}))
        return {v.op.name: sess.run(v) for v in tf.compat.v1.trainable_variables()}
