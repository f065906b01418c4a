"""Small TF1 building blocks (dense, layer norm, GELU, multi-head attention) written with raw ops.

Activations of sequence models stay flattened as [batch * seq, hidden] so every dense layer is
one MatMul, the way TF1 BERT/Transformer graphs look.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


def get_var(name: str, shape: list[int], dtype: tf.DType, initializer) -> tf.Variable:
    return tf.compat.v1.get_variable(name, shape, dtype=dtype, initializer=initializer)


def truncated_normal(stddev: float):
    return tf.compat.v1.truncated_normal_initializer(stddev=stddev)


def dense(x: tf.Tensor, units: int, name: str, initializer=None, activation=None, use_bias: bool = True) -> tf.Tensor:
    """x [N, in] -> [N, units]."""
    dtype = x.dtype.base_dtype
    with tf.compat.v1.variable_scope(name):
        kernel = get_var("kernel", [int(x.shape[-1]), units], dtype,
                         initializer or tf.compat.v1.glorot_uniform_initializer())
        y = tf.matmul(x, kernel)
        if use_bias:
            y = tf.nn.bias_add(y, get_var("bias", [units], dtype, tf.compat.v1.zeros_initializer()))
        return activation(y) if activation is not None else y


def dropout(x: tf.Tensor, rate: float) -> tf.Tensor:
    # rate 0 must leave no random op in the training path.
    return x if rate <= 0.0 else tf.nn.dropout(x, rate=rate)


def layer_norm(x: tf.Tensor, name: str, epsilon: float = 1e-6) -> tf.Tensor:
    """Normalizes over the last axis with learned gain and bias."""
    dtype = x.dtype.base_dtype
    with tf.compat.v1.variable_scope(name):
        gamma = get_var("gamma", [int(x.shape[-1])], dtype, tf.compat.v1.ones_initializer())
        beta = get_var("beta", [int(x.shape[-1])], dtype, tf.compat.v1.zeros_initializer())
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        return centered * tf.math.rsqrt(variance + epsilon) * gamma + beta


def batch_norm(x: tf.Tensor, name: str, decay: float = 0.99, epsilon: float = 1e-3) -> tf.Tensor:
    """Training-mode batch norm over all but the last axis, any float dtype.

    Normalizes with the batch statistics and puts the moving-average updates into UPDATE_OPS,
    as TF1 layers do (the train op must run them).
    """
    dtype = x.dtype.base_dtype
    channels = [int(x.shape[-1])]
    with tf.compat.v1.variable_scope(name):
        gamma = get_var("gamma", channels, dtype, tf.compat.v1.ones_initializer())
        beta = get_var("beta", channels, dtype, tf.compat.v1.zeros_initializer())
        moving_mean = tf.compat.v1.get_variable("moving_mean", channels, dtype=dtype, trainable=False,
                                                initializer=tf.compat.v1.zeros_initializer())
        moving_var = tf.compat.v1.get_variable("moving_variance", channels, dtype=dtype, trainable=False,
                                               initializer=tf.compat.v1.ones_initializer())
        mean, variance = tf.nn.moments(x, axes=list(range(x.shape.rank - 1)))
        for moving, value in ((moving_mean, mean), (moving_var, variance)):
            update = moving.assign_sub((moving - value) * (1.0 - decay))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, epsilon)


def gelu(x: tf.Tensor) -> tf.Tensor:
    """Exact GELU: x * Phi(x) (Hendrycks & Gimpel)."""
    return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def masked_fill_value(dtype: tf.DType) -> float:
    # Large negative that stays finite in float16 (max 65504).
    return -1e4 if dtype == tf.float16 else -1e9


def attention(query_in: tf.Tensor, memory_in: tf.Tensor, *, bias: tf.Tensor | None, num_heads: int,
              query_len: int, memory_len: int, dropout_rate: float, name: str, initializer=None) -> tf.Tensor:
    """Multi-head scaled dot-product attention on flattened activations.

    query_in [B*Tq, H], memory_in [B*Tk, H]; bias broadcasts to [B, heads, Tq, Tk] and holds 0 for
    visible keys and a large negative for masked ones. Returns [B*Tq, H] after the output projection.
    """
    hidden = int(query_in.shape[-1])
    head_dim = hidden // num_heads
    with tf.compat.v1.variable_scope(name):
        def split_heads(x: tf.Tensor, length: int) -> tf.Tensor:
            x = tf.reshape(x, [-1, length, num_heads, head_dim])
            return tf.transpose(x, [0, 2, 1, 3])  # [B, heads, T, head_dim]

        q = split_heads(dense(query_in, hidden, "query", initializer), query_len)
        k = split_heads(dense(memory_in, hidden, "key", initializer), memory_len)
        v = split_heads(dense(memory_in, hidden, "value", initializer), memory_len)
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(head_dim))
        if bias is not None:
            scores += bias
        probs = dropout(tf.nn.softmax(scores), dropout_rate)
        context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])  # [B, Tq, heads, head_dim]
        context = tf.reshape(context, [-1, hidden])
        return dense(context, hidden, "output", initializer)


def padding_bias(ids: tf.Tensor, dtype: tf.DType, pad_id: int = 0) -> tf.Tensor:
    """[B, T] token ids -> [B, 1, 1, T] additive bias masking the padding keys."""
    return mask_bias(tf.not_equal(ids, pad_id), dtype)


def mask_bias(mask: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """[B, T] mask (1 = visible) -> [B, 1, 1, T] additive attention bias."""
    visible = tf.cast(mask, dtype)[:, tf.newaxis, tf.newaxis, :]
    return (1.0 - visible) * masked_fill_value(dtype)


def causal_bias(length: int, dtype: tf.DType) -> tf.Tensor:
    """[1, 1, T, T] bias that hides future positions (teacher-forced decoder)."""
    lower = tf.linalg.band_part(tf.ones([length, length], dtype=dtype), -1, 0)
    return tf.reshape((1.0 - lower) * masked_fill_value(dtype), [1, 1, length, length])


def sinusoid_positions(length: int, depth: int) -> np.ndarray:
    """[length, depth] fixed sin/cos position encoding (Vaswani et al. 2017)."""
    position = np.arange(length, dtype=np.float64)[:, None]
    rates = np.exp(-math.log(10000.0) * (np.arange(0, depth, 2, dtype=np.float64) / depth))
    table = np.zeros((length, depth))
    table[:, 0::2] = np.sin(position * rates)
    table[:, 1::2] = np.cos(position * rates[: depth // 2])
    return table
