"""Values in and out of sessions: the user's variables (read into a compiled session at migration,
written back when the context exits) and synthetic batches (for `verify=True`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf

    from tag_tf.analysis import Analysis
    from tag_tf.ir.graph import Graph, Variable


def _read_tensor(graph: tf.Graph, var: Variable) -> tf.Tensor:
    """A tensor of the user's graph holding variable `var`'s value, without adding ops if possible."""
    import tensorflow as tf

    op = graph.get_operation_by_name(var.name)
    if var.kind == "ref":
        return op.outputs[0]
    reads = [c for c in op.outputs[0].consumers() if c.type == "ReadVariableOp" and not c.control_inputs]
    reads.sort(key=lambda c: not c.name.endswith("/Read/ReadVariableOp"))
    if reads:
        return reads[0].outputs[0]
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()    # a read op changes nothing the user's program relies on
    try:
        with graph.as_default(), tf.device(op.device), tf.name_scope("tag_tf_read"):
            return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=var.dtype)
    finally:
        if finalized:
            graph.finalize()


def read_variables(sess: tf.compat.v1.Session, ir: Graph) -> dict[str, np.ndarray]:
    """Current values of the IR's variables in the user's session; uninitialised ones are left out."""
    import tensorflow as tf

    tensors = {name: _read_tensor(sess.graph, var) for name, var in ir.variables.items()}
    try:
        return dict(zip(tensors, sess.run(list(tensors.values()))))
    except tf.errors.FailedPreconditionError:
        pass
    values = {}
    for name, t in tensors.items():
        try:
            values[name] = sess.run(t)
        except tf.errors.FailedPreconditionError:
            continue
    return values


def write_variables(sess: tf.compat.v1.Session, ir: Graph, values: Mapping[str, np.ndarray]) -> None:
    """Assign values in the user's session through the variables' initializers (value input fed),
    so no op is added to a graph that may be finalized."""
    targets, feeds = [], {}
    for name, value in values.items():
        init = ir.variables[name].initializer
        if not init:
            continue
        op = sess.graph.get_operation_by_name(init)
        targets.append(op)
        feeds[op.inputs[1]] = value
    if targets:
        sess.run(targets, feeds)


def synthetic_batch(analysis: Analysis, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch for every batch input, from its shape and dtype (ints are zeros: always a valid label)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in analysis.graph.meta.feeds:
        info = analysis.graph_b1.tensor(name)
        shape = tuple(1 if d < 0 else d for d in (info.shape or (analysis.batch_size,)))
        dtype = np.dtype(info.base_dtype) if info.base_dtype not in ("string", "resource", "variant") else object
        if np.issubdtype(dtype, np.floating):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == object:
            out[name] = np.full(shape, b"", dtype=object)
        else:
            out[name] = np.zeros(shape, dtype=dtype)
    return out
