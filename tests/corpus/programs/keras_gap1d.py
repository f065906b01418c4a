"""A Keras text classifier: Embedding, Conv1D, GlobalAveragePooling1D, Dense; Keras loss object,
RMSProp from tf.compat.v1.train."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
VOCAB, SEQ = 20, 5


def build():
    layers = tf.keras.layers
    tokens = tf.keras.Input(shape=(SEQ,), dtype=tf.int32, name="tokens")
    h = layers.Embedding(VOCAB, 8, name="embedding")(tokens)
    h = layers.Conv1D(12, 3, padding="same", activation="relu", name="conv")(h)
    h = layers.GlobalAveragePooling1D()(h)
    h = layers.Dense(8, activation="tanh", name="hidden")(h)
    logits = layers.Dense(3, name="logits")(h)
    model = tf.keras.Model(tokens, logits)

    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    train_op = tf.compat.v1.train.RMSPropOptimizer(0.01).minimize(loss, var_list=model.trainable_weights)
    return (tokens, labels), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    tokens, labels = inputs
    return {tokens: rng.integers(0, VOCAB, (batch, SEQ)).astype(np.int32),
            labels: rng.integers(0, 3, batch).astype(np.int32)}
