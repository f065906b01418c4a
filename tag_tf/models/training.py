"""Shared graph plumbing: build options, placeholders, and the optimizer/export tail every model uses."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import tensorflow as tf

from tag_tf.errors import ModelError
from tag_tf.models.base import InputSpec, ModelGraph

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Config = TypeVar("Config", bound="DataclassInstance")     # a model's config dataclass

DTYPES = ("float16", "float32", "float64")

# name -> (TF1 optimizer factory taking (learning_rate, dtype), default learning rate)
_OPTIMIZERS: dict[str, tuple[Callable[[float, str], Any], float]] = {
    # fp16 Adam needs a representable epsilon: 1e-8 underflows to 0 and gives 0/0 = NaN.
    "adam": (lambda lr, dt: tf.compat.v1.train.AdamOptimizer(lr, epsilon=1e-4 if dt == "float16" else 1e-8), 1e-3),
    "sgd": (lambda lr, dt: tf.compat.v1.train.GradientDescentOptimizer(lr), 1e-2),
    "momentum": (lambda lr, dt: tf.compat.v1.train.MomentumOptimizer(lr, momentum=0.9), 1e-2),
    "adagrad": (lambda lr, dt: tf.compat.v1.train.AdagradOptimizer(lr), 1e-2),
    "rmsprop": (lambda lr, dt: tf.compat.v1.train.RMSPropOptimizer(lr), 1e-3),
    "adadelta": (lambda lr, dt: tf.compat.v1.train.AdadeltaOptimizer(lr), 1.0),
    "ftrl": (lambda lr, dt: tf.compat.v1.train.FtrlOptimizer(lr), 1e-2),
}
OPTIMIZER_NAMES = tuple(_OPTIMIZERS)


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """Model-independent knobs of build_model, already validated."""

    batch_size: int
    input_size: int
    dtype: str = "float32"
    dynamic_batch: bool = False
    dropout: float = 0.0            # resolved: the model default has been substituted for None
    resource_variables: bool = True
    optimizer: str = "adam"
    learning_rate: float | None = None
    batch_norm: bool | None = None
    seed: int = 0
    with_saver: bool = False
    sparse_grads: bool = False      # keep IndexedSlices gradients (Adam then uses scatter ops, no Apply*)

    @property
    def tf_dtype(self) -> tf.DType:
        return tf.as_dtype(self.dtype)

    @property
    def batch_dim(self) -> int | None:
        return None if self.dynamic_batch else self.batch_size


@dataclasses.dataclass
class Inputs:
    """Collects placeholders and their InputSpecs while a forward pass is built."""

    opts: BuildOptions
    specs: list[InputSpec] = dataclasses.field(default_factory=list)

    def add(self, name: str, dtype: str, shape: Sequence[int], low: float = 0.0, high: float = 1.0) -> tf.Tensor:
        """A placeholder [batch, *shape]; batch is None when the build asked for a dynamic batch."""
        ph = tf.compat.v1.placeholder(tf.as_dtype(dtype), [self.opts.batch_dim, *shape], name=name)
        self.specs.append(InputSpec(ph.op.name, dtype, (self.opts.batch_size, *shape), low, high))
        return ph


ForwardFn = Callable[[Inputs], tf.Tensor]  # builds the forward pass, returns the scalar loss


def make_optimizer(opts: BuildOptions):
    factory, default_lr = _OPTIMIZERS[opts.optimizer]
    lr = default_lr if opts.learning_rate is None else opts.learning_rate
    return factory(lr, opts.dtype)


def _densify(grads_and_vars):
    # Embedding lookups give IndexedSlices; TF1 Adam turns those into scatter/assign ops instead of
    # one Apply* op per variable. Densifying (UnsortedSegmentSum) keeps one uniform update per variable.
    out = []
    for g, v in grads_and_vars:
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        out.append((g, v))
    return out


def build_training_graph(name: str, opts: BuildOptions, forward: ForwardFn,
                         config: dict[str, object] | None = None) -> ModelGraph:
    """Forward + loss + gradients + optimizer in a fresh tf.Graph, exported as GraphDef/MetaGraphDef."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(opts.seed)
        scope = tf.compat.v1.get_variable_scope()
        # use_resource on the root scope picks resource (VarHandleOp) or ref (VariableV2) variables
        # for everything below, tf-slim layers and the optimizer's slots included.
        with tf.compat.v1.variable_scope(scope, use_resource=opts.resource_variables):
            inputs = Inputs(opts)
            loss = forward(inputs)
            if loss.shape.rank != 0:
                raise ModelError(f"model {name!r}: loss must be a scalar, got shape {loss.shape}")
            loss = tf.identity(loss, name="loss")
            global_step = tf.compat.v1.train.get_or_create_global_step()
            optimizer = make_optimizer(opts)
            grads_and_vars = optimizer.compute_gradients(loss)
            if not opts.sparse_grads:
                grads_and_vars = _densify(grads_and_vars)
            minimize = optimizer.apply_gradients(grads_and_vars, global_step=global_step, name="minimize")
            # Batch-norm moving averages live in UPDATE_OPS; one NoOp runs them with the update.
            update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
            train_op = tf.group(minimize, *update_ops, name="train_op")
            # apply_gradients already put "minimize" there; keep the one op callers should run.
            graph.clear_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train_op)
            init = tf.compat.v1.global_variables_initializer()  # op name "init"
            num_params = sum(int(np.prod(v.shape.as_list())) for v in tf.compat.v1.trainable_variables())
            # export_meta_graph only fills saver_def when handed one; a bare Saver() is not enough.
            saver_def = tf.compat.v1.train.Saver().as_saver_def() if opts.with_saver else None
        meta_graph_def = tf.compat.v1.train.export_meta_graph(graph=graph, saver_def=saver_def)
    graph_def = graph.as_graph_def()
    return ModelGraph(
        name=name,
        batch_size=opts.batch_size,
        graph_def=graph_def,
        meta_graph_def=meta_graph_def,
        inputs=tuple(inputs.specs),
        loss=loss.name,
        train_op=train_op.name,
        init_op=init.name,
        num_params=num_params,
        input_size=opts.input_size,
        dtype=opts.dtype,
        dynamic_batch=opts.dynamic_batch,
        config=tuple(sorted((config or {}).items())),
    )


def resolve_config(model: str, base: Config, overrides: dict[str, object]) -> Config:
    """dataclasses.replace(base, **overrides), with a ModelError naming any unknown key."""
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ModelError(f"model {model!r}: unknown option(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return dataclasses.replace(base, **overrides)


def check_positive(model: str, **values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ModelError(f"model {model!r}: {key} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Registry entry: defaults for build_model and the model's forward-pass factory.

    make_forward(opts, tiny, overrides) -> (forward, config): the forward pass (placeholders to
    scalar loss, through `Inputs`) and the resolved model config. build_model wraps it in the TF1
    training tail; benchmarks call the same forward from TF2 code (one definition of each model).
    """

    name: str
    batch_size: int                 # default (the paper's where the paper has the model)
    input_size: int                 # default image side / sequence length / feature count
    tiny_input_size: int
    min_input_size: int             # smallest input_size the net builds at
    default_dropout: float
    make_forward: Callable[[BuildOptions, bool, dict[str, object]], tuple[ForwardFn, dict]]
    input_meaning: str = "input size"
