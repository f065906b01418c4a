"""Model zoo: builders returning single-device TF1 training graphs (forward + loss + gradients + optimizer).

    build_model("bert-small", tiny=True)  ->  ModelGraph
    describe(model)                        ->  {"ops": ..., "params": ..., "param_mib": ...}
"""
from __future__ import annotations

import collections

from tag_tf.errors import ModelError
from tag_tf.models import bert, cnn, mlp, slim_nets, transformer
from tag_tf.models.base import InputSpec, ModelGraph
from tag_tf.models.training import DTYPES, OPTIMIZER_NAMES, BuildOptions, ForwardFn, ModelSpec, build_training_graph

__all__ = ["MODEL_NAMES", "PAPER_TABLE", "OPTIMIZER_NAMES", "InputSpec", "ModelGraph", "build_model", "describe",
           "model_forward", "model_spec"]

_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (mlp.SPEC, cnn.SPEC, slim_nets.VGG19, slim_nets.RESNET101, slim_nets.INCEPTIONV3,
                 transformer.SPEC, bert.BERT_SMALL, bert.BERT_LARGE)
}
MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "vgg19", "resnet101", "inceptionv3", "transformer",
                                "bert-small", "bert-large")
assert tuple(_SPECS) == MODEL_NAMES

# The TAG paper's "Benchmark DNN models" table. param_mib is how we read its "parameter size"
# column: MiB of float32 parameters (VGG19's 143.7M parameters * 4 B = 548 MiB).
PAPER_TABLE: dict[str, dict[str, int]] = {
    "inceptionv3": {"batch_size": 96, "ops": 5312, "param_mib": 90},
    "resnet101": {"batch_size": 96, "ops": 7951, "param_mib": 169},
    "vgg19": {"batch_size": 96, "ops": 1169, "param_mib": 548},
    "transformer": {"batch_size": 480, "ops": 16859, "param_mib": 407},
    "bert-small": {"batch_size": 96, "ops": 5061, "param_mib": 98},
    "bert-large": {"batch_size": 16, "ops": 26601, "param_mib": 2313},
}

TINY_BATCH_SIZE = 8  # default batch for tiny=True when no batch_size is given
_COMMON_OVERRIDES = ("learning_rate", "with_saver", "sparse_grads")


def model_spec(name: str) -> ModelSpec:
    """Registry entry (default batch/input sizes, smallest input) for a model name."""
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}") from None


def build_model(name: str, *, batch_size: int | None = None, input_size: int | None = None, tiny: bool = False,
                dtype: str = "float32", dynamic_batch: bool = False, dropout: float | None = None,
                resource_variables: bool = True, optimizer: str = "adam", batch_norm: bool | None = None,
                seed: int = 0, **overrides: object) -> ModelGraph:
    """Build model `name` as a TF1 training graph in a fresh tf.Graph.

    input_size is the image side (CNNs), sequence length (transformer, BERT) or feature count (mlp).
    tiny=True picks small widths/depths/vocab (tf-slim nets: a small input side only) and, unless
    batch_size is given, a batch of 8. Extra keyword overrides: learning_rate, with_saver (add a
    Saver so saver_def is filled), sparse_grads (keep IndexedSlices gradients), plus the model's
    own config fields (e.g. num_layers, hidden, vocab_size, weight_decay, aux_logits).
    """
    forward, config, opts = model_forward(
        name, batch_size=batch_size, input_size=input_size, tiny=tiny, dtype=dtype, dynamic_batch=dynamic_batch,
        dropout=dropout, resource_variables=resource_variables, optimizer=optimizer, batch_norm=batch_norm,
        seed=seed, **overrides)
    return build_training_graph(name, opts, forward, config)


def model_forward(name: str, *, batch_size: int | None = None, input_size: int | None = None, tiny: bool = False,
                  dtype: str = "float32", dynamic_batch: bool = False, dropout: float | None = None,
                  resource_variables: bool = True, optimizer: str = "adam", batch_norm: bool | None = None,
                  seed: int = 0, **overrides: object) -> tuple[ForwardFn, dict, BuildOptions]:
    """The forward pass build_model would wrap, with the same arguments and checks.

    Returns (forward, config, opts): forward(inputs) builds the model from `inputs.add(...)` tensors
    to its scalar loss; a caller outside TF1 graphs (a TF2 tf.function, a distribution strategy)
    hands it an object whose add() returns its own tensors.
    """
    spec = model_spec(name)
    if batch_size is None:
        batch_size = TINY_BATCH_SIZE if tiny else spec.batch_size
    if input_size is None:
        input_size = spec.tiny_input_size if tiny else spec.input_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ModelError(f"model {name!r}: batch_size must be an integer >= 1, got {batch_size!r}")
    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < spec.min_input_size:
        raise ModelError(f"model {name!r}: input_size ({spec.input_meaning}) must be an integer "
                         f">= {spec.min_input_size}, got {input_size!r}")
    if dtype not in DTYPES:
        raise ModelError(f"model {name!r}: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if optimizer not in OPTIMIZER_NAMES:
        raise ModelError(f"model {name!r}: optimizer must be one of {', '.join(OPTIMIZER_NAMES)}, got {optimizer!r}")
    if dropout is None:
        dropout = spec.default_dropout
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ModelError(f"model {name!r}: dropout must be a rate in [0, 1), got {dropout!r}")
    if batch_norm not in (None, True, False):
        raise ModelError(f"model {name!r}: batch_norm must be None, True or False, got {batch_norm!r}")
    common = {key: overrides.pop(key) for key in _COMMON_OVERRIDES if key in overrides}
    learning_rate = common.get("learning_rate")
    if not (learning_rate is None or (isinstance(learning_rate, (int, float)) and learning_rate > 0)):
        raise ModelError(f"model {name!r}: learning_rate must be a positive number, got {learning_rate!r}")
    opts = BuildOptions(
        batch_size=batch_size, input_size=input_size, dtype=dtype, dynamic_batch=bool(dynamic_batch),
        dropout=float(dropout), resource_variables=bool(resource_variables), optimizer=optimizer,
        learning_rate=learning_rate, batch_norm=batch_norm, seed=int(seed),
        with_saver=bool(common.get("with_saver", False)), sparse_grads=bool(common.get("sparse_grads", False)))
    forward, config = spec.make_forward(opts, bool(tiny), overrides)
    return forward, config, opts


def describe(model: ModelGraph) -> dict[str, object]:
    """Size summary: node count, parameter count/MiB, and a histogram of op types."""
    op_types = collections.Counter(node.op for node in model.graph_def.node)
    return {
        "name": model.name,
        "ops": len(model.graph_def.node),
        "params": model.num_params,
        "param_mib": model.param_bytes / 2**20,
        "batch_size": model.batch_size,
        "input_size": model.input_size,
        "dtype": model.dtype,
        "dynamic_batch": model.dynamic_batch,
        "inputs": [spec.name for spec in model.inputs],
        "op_types": dict(sorted(op_types.items())),
    }

