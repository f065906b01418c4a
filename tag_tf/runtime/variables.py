"""Reading and writing variable values in a live tf.Graph: every copy of every variable.

Used to start a compiled graph from the original's initial values (so both runs begin identically),
to read results back under the original names, and to check that the copies of a replicated
variable stayed identical.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf


class VariableIO:
    def __init__(self, graph: tf.Graph, copies: Mapping[str, Sequence[str]], kinds: Mapping[str, str],
                 dtypes: Mapping[str, str]):
        """`graph`: the live tf.Graph; `copies`: original variable name -> op names of its copies."""
        import tensorflow as tf

        self.graph = graph
        self.copies = {k: tuple(v) for k, v in copies.items()}
        self._read: dict[str, list[Any]] = {}
        self._assign: dict[str, tuple[Any, list[Any]]] = {}
        with graph.as_default():
            for var, names in self.copies.items():
                reads, assigns = [], []
                value = tf.compat.v1.placeholder(dtypes[var], name=f"tag_io/{var}/value")
                for name in names:
                    op = graph.get_operation_by_name(name)
                    with tf.device(op.device):
                        if kinds[var] == "resource":
                            reads.append(tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=dtypes[var]))
                            assigns.append(tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value))
                        else:
                            reads.append(tf.identity(op.outputs[0]))
                            assigns.append(tf.compat.v1.assign(op.outputs[0], value, validate_shape=False))
                self._read[var] = reads
                self._assign[var] = (value, assigns)

    def read(self, session: tf.compat.v1.Session, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Values of the first copy of each variable."""
        names = list(self.copies) if names is None else list(names)
        values = session.run([self._read[n][0] for n in names])
        return dict(zip(names, values))

    def read_all(self, session: tf.compat.v1.Session, names: Sequence[str] | None = None
                 ) -> dict[str, list[np.ndarray]]:
        names = list(self.copies) if names is None else list(names)
        values = session.run([self._read[n] for n in names])
        return dict(zip(names, values))

    def load(self, session: tf.compat.v1.Session, values: Mapping[str, np.ndarray]) -> None:
        """Assign `values` to every copy of the named variables."""
        ops, feed = [], {}
        for var, value in values.items():
            if var not in self._assign:
                continue
            ph, assigns = self._assign[var]
            ops.extend(assigns)
            feed[ph] = value
        if ops:
            session.run(ops, feed)


def typical_magnitude(values: Mapping[str, np.ndarray], names: Sequence[str]) -> float:
    """The magnitude of a typical parameter of the model: the median of the variables' largest
    magnitudes, each variable weighted by its size (kernels and embeddings, not their biases)."""
    mags = sorted((float(np.max(np.abs(np.asarray(values[n], dtype=np.float64)))), np.size(values[n]))
                  for n in names if np.size(values[n]))
    total, seen = sum(size for _, size in mags), 0
    for mag, size in mags:
        seen += size
        if 2 * seen >= total:
            return mag
    return 0.0


def max_rel_diff(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], names: Sequence[str],
                 absolute_scale: float = 0.0) -> tuple[float, dict[str, float]]:
    """Largest |a-b| relative to the variable's largest magnitude, over `names`. A variable whose
    values are all smaller than `absolute_scale` (a zero-initialised bias or a LayerNorm beta that
    training has moved a few steps: its values are those steps, and under Adam a near-zero gradient
    element's rounding noise is a step's worth) is judged in absolute terms, against
    `absolute_scale` (see `typical_magnitude`)."""
    per = {}
    for n in names:
        x, y = np.asarray(a[n], dtype=np.float64), np.asarray(b[n], dtype=np.float64)
        scale = max(float(np.max(np.abs(x))) if x.size else 0.0, absolute_scale, 1e-12)
        per[n] = float(np.max(np.abs(x - y)) / scale) if x.size else 0.0
    return (max(per.values()) if per else 0.0), per
