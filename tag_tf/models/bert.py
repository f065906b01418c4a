"""BERT pre-training graph (Devlin et al. 2019): encoder + masked-LM + next-sentence losses.

Our own TF1 code. Post-layer-norm encoder with exact GELU, learned positions and token types,
masked-LM head tied to the word embeddings. Masked positions are gathered from the flattened
[B*T, H] sequence output with offsets tf.range(batch) * seq_length, batch read at run time from a
Shape op, so the graph carries that dynamic-shape pattern even when the batch is static.
"""
from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from tag_tf.errors import ModelError
from tag_tf.models import layers
from tag_tf.models.training import BuildOptions, ForwardFn, Inputs, ModelSpec, check_positive, resolve_config


@dataclasses.dataclass(frozen=True)
class BertConfig:
    num_layers: int = 12
    hidden: int = 768
    num_heads: int = 12
    intermediate: int = 3072
    vocab_size: int = 30522
    max_position: int = 512
    type_vocab_size: int = 2
    max_predictions: int | None = None   # masked positions per sequence; None: ceil(0.15 * seq_length)
    initializer_range: float = 0.02


SMALL = BertConfig(num_layers=4, hidden=512, num_heads=8, intermediate=2048)
LARGE = BertConfig(num_layers=24, hidden=1024, num_heads=16, intermediate=4096)
TINY = BertConfig(num_layers=2, hidden=32, num_heads=4, intermediate=64, vocab_size=100, max_position=64)


def _encoder_layer(x: tf.Tensor, bias: tf.Tensor, cfg: BertConfig, length: int, rate: float, init) -> tf.Tensor:
    att = layers.attention(x, x, bias=bias, num_heads=cfg.num_heads, query_len=length, memory_len=length,
                           dropout_rate=rate, name="attention", initializer=init)
    x = layers.layer_norm(x + layers.dropout(att, rate), "attention_ln", epsilon=1e-12)
    h = layers.dense(x, cfg.intermediate, "intermediate", init, activation=layers.gelu)
    h = layers.dense(h, cfg.hidden, "output", init)
    return layers.layer_norm(x + layers.dropout(h, rate), "output_ln", epsilon=1e-12)


def _gather_positions(sequence: tf.Tensor, positions: tf.Tensor, batch_size: tf.Tensor, length: int) -> tf.Tensor:
    """sequence [B*T, H], positions [B, P] -> [B*P, H]."""
    offsets = tf.reshape(tf.range(batch_size, dtype=tf.int32) * length, [-1, 1])
    flat_positions = tf.reshape(positions + offsets, [-1])
    return tf.gather(sequence, flat_positions)


def _builder(name: str, base: BertConfig):
    def make_forward(opts: BuildOptions, tiny: bool, overrides: dict[str, object]) -> tuple[ForwardFn, dict]:
        cfg = resolve_config(name, TINY if tiny else base, overrides)
        check_positive(name, num_layers=cfg.num_layers, hidden=cfg.hidden, num_heads=cfg.num_heads,
                       intermediate=cfg.intermediate, vocab_size=cfg.vocab_size, max_position=cfg.max_position,
                       type_vocab_size=cfg.type_vocab_size)
        if cfg.hidden % cfg.num_heads:
            raise ModelError(f"model {name!r}: hidden {cfg.hidden} is not divisible by num_heads {cfg.num_heads}")
        length = opts.input_size
        if length > cfg.max_position:
            raise ModelError(f"model {name!r}: input_size (sequence length) {length} exceeds "
                             f"max_position {cfg.max_position}")
        predictions = cfg.max_predictions or max(1, math.ceil(0.15 * length))
        check_positive(name, max_predictions=predictions)
        if predictions > length:
            raise ModelError(f"model {name!r}: max_predictions {predictions} exceeds the sequence length {length}")
        cfg = dataclasses.replace(cfg, max_predictions=predictions)
        rate, dtype = opts.dropout, opts.tf_dtype

        def forward(inputs: Inputs) -> tf.Tensor:
            input_ids = inputs.add("input_ids", "int32", [length], 0, cfg.vocab_size)
            input_mask = inputs.add("input_mask", "int32", [length], 1, 2)  # all visible in synthetic data
            segment_ids = inputs.add("segment_ids", "int32", [length], 0, cfg.type_vocab_size)
            positions = inputs.add("masked_lm_positions", "int32", [predictions], 0, length)
            masked_ids = inputs.add("masked_lm_ids", "int32", [predictions], 0, cfg.vocab_size)
            nsp_labels = inputs.add("next_sentence_labels", "int32", [], 0, 2)
            init = layers.truncated_normal(cfg.initializer_range)

            with tf.compat.v1.variable_scope("bert"):
                with tf.compat.v1.variable_scope("embeddings"):
                    word_table = layers.get_var("word_embeddings", [cfg.vocab_size, cfg.hidden], dtype, init)
                    type_table = layers.get_var("token_type_embeddings", [cfg.type_vocab_size, cfg.hidden], dtype, init)
                    pos_table = layers.get_var("position_embeddings", [cfg.max_position, cfg.hidden], dtype, init)
                    x = tf.gather(word_table, tf.reshape(input_ids, [-1]))
                    x += tf.gather(type_table, tf.reshape(segment_ids, [-1]))
                    x = tf.reshape(x, [-1, length, cfg.hidden]) + tf.slice(pos_table, [0, 0], [length, -1])
                    x = tf.reshape(x, [-1, cfg.hidden])
                    x = layers.dropout(layers.layer_norm(x, "layer_norm", epsilon=1e-12), rate)
                bias = layers.mask_bias(input_mask, dtype)
                with tf.compat.v1.variable_scope("encoder"):
                    for i in range(cfg.num_layers):
                        with tf.compat.v1.variable_scope(f"layer_{i}"):
                            x = _encoder_layer(x, bias, cfg, length, rate, init)
                sequence_output = x  # [B*T, H]
                with tf.compat.v1.variable_scope("pooler"):
                    first = tf.reshape(sequence_output, [-1, length, cfg.hidden])[:, 0, :]
                    pooled = layers.dense(first, cfg.hidden, "dense", init, activation=tf.tanh)

            with tf.compat.v1.variable_scope("cls/predictions"):
                # raw Shape op: tf.shape would fold to a Const when the batch is static, and the
                # runtime-batch pattern is what the rest of tag_tf must learn to split.
                batch_size = tf.raw_ops.Shape(input=input_ids, out_type=tf.int32)[0]
                h = _gather_positions(sequence_output, positions, batch_size, length)
                h = layers.dense(h, cfg.hidden, "transform", init, activation=layers.gelu)
                h = layers.layer_norm(h, "transform_ln", epsilon=1e-12)
                output_bias = layers.get_var("output_bias", [cfg.vocab_size], dtype, tf.compat.v1.zeros_initializer())
                mlm_logits = tf.nn.bias_add(tf.matmul(h, word_table, transpose_b=True), output_bias)
                mlm_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=tf.reshape(masked_ids, [-1]), logits=tf.cast(mlm_logits, tf.float32)))
            with tf.compat.v1.variable_scope("cls/seq_relationship"):
                nsp_logits = layers.dense(pooled, 2, "output", init)
                nsp_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=nsp_labels, logits=tf.cast(nsp_logits, tf.float32)))
            return mlm_loss + nsp_loss

        return forward, dataclasses.asdict(cfg)

    return make_forward


BERT_SMALL = ModelSpec("bert-small", batch_size=96, input_size=128, tiny_input_size=8, min_input_size=2,
                       default_dropout=0.1, make_forward=_builder("bert-small", SMALL), input_meaning="sequence length")
BERT_LARGE = ModelSpec("bert-large", batch_size=16, input_size=128, tiny_input_size=8, min_input_size=2,
                       default_dropout=0.1, make_forward=_builder("bert-large", LARGE), input_meaning="sequence length")
