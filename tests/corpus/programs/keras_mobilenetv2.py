"""tf.keras.applications.MobileNetV2 (alpha 0.35, 32x32, random weights) called on a placeholder with
training=True; Momentum (Adam would turn the rounding noise in the exactly-zero gradients of BN betas that
feed another BN into full-size steps); BN updates as a control dependency on `model.get_updates_for`."""
import numpy as np
import tensorflow as tf

BATCH_NORM = True
# Deep BatchNorm nets at batch 8 with 1x1 final feature maps are chaotic: the noise floor is ~1e-2 (v2)
# and ~5e-5 (v1) after one step but O(1) after three, which would hide any error.
STEPS = 1
SIZE = 32


def build():
    images = tf.compat.v1.placeholder(tf.float32, [None, SIZE, SIZE, 3], name="images")
    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    model = tf.keras.applications.MobileNetV2(input_shape=(SIZE, SIZE, 3), alpha=0.35, weights=None,
                                              classes=5, classifier_activation=None)
    logits = model(images, training=True)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    updates = model.get_updates_for(images)
    with tf.control_dependencies(updates):
        train_op = tf.compat.v1.train.MomentumOptimizer(1e-3, 0.9).minimize(loss, var_list=model.trainable_weights)
    return (images, labels), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    images, labels = inputs
    return {images: rng.standard_normal((batch, SIZE, SIZE, 3)).astype(np.float32),
            labels: rng.integers(0, 5, batch).astype(np.int32)}
