"""A linear model over categorical columns (what LinearClassifier builds): identity and hashed
categorical columns plus a numeric one through tf.compat.v1.feature_column.linear_model (sparse
weighted sums), sigmoid loss, FTRL."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
BUCKETS = 20


def build():
    features = {"item": tf.compat.v1.placeholder(tf.int64, [None, 2], name="item"),
                "country": tf.compat.v1.placeholder(tf.string, [None, 1], name="country"),
                "price": tf.compat.v1.placeholder(tf.float32, [None, 1], name="price")}
    label = tf.compat.v1.placeholder(tf.float32, [None, 1], name="label")
    columns = [tf.feature_column.categorical_column_with_identity("item", num_buckets=BUCKETS),
               tf.feature_column.categorical_column_with_hash_bucket("country", hash_bucket_size=7),
               tf.feature_column.numeric_column("price")]
    with tf.compat.v1.variable_scope("linear"):
        logits = tf.compat.v1.feature_column.linear_model(features, columns)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.001).minimize(
        loss, global_step=global_step)
    return (features["item"], features["country"], features["price"], label), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    item, country, price, label = inputs
    return {item: rng.integers(0, BUCKETS, (batch, 2)),
            country: rng.choice(np.array([b"fr", b"de", b"us", b"jp"], dtype=object), (batch, 1)),
            price: rng.standard_normal((batch, 1)).astype(np.float32),
            label: rng.integers(0, 2, (batch, 1)).astype(np.float32)}
