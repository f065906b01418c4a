"""The acceptance bar: train K steps with the original single-device graph and with the compiled
graph, from the same initial values and data, and compare the trainable variables."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.compiler import Compiled
from tag_tf.runtime.sessions import import_graph, session_config
from tag_tf.runtime.variables import VariableIO, max_rel_diff

Feeds = Callable[[int], Mapping[str, np.ndarray]]   # step -> {tensor name: batch}


@dataclasses.dataclass(frozen=True)
class EquivalenceResult:
    max_rel_diff: float
    per_variable: Mapping[str, float]
    steps: int
    devices: int
    losses_original: tuple[float, ...]
    losses_compiled: tuple[float, ...]
    copies_max_diff: float        # largest difference between copies of one variable (compiled run)
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_rel_diff <= self.tolerance and np.isfinite(self.max_rel_diff)

    def to_dict(self) -> dict[str, Any]:
        worst = sorted(self.per_variable.items(), key=lambda kv: -kv[1])[:5]
        return {"max_rel_diff": self.max_rel_diff, "steps": self.steps, "devices": self.devices,
                "ok": self.ok, "tolerance": self.tolerance, "copies_max_diff": self.copies_max_diff,
                "losses_original": list(self.losses_original), "losses_compiled": list(self.losses_compiled),
                "worst_variables": dict(worst)}


def _initializers(graph_ir, instances: Mapping[str, list[str]] | None = None) -> list[str]:
    ops = []
    for var in graph_ir.variables.values():
        if var.initializer:
            ops.extend(instances[var.initializer] if instances else [var.initializer])
    return ops


def run_original(analysis: Analysis, feeds: Feeds, steps: int, *, timeout_ms: int = 60_000
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[float]]:
    """(initial values, final values, losses) of the original graph on one device."""
    import tensorflow as tf

    ir = analysis.graph
    g = import_graph(ir.to_graph_def())
    kinds = {v.name: v.kind for v in ir.variables.values()}
    dtypes = {v.name: v.dtype for v in ir.variables.values()}
    io = VariableIO(g, {v: (v,) for v in ir.variables}, kinds, dtypes)
    losses = []
    with tf.compat.v1.Session(graph=g, config=session_config(1, timeout_ms=timeout_ms)) as sess:
        sess.run(_initializers(ir))
        initial = io.read(sess)
        for step in range(steps):
            fetches = [ir.meta.train_op] + ([ir.meta.loss] if ir.meta.loss else [])
            out = sess.run(fetches, dict(feeds(step)))
            if ir.meta.loss:
                losses.append(float(out[1]))
        final = io.read(sess)
    return initial, final, losses


def run_compiled(analysis: Analysis, compiled: Compiled, initial: Mapping[str, np.ndarray], feeds: Feeds,
                 steps: int, *, target: str = "", config: Any = None
                 ) -> tuple[dict[str, np.ndarray], float, list[float]]:
    """(final values, largest difference between copies, losses) of the compiled graph."""
    import tensorflow as tf

    ir = analysis.graph
    g = import_graph(compiled.graph_def)
    kinds = {v.name: v.kind for v in ir.variables.values()}
    dtypes = {v.name: v.dtype for v in ir.variables.values()}
    io = VariableIO(g, compiled.variables, kinds, dtypes)
    config = config or session_config(max(1, len(compiled.devices)))
    train = compiled.run_ops[ir.meta.train_op]
    loss = compiled.fetch_tensors.get(ir.meta.loss) if ir.meta.loss else None
    losses = []
    with tf.compat.v1.Session(target, graph=g, config=config) as sess:
        sess.run(_initializers(ir, compiled.builder.instances))
        io.load(sess, initial)
        for step in range(steps):
            out = sess.run([train] + ([loss] if loss else []), dict(feeds(step)))
            if loss:
                losses.append(float(out[1]))
        final = io.read(sess)
        copies = io.read_all(sess)
    spread = 0.0
    for name, values in copies.items():
        for v in values[1:]:
            if np.issubdtype(np.asarray(v).dtype, np.number):
                spread = max(spread, float(np.max(np.abs(np.asarray(v, np.float64) - np.asarray(values[0], np.float64)))) if np.size(v) else 0.0)
    return final, spread, losses


def check_equivalence(analysis: Analysis, compiled: Compiled, feeds: Feeds, steps: int, *,
                      target: str = "", config: Any = None, tolerance: float = 1e-4) -> EquivalenceResult:
    initial, final_a, losses_a = run_original(analysis, feeds, steps)
    final_b, spread, losses_b = run_compiled(analysis, compiled, initial, feeds, steps, target=target,
                                             config=config)
    trainable = [v.name for v in analysis.graph.variables.values() if v.trainable]
    worst, per = max_rel_diff(final_a, final_b, trainable)
    return EquivalenceResult(worst, per, steps, len(compiled.devices), tuple(losses_a), tuple(losses_b),
                             spread, tolerance)
