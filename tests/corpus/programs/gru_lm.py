"""A GRU language model unrolled with static_rnn over tf.unstack'ed time steps, the per-step outputs
stacked back and projected, sequence loss with tf.compat.v1.losses, Adam and a global step."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
VOCAB, SEQ, EMBED, HIDDEN = 20, 5, 8, 12


def build():
    tokens = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="tokens")
    targets = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="targets")
    with tf.compat.v1.variable_scope("model"):
        embedding = tf.compat.v1.get_variable("embedding", [VOCAB, EMBED])
        inputs = tf.unstack(tf.nn.embedding_lookup(embedding, tokens), num=SEQ, axis=1)
        cell = tf.compat.v1.nn.rnn_cell.GRUCell(HIDDEN)
        outputs, _ = tf.compat.v1.nn.static_rnn(cell, inputs, dtype=tf.float32)
        output = tf.reshape(tf.stack(outputs, axis=1), [-1, HIDDEN])
        softmax_w = tf.compat.v1.get_variable("softmax_w", [HIDDEN, VOCAB])
        softmax_b = tf.compat.v1.get_variable("softmax_b", [VOCAB], initializer=tf.zeros_initializer())
        logits = tf.matmul(output, softmax_w) + softmax_b
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(tf.reshape(targets, [-1]), logits)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
    return (tokens, targets), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    seq = rng.integers(0, VOCAB, (batch, SEQ + 1)).astype(np.int32)
    return {inputs[0]: seq[:, :-1], inputs[1]: seq[:, 1:]}
