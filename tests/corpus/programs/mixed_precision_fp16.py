"""Hand-written mixed precision: float32 master weights cast to float16 for the forward pass, float16
activations, logits cast back to float32 for the loss, a constant loss scale of 128 and the gradients
unscaled before Adam."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
LOSS_SCALE = 128.0


def build():
    x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
    y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
    h = tf.cast(x, tf.float16)
    for i, units in enumerate([16, 16, 4]):
        with tf.compat.v1.variable_scope(f"fc{i}"):
            w = tf.compat.v1.get_variable("w", [h.shape[-1], units], tf.float32)
            b = tf.compat.v1.get_variable("b", [units], tf.float32, initializer=tf.zeros_initializer())
            h = tf.matmul(h, tf.cast(w, tf.float16)) + tf.cast(b, tf.float16)
            if i < 2:
                h = tf.nn.relu(h)
    logits = tf.cast(h, tf.float32)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    tvars = tf.compat.v1.trainable_variables()
    scaled = tf.gradients(loss * LOSS_SCALE, tvars)
    grads = [g / LOSS_SCALE for g in scaled]
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).apply_gradients(zip(grads, tvars))
    return (x, y), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.standard_normal((batch, 8)).astype(np.float32),
            inputs[1]: rng.integers(0, 4, batch).astype(np.int32)}
