"""A bag-of-words classifier whose embedding table is a PartitionedVariable (fixed_size_partitioner(2),
as parameter-server code shards it), embedding_lookup, mean pooling, a dense layer, Adam."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
VOCAB, SEQ, EMBED = 20, 5, 8


def build():
    tokens = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="tokens")
    labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
    with tf.compat.v1.variable_scope("embedding"):
        table = tf.compat.v1.get_variable("table", [VOCAB, EMBED],
                                          partitioner=tf.compat.v1.fixed_size_partitioner(2))
    embedded = tf.nn.embedding_lookup(table, tokens)
    pooled = tf.reduce_mean(embedded, axis=1)
    hidden = tf.compat.v1.layers.dense(pooled, 10, activation=tf.nn.relu, name="hidden")
    logits = tf.compat.v1.layers.dense(hidden, 3, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.02).minimize(loss, global_step=global_step)
    return (tokens, labels), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    return {inputs[0]: rng.integers(0, VOCAB, (batch, SEQ)).astype(np.int32),
            inputs[1]: rng.integers(0, 3, batch).astype(np.int32)}
