"""The corpus: TF1 training programs written the way users write them.

Each module defines `build() -> (inputs, train_op, loss)` (into the default graph; placeholders with a
None batch dimension), `feed(inputs, step) -> feed_dict` (deterministic data, batch 8), `BATCH_NORM`
(whether the model has batch normalisation) and `STEPS` (training steps to compare)."""
from __future__ import annotations

import importlib
from types import ModuleType

NAMES = [
    "keras_mobilenet_like",
    "keras_mobilenetv2",
    "keras_mobilenet_v1",
    "keras_gap1d",
    "bert_classifier",
    "lstm_lm",
    "gru_lm",
    "seq2seq_attention",
    "layers_bn",
    "dnn_estimator_style",
    "linear_sparse",
    "wide_and_deep",
    "partitioned_embeddings",
    "grad_accumulation",
    "mixed_precision_fp16",
    "manual_sgd",
    "reduce_sum_loss",
    "slim_alexnet_like",
]


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:          # tf_slim missing
        if name == "slim_alexnet_like":
            return None
        raise


PROGRAMS: dict[str, ModuleType] = {n: m for n in NAMES if (m := _load(n)) is not None}
