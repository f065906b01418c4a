"""An encoder-decoder with hand-written Luong (dot) attention and teacher forcing: a GRU encoder
(dynamic_rnn), a GRU decoder started from the encoder state, attention scores as a batched matmul of
decoder and encoder outputs, a masked sequence loss, gradient clipping and Adam."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
VOCAB, SEQ, EMBED, HIDDEN = 20, 5, 8, 12
GO = 1


def build():
    source = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="source")
    decoder_in = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="decoder_in")
    decoder_out = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="decoder_out")
    target_mask = tf.compat.v1.placeholder(tf.float32, [None, SEQ], name="target_mask")

    embedding = tf.compat.v1.get_variable("embedding", [VOCAB, EMBED])
    with tf.compat.v1.variable_scope("encoder"):
        enc_cell = tf.compat.v1.nn.rnn_cell.GRUCell(HIDDEN)
        enc_out, enc_state = tf.compat.v1.nn.dynamic_rnn(
            enc_cell, tf.nn.embedding_lookup(embedding, source), dtype=tf.float32)
    with tf.compat.v1.variable_scope("decoder"):
        dec_cell = tf.compat.v1.nn.rnn_cell.GRUCell(HIDDEN)
        dec_out, _ = tf.compat.v1.nn.dynamic_rnn(
            dec_cell, tf.nn.embedding_lookup(embedding, decoder_in), initial_state=enc_state)
    with tf.compat.v1.variable_scope("attention"):
        scores = tf.matmul(dec_out, enc_out, transpose_b=True)          # [B, Td, Te]
        alignments = tf.nn.softmax(scores, axis=-1)
        context = tf.matmul(alignments, enc_out)                       # [B, Td, H]
        attentional = tf.compat.v1.layers.dense(tf.concat([dec_out, context], axis=-1), HIDDEN,
                                                activation=tf.tanh, use_bias=False, name="attention_layer")
    logits = tf.compat.v1.layers.dense(attentional, VOCAB, name="output_projection")
    crossent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=decoder_out, logits=logits)
    loss = tf.reduce_sum(crossent * target_mask) / tf.reduce_sum(target_mask)

    params = tf.compat.v1.trainable_variables()
    gradients = tf.gradients(loss, params)
    clipped, _ = tf.clip_by_global_norm(gradients, 5.0)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(0.01).apply_gradients(zip(clipped, params), global_step=global_step)
    return (source, decoder_in, decoder_out, target_mask), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    source, decoder_in, decoder_out, target_mask = inputs
    src = rng.integers(2, VOCAB, (batch, SEQ)).astype(np.int32)
    tgt = src[:, ::-1].copy()
    lengths = rng.integers(2, SEQ + 1, batch)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.float32)
    dec_in = np.concatenate([np.full((batch, 1), GO, np.int32), tgt[:, :-1]], axis=1)
    return {source: src, decoder_in: dec_in, decoder_out: tgt, target_mask: mask}
