"""Small convolutional net for fast real runs: two conv+ReLU+max-pool blocks and a dense head."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from tag_tf.errors import ModelError
from tag_tf.models import layers
from tag_tf.models.training import BuildOptions, ForwardFn, Inputs, ModelSpec, check_positive, resolve_config


@dataclasses.dataclass(frozen=True)
class CNNConfig:
    channels: int = 1               # input image channels (MNIST-like by default)
    filters: tuple[int, ...] = (32, 64)   # two conv layers' filters (checked in make_forward)
    kernel: int = 5
    dense_units: int = 256
    num_classes: int = 10


TINY = CNNConfig(filters=(8, 16), kernel=3, dense_units=32)


def _conv_block(x: tf.Tensor, filters: int, kernel: int, name: str, batch_norm: bool) -> tf.Tensor:
    with tf.compat.v1.variable_scope(name):
        w = layers.get_var("kernel", [kernel, kernel, int(x.shape[-1]), filters], x.dtype,
                           tf.compat.v1.glorot_uniform_initializer())
        y = tf.nn.conv2d(x, w, strides=1, padding="SAME")
        if batch_norm:
            y = layers.batch_norm(y, "bn")
        else:
            y = tf.nn.bias_add(y, layers.get_var("bias", [filters], x.dtype, tf.compat.v1.zeros_initializer()))
        y = tf.nn.relu(y)
        return tf.nn.max_pool2d(y, ksize=2, strides=2, padding="VALID")


def make_forward(opts: BuildOptions, tiny: bool, overrides: dict[str, object]) -> tuple[ForwardFn, dict]:
    cfg = resolve_config("cnn", TINY if tiny else CNNConfig(), overrides)
    cfg = dataclasses.replace(cfg, filters=tuple(cfg.filters))
    check_positive("cnn", channels=cfg.channels, kernel=cfg.kernel, dense_units=cfg.dense_units,
                   num_classes=cfg.num_classes, **{f"filters[{i}]": f for i, f in enumerate(cfg.filters)})
    if len(cfg.filters) != 2:
        raise ModelError(f"model 'cnn': filters must have 2 entries, got {cfg.filters!r}")
    batch_norm = bool(opts.batch_norm)  # default off

    def forward(inputs: Inputs) -> tf.Tensor:
        x = inputs.add("images", opts.dtype, [opts.input_size, opts.input_size, cfg.channels])
        labels = inputs.add("labels", "int32", [], 0, cfg.num_classes)
        for i, filters in enumerate(cfg.filters):
            x = _conv_block(x, filters, cfg.kernel, f"conv_{i}", batch_norm)
        side = opts.input_size // 4
        x = tf.reshape(x, [-1, side * side * cfg.filters[-1]])
        x = layers.dense(x, cfg.dense_units, "fc", activation=tf.nn.relu)
        x = layers.dropout(x, opts.dropout)
        logits = layers.dense(x, cfg.num_classes, "logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    config = dict(dataclasses.asdict(cfg), batch_norm=batch_norm)
    return forward, config


# Two 2x2 max-pools: the side must be at least 4.
SPEC = ModelSpec("cnn", batch_size=64, input_size=28, tiny_input_size=8, min_input_size=4,
                 default_dropout=0.5, make_forward=make_forward, input_meaning="image side")
