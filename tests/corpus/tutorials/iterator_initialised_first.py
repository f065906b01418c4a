"""tf.data from NumPy arrays through placeholders, the iterator initialised as the program's first run,
before the model and its optimizer exist; then the variables are initialised and training reads the
iterator."""
import numpy as np
import tensorflow as tf

ISSUE_CLASS = (6,)
REFUSAL = None


def main(feed=lambda d: d):
    rng = np.random.default_rng(0)
    features = rng.standard_normal((64, 10)).astype(np.float32)
    labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 64)]
    features_placeholder = tf.compat.v1.placeholder(features.dtype, features.shape)
    labels_placeholder = tf.compat.v1.placeholder(labels.dtype, labels.shape)
    dataset = tf.data.Dataset.from_tensor_slices((features_placeholder, labels_placeholder)).batch(16).repeat()
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    sess = tf.compat.v1.Session()
    sess.run(iterator.initializer, feed_dict={features_placeholder: features, labels_placeholder: labels})
    x, y = iterator.get_next()
    logits = tf.compat.v1.layers.dense(x, 3, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=5))
    cost = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(cost)
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(4):
        sess.run(train_op)
    out = {v.op.name: sess.run(v) for v in tf.compat.v1.trainable_variables()}
    sess.close()
    return out
