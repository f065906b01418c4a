"""A word-level LSTM language model in the PTB-tutorial style: embeddings, dynamic_rnn over an
LSTMCell, a dense layer over [B, T, H], sparse softmax loss over all B*T tokens, plain SGD."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
VOCAB, SEQ, EMBED, HIDDEN = 20, 5, 8, 12


def build():
    tokens = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="tokens")
    targets = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="targets")
    embedding = tf.compat.v1.get_variable("embedding", [VOCAB, EMBED])
    inputs = tf.nn.embedding_lookup(embedding, tokens)
    cell = tf.compat.v1.nn.rnn_cell.LSTMCell(HIDDEN)
    outputs, _ = tf.compat.v1.nn.dynamic_rnn(cell, inputs, dtype=tf.float32)
    logits = tf.compat.v1.layers.dense(outputs, VOCAB, name="softmax")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.reshape(targets, [-1]), logits=tf.reshape(logits, [-1, VOCAB])))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
    return (tokens, targets), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    seq = rng.integers(0, VOCAB, (batch, SEQ + 1)).astype(np.int32)
    return {inputs[0]: seq[:, :-1], inputs[1]: seq[:, 1:]}
