"""Multi-layer perceptron on flat features: dense ReLU layers, softmax cross-entropy."""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from tag_tf.models import layers
from tag_tf.models.training import BuildOptions, ForwardFn, Inputs, ModelSpec, check_positive, resolve_config


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    hidden: tuple[int, ...] = (512, 256)
    num_classes: int = 10


TINY = MLPConfig(hidden=(32, 32), num_classes=10)


def make_forward(opts: BuildOptions, tiny: bool, overrides: dict[str, object]) -> tuple[ForwardFn, dict]:
    cfg = resolve_config("mlp", TINY if tiny else MLPConfig(), overrides)
    cfg = dataclasses.replace(cfg, hidden=tuple(cfg.hidden))
    check_positive("mlp", num_classes=cfg.num_classes, **{f"hidden[{i}]": h for i, h in enumerate(cfg.hidden)})

    def forward(inputs: Inputs) -> tf.Tensor:
        x = inputs.add("x", opts.dtype, [opts.input_size])
        labels = inputs.add("labels", "int32", [], 0, cfg.num_classes)
        for i, width in enumerate(cfg.hidden):
            x = layers.dense(x, width, f"dense_{i}", activation=tf.nn.relu)
            x = layers.dropout(x, opts.dropout)
        logits = layers.dense(x, cfg.num_classes, "logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    return forward, dataclasses.asdict(cfg)


SPEC = ModelSpec("mlp", batch_size=64, input_size=784, tiny_input_size=32, min_input_size=1,
                 default_dropout=0.0, make_forward=make_forward, input_meaning="feature count")
