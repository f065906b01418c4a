"""Tutorial-style TF1 programs, written the way public tutorials write them: each builds its own graph,
opens its own `tf.compat.v1.Session`, trains in a loop, then evaluates or predicts after the loop.

Each module defines `main(feed) -> dict[str, value]` (the trained variables and whatever it evaluated;
`feed(feed_dict)` wraps every training feed, so that the harness can permute a batch's rows for the noise
floor), `ISSUE_CLASS` (which limit of issue #38 it is written to meet) and `REFUSAL` (None: it must train
distributed like the plain run; else a regex of the tag_tf error it must stop with, before training)."""
from __future__ import annotations

import importlib
from types import ModuleType

NAMES = [
    "logistic_regression",
    "linear_regression",
    "linear_regression_per_sample",
    "mlp_keep_prob",
    "rnn_v1_control_flow",
    "gan_concatenated_batch",
    "iterator_initialised_first",
    "gan_two_adam_on_refs",
    "accumulate_then_apply",
    "wide_and_deep_strings",
]

PROGRAMS: dict[str, ModuleType] = {name: importlib.import_module(f"{__name__}.{name}") for name in NAMES}
