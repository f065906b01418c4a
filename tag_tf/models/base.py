"""What a model builder returns: a TF1 training graph plus the names the rest of tag_tf needs."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tag_tf.ir.graph import Graph


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One fed input (a Placeholder). The batch dimension is axis 0 of `shape`."""

    name: str                 # placeholder op name
    dtype: str                # numpy/TF dtype name: "float32", "int32", "int64", ...
    shape: tuple[int, ...]    # full shape at the model's batch size
    low: float = 0.0          # values are drawn uniformly from [low, high) (integers: labels, token ids)
    high: float = 1.0

    def sample(self, rng: np.random.Generator, batch_size: int) -> np.ndarray:
        shape = (batch_size,) + tuple(self.shape[1:])
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            return rng.integers(int(self.low), int(self.high), size=shape).astype(self.dtype)
        return rng.uniform(self.low, self.high, size=shape).astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class ModelGraph:
    """A single-device TF1 training graph: forward + loss + gradients + optimizer (Adam by default)."""

    name: str
    batch_size: int
    graph_def: Any             # tf.compat.v1.GraphDef (TensorFlow ships no stubs)
    meta_graph_def: Any        # tf.compat.v1.MetaGraphDef (collections, saver_def)
    inputs: tuple[InputSpec, ...]
    loss: str                  # tensor name, e.g. "loss:0"
    train_op: str              # op name
    init_op: str               # op name
    num_params: int            # trainable parameter elements
    # Added fields (defaults keep older constructors working).
    input_size: int | None = None   # image side / sequence length / feature count
    dtype: str = "float32"          # dtype of the trainable parameters
    dynamic_batch: bool = False     # placeholders are [None, ...] when True
    config: tuple[tuple[str, object], ...] = ()  # resolved model hyper-parameters, for reports

    def feed(self, rng: np.random.Generator, batch_size: int | None = None) -> dict[str, np.ndarray]:
        """A synthetic batch for every input, keyed by tensor name ("x:0")."""
        b = self.batch_size if batch_size is None else batch_size
        return {f"{spec.name}:0": spec.sample(rng, b) for spec in self.inputs}

    def ir(self) -> Graph:
        """The graph as tag_tf's IR, with its train op, loss and batch inputs named."""
        from tag_tf.ir import from_graph_def

        return from_graph_def(self.graph_def, self.meta_graph_def, train_op=self.train_op, loss=self.loss,
                              inputs=[f"{spec.name}:0" for spec in self.inputs])

    @property
    def param_bytes(self) -> int:
        """Parameter bytes at the model's dtype (float32 unless built otherwise)."""
        return np.dtype(self.dtype).itemsize * self.num_params

