"""A MobileNet-style Keras functional model (conv/BN/ReLU6, depthwise separable block, global pooling)
trained in a TF1 Session with a tf.compat.v1.train optimizer; BN updates from `model.updates`."""
import numpy as np
import tensorflow as tf

BATCH_NORM = True
STEPS = 3


def build():
    layers = tf.keras.layers
    image = tf.keras.Input(shape=(8, 8, 3), name="image")
    h = layers.Conv2D(8, 3, strides=1, padding="same", use_bias=False, name="stem")(image)
    h = layers.BatchNormalization(name="stem_bn")(h, training=True)
    h = layers.ReLU(6.0)(h)
    h = layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw")(h)
    h = layers.BatchNormalization(name="dw_bn")(h, training=True)
    h = layers.ReLU(6.0)(h)
    h = layers.Conv2D(12, 1, use_bias=False, name="pw")(h)
    h = layers.BatchNormalization(name="pw_bn")(h, training=True)
    h = layers.ReLU(6.0)(h)
    h = layers.GlobalAveragePooling2D()(h)
    logits = layers.Dense(5, name="logits")(h)
    model = tf.keras.Model(image, logits, name="mobilenet_like")

    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, model.output)
    optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
    with tf.control_dependencies(model.updates):
        train_op = optimizer.minimize(loss, var_list=model.trainable_weights)
    return (image, labels), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    image, labels = inputs
    return {image: rng.standard_normal((batch, 8, 8, 3)).astype(np.float32),
            labels: rng.integers(0, 5, batch).astype(np.int32)}
