"""tf.keras.applications.MobileNet (v1, alpha 0.25, 32x32, random weights, dropout off) called on a
placeholder with training=True, Momentum, BN updates from `model.updates`."""
import numpy as np
import tensorflow as tf

BATCH_NORM = True
# Deep BatchNorm nets at batch 8 with 1x1 final feature maps are chaotic: the noise floor is ~1e-2 (v2)
# and ~5e-5 (v1) after one step but O(1) after three, which would hide any error.
STEPS = 1


def build():
    images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3], name="images")
    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    model = tf.keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=5,
                                            dropout=0.0, classifier_activation=None)
    logits = model(images, training=True)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    with tf.control_dependencies(model.get_updates_for(images)):
        train_op = tf.compat.v1.train.MomentumOptimizer(1e-3, 0.9).minimize(loss, var_list=model.trainable_weights)
    return (images, labels), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.standard_normal((batch, 32, 32, 3)).astype(np.float32),
            inputs[1]: rng.integers(0, 5, batch).astype(np.int32)}
