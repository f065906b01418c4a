"""Encoder-decoder Transformer (Vaswani et al. 2017, base size) for teacher-forced training.

Post-layer-norm residual blocks as in the paper, sinusoidal positions, separate source/target
embeddings and softmax weights, label-smoothed cross-entropy averaged over non-padding tokens.
Token id 0 is padding; the decoder input is the target shifted right by one with 0 in front.
"""
from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from tag_tf.errors import ModelError
from tag_tf.models import layers
from tag_tf.models.training import BuildOptions, ForwardFn, Inputs, ModelSpec, check_positive, resolve_config


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    num_layers: int = 6             # per stack (encoder and decoder each)
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    # The paper does not give its vocabulary; 40k untied source/target/softmax matrices put the
    # base model at ~106M parameters (~403 MiB), next to the paper's 407 MiB row.
    vocab_size: int = 40000
    share_embeddings: bool = False  # True: one matrix for source, target and softmax weights
    label_smoothing: float = 0.1


TINY = TransformerConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64, vocab_size=100)


def _feed_forward(x: tf.Tensor, cfg: TransformerConfig, rate: float) -> tf.Tensor:
    with tf.compat.v1.variable_scope("ffn"):
        h = layers.dense(x, cfg.d_ff, "dense_1", activation=tf.nn.relu)
        return layers.dense(layers.dropout(h, rate), cfg.d_model, "dense_2")


def _residual(x: tf.Tensor, sublayer_out: tf.Tensor, rate: float, name: str) -> tf.Tensor:
    return layers.layer_norm(x + layers.dropout(sublayer_out, rate), name)


def _embed(ids: tf.Tensor, table: tf.Tensor, length: int, cfg: TransformerConfig, rate: float) -> tf.Tensor:
    """ids [B, T] -> [B*T, d_model]: scaled embedding + sinusoid positions."""
    x = tf.nn.embedding_lookup(table, tf.reshape(ids, [-1])) * math.sqrt(cfg.d_model)
    x = tf.reshape(x, [-1, length, cfg.d_model])
    positions = tf.constant(layers.sinusoid_positions(length, cfg.d_model), dtype=table.dtype)
    x = tf.reshape(x + positions, [-1, cfg.d_model])
    return layers.dropout(x, rate)


def make_forward(opts: BuildOptions, tiny: bool, overrides: dict[str, object]) -> tuple[ForwardFn, dict]:
    cfg = resolve_config("transformer", TINY if tiny else TransformerConfig(), overrides)
    check_positive("transformer", num_layers=cfg.num_layers, d_model=cfg.d_model, num_heads=cfg.num_heads,
                   d_ff=cfg.d_ff, vocab_size=cfg.vocab_size)
    if cfg.d_model % cfg.num_heads or cfg.d_model % 2:
        raise ModelError(f"model 'transformer': d_model {cfg.d_model} must be even and divisible by "
                         f"num_heads {cfg.num_heads}")
    if cfg.vocab_size < 2:
        raise ModelError("model 'transformer': vocab_size must be at least 2 (id 0 is padding)")
    length, rate, dtype = opts.input_size, opts.dropout, opts.tf_dtype

    def forward(inputs: Inputs) -> tf.Tensor:
        source = inputs.add("source_ids", "int32", [length], 1, cfg.vocab_size)
        target = inputs.add("target_ids", "int32", [length], 1, cfg.vocab_size)
        init = tf.compat.v1.random_normal_initializer(stddev=cfg.d_model ** -0.5)
        if cfg.share_embeddings:
            src_table = tgt_table = layers.get_var("shared_embedding", [cfg.vocab_size, cfg.d_model], dtype, init)
        else:
            src_table = layers.get_var("source_embedding", [cfg.vocab_size, cfg.d_model], dtype, init)
            tgt_table = layers.get_var("target_embedding", [cfg.vocab_size, cfg.d_model], dtype, init)

        with tf.compat.v1.variable_scope("encoder"):
            enc_bias = layers.padding_bias(source, dtype)
            x = _embed(source, src_table, length, cfg, rate)
            for i in range(cfg.num_layers):
                with tf.compat.v1.variable_scope(f"layer_{i}"):
                    att = layers.attention(x, x, bias=enc_bias, num_heads=cfg.num_heads, query_len=length,
                                           memory_len=length, dropout_rate=rate, name="self_attention")
                    x = _residual(x, att, rate, "ln_attention")
                    x = _residual(x, _feed_forward(x, cfg, rate), rate, "ln_ffn")
            memory = x

        with tf.compat.v1.variable_scope("decoder"):
            decoder_in = tf.pad(target[:, :-1], [[0, 0], [1, 0]])  # teacher forcing: shift right
            self_bias = layers.causal_bias(length, dtype)
            y = _embed(decoder_in, tgt_table, length, cfg, rate)
            for i in range(cfg.num_layers):
                with tf.compat.v1.variable_scope(f"layer_{i}"):
                    att = layers.attention(y, y, bias=self_bias, num_heads=cfg.num_heads, query_len=length,
                                           memory_len=length, dropout_rate=rate, name="self_attention")
                    y = _residual(y, att, rate, "ln_self_attention")
                    att = layers.attention(y, memory, bias=enc_bias, num_heads=cfg.num_heads, query_len=length,
                                           memory_len=length, dropout_rate=rate, name="encdec_attention")
                    y = _residual(y, att, rate, "ln_encdec_attention")
                    y = _residual(y, _feed_forward(y, cfg, rate), rate, "ln_ffn")

        with tf.compat.v1.variable_scope("softmax"):
            if cfg.share_embeddings:
                logits = tf.matmul(y, tgt_table, transpose_b=True)
            else:
                logits = layers.dense(y, cfg.vocab_size, "output", initializer=init)
        labels = tf.reshape(target, [-1])
        smooth = cfg.label_smoothing
        soft = tf.one_hot(labels, cfg.vocab_size, on_value=1.0 - smooth, off_value=smooth / (cfg.vocab_size - 1))
        xent = tf.nn.softmax_cross_entropy_with_logits(labels=soft, logits=tf.cast(logits, tf.float32))
        weights = tf.cast(tf.not_equal(labels, 0), tf.float32)
        return tf.reduce_sum(xent * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)

    return forward, dataclasses.asdict(cfg)


SPEC = ModelSpec("transformer", batch_size=480, input_size=64, tiny_input_size=8, min_input_size=2,
                 default_dropout=0.1, make_forward=make_forward, input_meaning="sequence length")
