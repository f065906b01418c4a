"""The acceptance bar: train K steps with the original single-device graph and with the compiled
graph, from the same initial values and data, and compare the trainable variables."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.compiler import Compiled
from tag_tf.runtime.sessions import import_graph, session_config
from tag_tf.runtime.variables import VariableIO, max_rel_diff, typical_magnitude

if TYPE_CHECKING:
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

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
    # Variables whose gradient is rounding noise in the original run (e.g. attention key biases:
    # softmax ignores a per-query shift, so their true gradient is 0). Any change in summation order
    # gives different noise, and adaptive optimizers turn noise into full-size steps, so they are
    # reported here and left out of max_rel_diff.
    noise_variables: tuple[str, ...] = ()
    # max_rel_diff of the original run against itself on row-permuted batches (see noise_floor);
    # `tolerance` is at least NOISE_FACTOR times it.
    noise_floor: float = 0.0
    # Variables smaller than this are judged in absolute terms (see runtime.variables.max_rel_diff):
    # a typical parameter's magnitude in the original run.
    absolute_scale: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.max_rel_diff <= self.tolerance and np.isfinite(self.max_rel_diff))

    def to_dict(self) -> dict[str, object]:
        worst = sorted(self.per_variable.items(), key=lambda kv: -kv[1])[:5]
        return {"max_rel_diff": float(self.max_rel_diff), "steps": self.steps, "devices": self.devices,
                "ok": self.ok, "tolerance": self.tolerance, "copies_max_diff": self.copies_max_diff,
                "losses_original": list(self.losses_original), "losses_compiled": list(self.losses_compiled),
                "worst_variables": dict(worst), "noise_variables": list(self.noise_variables),
                "noise_floor": float(self.noise_floor), "absolute_scale": float(self.absolute_scale)}


def _initializers(graph_ir, instances: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    ops: list[str] = []
    for var in graph_ir.variables.values():
        if var.initializer:
            ops.extend(instances[var.initializer] if instances else [var.initializer])
    return ops


NOISE_RATIO = 1e-6   # a gradient this far below the model's largest is rounding noise
NOISE_FACTOR = 10.0  # a compiled run may differ from the original this many times the noise floor


def gradient_tensors(graph_ir) -> dict[str, list[str]]:
    """Trainable variable -> the gradient tensors its optimizer updates read."""
    from tag_tf.ir import opsets

    out: dict[str, list[str]] = {}
    for var in graph_ir.variables.values():
        if not var.trainable:
            continue
        for w in var.writers:
            idx = opsets.gradient_input(graph_ir.op(w).type)
            if idx is not None:
                out.setdefault(var.name, []).append(graph_ir.op(w).inputs[idx].name)
    return out


def noise_variables(grad_max: Mapping[str, float]) -> tuple[str, ...]:
    if not grad_max:
        return ()
    top = max(grad_max.values())
    return tuple(sorted(v for v, g in grad_max.items() if g <= NOISE_RATIO * top))


@dataclasses.dataclass(frozen=True)
class OriginalRun:
    """The reference: the original graph trained on one device."""

    initial: Mapping[str, np.ndarray]
    final: Mapping[str, np.ndarray]
    losses: tuple[float, ...]
    grad_max: Mapping[str, float]     # largest |gradient| seen per trainable variable
    steps: int


def permuted(analysis: Analysis, feeds: Feeds) -> Feeds:
    """The same batches with their rows in another order (one permutation per step, shared by every
    batch input): the same computation summed in another order, i.e. float32 reassociation alone."""
    batch_inputs = set(analysis.graph.meta.feeds)

    def fn(step: int) -> Mapping[str, np.ndarray]:
        out = {}
        for name, value in feeds(step).items():
            value = np.asarray(value)
            if name in batch_inputs and value.ndim and value.shape[0] > 1:
                value = value[np.random.default_rng(10_000 + step).permutation(value.shape[0])]
            out[name] = value
        return out
    return fn


def run_original(analysis: Analysis, feeds: Feeds, steps: int, *, timeout_ms: int = 60_000,
                 initial: Mapping[str, np.ndarray] | None = None) -> OriginalRun:
    """`initial`: start from these values instead of the initialisers' (unseeded initialisers give
    other values in every session)."""
    import tensorflow as tf

    ir = analysis.graph
    g = import_graph(ir.to_graph_def())
    kinds = {v.name: v.kind for v in ir.variables.values()}
    dtypes = {v.name: v.dtype for v in ir.variables.values()}
    io = VariableIO(g, {v: (v,) for v in ir.variables}, kinds, dtypes)
    grads = gradient_tensors(ir)
    grad_list = [(v, t) for v, ts in grads.items() for t in ts]
    grad_max = {v: 0.0 for v in grads}
    losses = []
    with tf.compat.v1.Session(graph=g, config=session_config(1, timeout_ms=timeout_ms)) as sess:
        sess.run(_initializers(ir))
        if initial is None:
            initial = io.read(sess)
        else:
            io.load(sess, initial)
        for step in range(steps):
            fetches = [ir.meta.train_op] + ([ir.meta.loss] if ir.meta.loss else [])
            out = sess.run([fetches, [t for _, t in grad_list]], dict(feeds(step)))
            if ir.meta.loss:
                losses.append(float(out[0][1]))
            for (v, _), value in zip(grad_list, out[1]):
                grad_max[v] = max(grad_max[v], float(np.max(np.abs(value))) if np.size(value) else 0.0)
        final = io.read(sess)
    return OriginalRun(initial, final, tuple(losses), grad_max, steps)


def run_compiled(analysis: Analysis, compiled: Compiled, initial: Mapping[str, np.ndarray], feeds: Feeds,
                 steps: int, *, target: str = "", config: ConfigProto | None = None,
                 step_seconds: list[float] | None = None) -> tuple[dict[str, np.ndarray], float, list[float]]:
    """(final values, largest difference between copies, losses) of the compiled graph; the wall
    time of each step is appended to `step_seconds` when given."""
    import tensorflow as tf

    ir = analysis.graph
    g = import_graph(compiled.graph_def)
    kinds = {v.name: v.kind for v in ir.variables.values()}
    dtypes = {v.name: v.dtype for v in ir.variables.values()}
    io = VariableIO(g, compiled.variables, kinds, dtypes)
    config = config or session_config(max(1, len(compiled.devices)))
    assert ir.meta.train_op is not None          # an analysed training graph names its train op
    train = compiled.run_ops[ir.meta.train_op]
    loss_name = ir.meta.loss
    loss = compiled.fetch_tensors.get(loss_name) if loss_name else None
    losses = []
    with tf.compat.v1.Session(target, graph=g, config=config) as sess:
        sess.run(_initializers(ir, compiled.instances))
        io.load(sess, initial)
        for step in range(steps):
            start = time.perf_counter()
            out = sess.run([train] + ([loss] if loss else []), dict(feeds(step)))
            if step_seconds is not None:
                step_seconds.append(time.perf_counter() - start)
            if loss:
                losses.append(float(out[1]))
        final = io.read(sess)
        copies = io.read_all(sess)
    spread = 0.0
    for _name, values in copies.items():
        for v in values[1:]:
            if np.issubdtype(np.asarray(v).dtype, np.number):
                spread = max(spread, float(np.max(np.abs(np.asarray(v, np.float64) - np.asarray(values[0], np.float64)))) if np.size(v) else 0.0)
    return final, spread, losses


def noise_floor(analysis: Analysis, original: OriginalRun, feeds: Feeds) -> float:
    """How far rounding alone moves the original run: the larger of two samples of it, the original
    graph trained from the same values on the same batches with their rows permuted (float32
    reassociation over the batch), and trained from values one unit in the last place away (how
    training amplifies a rounding-sized difference; a batch of 1 or 2 rows reassociates nothing
    when permuted, while kernels on shards of other shapes sum in another order). Rows are not
    permuted where the batch inputs do not share one leading dimension: rows of sparse indices name
    samples, and permuting them apart from the samples would compute something else."""
    trainable = judged_variables(analysis, original)
    scale = typical_magnitude(original.final, trainable)
    floors = [max_rel_diff(original.final, run_original(analysis, feeds, original.steps,
                                                        initial=one_ulp_away(original.initial)).final,
                           trainable, scale)[0]]
    batch_inputs = set(analysis.graph.meta.feeds)
    rows = [{np.shape(v)[0] for k, v in feeds(step).items() if k in batch_inputs and np.ndim(v)}
            for step in range(original.steps)]
    if all(len(r) <= 1 for r in rows):
        again = run_original(analysis, permuted(analysis, feeds), original.steps, initial=original.initial)
        floors.append(max_rel_diff(original.final, again.final, trainable, scale)[0])
    return max(floors)


def one_ulp_away(values: Mapping[str, np.ndarray], seed: int = 20_000) -> dict[str, np.ndarray]:
    """Every floating-point value moved one unit in the last place up or down (seeded)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in values.items():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating) and value.size:
            direction = np.where(rng.random(value.shape) < 0.5, -np.inf, np.inf).astype(value.dtype)
            value = np.nextafter(value, direction)
        out[name] = value
    return out


def judged_variables(analysis: Analysis, original: OriginalRun) -> list[str]:
    """The trainable variables a run is compared on: all but those whose gradient is rounding noise."""
    noise = noise_variables(original.grad_max)
    return [v.name for v in analysis.graph.variables.values() if v.trainable and v.name not in noise]


def _draws_random(analysis: Analysis) -> bool:
    from tag_tf.analysis.states import Flag

    return any(Flag.RANDOM in a.flags for a in analysis.annotations.values())


def check_equivalence(analysis: Analysis, compiled: Compiled, feeds: Feeds, steps: int, *,
                      target: str = "", config: ConfigProto | None = None, tolerance: float = 1e-4,
                      original: OriginalRun | None = None, floor: float | None = None) -> EquivalenceResult:
    """`original` (same feeds and steps) and its noise `floor` may be passed to compare many
    strategies to one run. The compiled run passes when it is within `tolerance`, or within
    NOISE_FACTOR times the noise floor where that is larger (Adam turns reassociation noise in
    near-zero gradients into full-size steps: no sharded run can beat the floor)."""
    if original is None or original.steps != steps:
        original, floor = run_original(analysis, feeds, steps), None
    if floor is None:
        # Random ops (dropout) draw other numbers for permuted rows: that floor would hide real
        # differences, so graphs with them are held to `tolerance` alone.
        floor = 0.0 if _draws_random(analysis) else noise_floor(analysis, original, feeds)
    final_b, spread, losses_b = run_compiled(analysis, compiled, original.initial, feeds, steps,
                                             target=target, config=config)
    trainable = judged_variables(analysis, original)
    scale = typical_magnitude(original.final, trainable)
    worst, per = max_rel_diff(original.final, final_b, trainable, scale)
    return EquivalenceResult(worst, per, steps, len(compiled.devices), original.losses, tuple(losses_b),
                             spread, max(tolerance, NOISE_FACTOR * floor), noise_variables(original.grad_max),
                             floor, scale)
