"""Measure per-op compute times: traced single-device training steps at a few batch sizes, on this
machine or on a server of a cluster, turned into an `OpProfile` (`tag_tf.profile.op_profile`).

How it runs
-----------
* Grappler's meta optimizer, and the classic graph optimizer's constant folding and CSE, are off so
  node names survive and every op of the graph runs as written.
* On the CPU the executor's inter-op pool is 1 thread by default: ops then run one after another
  (each using the intra-op threads), as kernels do on a GPU stream, so per-op times are not inflated
  by ops competing for the same cores and they add up to the step time.
* Variables are initialised once per session; `warmup` untraced steps and one traced (discarded) step
  then precede the measurements. Repeats are interleaved round-robin over the batch sizes so that
  drift on a shared machine does not bias one batch size. The train op runs for real (the model
  trains while it is measured); the work of a step does not depend on the parameter values, so this
  does not bias the times. Each batch size is fed one fixed synthetic batch.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.errors import ProfileError
from tag_tf.profile.op_profile import (
    DEFAULT_BATCH_SIZES,
    STATISTICS,
    OpProfile,
    Traces,
    has_kernel_timeline,
    op_times_from_step_stats,
    profile_from_traces,
)
from tag_tf.runtime import sessions

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.step_stats_pb2 import StepStats
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

    from tag_tf.models.base import ModelGraph

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------------
def resolve_device(device: str = "local") -> tuple[str, str]:
    """("device type", "TF device") for a local device: "local" (the first GPU, else the CPU), "cpu",
    "gpu" or "gpu:N". Only devices of this machine can be measured."""
    import tensorflow as tf

    d = (device or "local").strip().lower()
    gpus = tf.config.list_physical_devices("GPU")
    if d == "cpu" or (d == "local" and not gpus):
        return "cpu", "/device:CPU:0"
    m = re.fullmatch(r"(?:local|gpu)(?::(\d+))?", d)
    if m is None:
        raise ProfileError(f"cannot profile device {device!r}: only devices of this machine can be measured "
                           "('local', 'cpu', 'gpu' or 'gpu:N'); GPU types that are not present get op "
                           "times from the analytical cost model")
    index = int(m.group(1) or 0)
    if index >= len(gpus):
        raise ProfileError(f"cannot profile device {device!r}: this machine has {len(gpus)} GPU(s)")
    return _gpu_type_name(gpus[index]), f"/device:GPU:{index}"


def _gpu_type_name(physical_device: tf.config.PhysicalDevice) -> str:
    import tensorflow as tf

    from tag_tf.topology.gpus import type_from_device_name

    try:
        raw = tf.config.experimental.get_device_details(physical_device).get("device_name", "")
    except (ValueError, RuntimeError):
        raw = ""
    known = type_from_device_name(raw) if raw else None
    # An unknown card keeps its own (sanitised) name: the profile is valid for it even though the
    # analytical model has no datasheet for it.
    return known or (re.sub(r"[^A-Za-z0-9.+-]+", "-", raw).strip("-") or "gpu")


# ---------------------------------------------------------------------------------------------
# Running traced steps
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainStep:
    """One runnable training step: a GraphDef, its train/init ops and a feed (tensor name -> value)."""

    graph_def: GraphDef
    train_op: str
    init_op: str | None
    feed: Mapping[str, np.ndarray]

    @classmethod
    def from_model(cls, model: ModelGraph, batch_size: int, rng: np.random.Generator) -> TrainStep:
        """From a zoo ModelGraph (its graph must accept `batch_size`: built at it, or dynamic)."""
        return cls(model.graph_def, model.train_op, model.init_op, model.feed(rng, batch_size))


def session_config(tf_device: str, inter_op_threads: int | None = 1, as_written: bool = True) -> ConfigProto:
    """A ConfigProto that keeps every node as written (no Grappler, no folding, no CSE); with
    `as_written` False, TensorFlow's default graph rewrites on (how a user's session runs)."""
    on_cpu = "device:CPU" in tf_device
    return sessions.session_config(None, timeout_ms=sessions.DEFAULT_TIMEOUT_MS, num_gpus=0 if on_cpu else None,
                                   inter_op_threads=inter_op_threads if on_cpu else None,
                                   gpu_allow_growth=not on_cpu, as_written=as_written)


class _Session:
    """A tf.Session on an imported GraphDef, variables initialised once."""

    def __init__(self, graph_def: GraphDef, init_op: str | None, tf_device: str, config: ConfigProto, target: str = ""):
        import tensorflow as tf

        self.graph = tf.Graph()
        with self.graph.as_default():
            # Nodes without a device follow the profiled device (soft placement keeps CPU-only ops
            # such as string ops on the host).
            with tf.device(tf_device):
                tf.graph_util.import_graph_def(graph_def, name="")
        self.sess = tf.compat.v1.Session(target, graph=self.graph, config=config)
        if init_op:
            self.sess.run(init_op)

    def run(self, fetch: str, feed: Mapping[str, np.ndarray], traced: bool) -> tuple[StepStats | None, float]:
        import tensorflow as tf

        if not traced:
            t0 = time.perf_counter()
            self.sess.run(fetch, feed_dict=dict(feed))
            return None, time.perf_counter() - t0
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        meta = tf.compat.v1.RunMetadata()
        t0 = time.perf_counter()
        self.sess.run(fetch, feed_dict=dict(feed), options=opts, run_metadata=meta)
        return meta.step_stats, time.perf_counter() - t0

    def close(self) -> None:
        self.sess.close()


def profile_steps(steps: Mapping[int, TrainStep], *, repeats: int = 5, warmup: int = 2,
                  device: str = "local", inter_op_threads: int | None = 1,
                  op_types: Mapping[str, str] | None = None, info: Mapping[str, object] | None = None,
                  statistic: str = "median", target: str = "", device_type: str | None = None,
                  deadline: Deadline | None = None) -> OpProfile:
    """Trace `repeats` steps at each batch size (keys of `steps`) and fit the per-op linear models.

    Steps that share one GraphDef object (a graph with a dynamic batch dimension fed different batch
    sizes) share one session; otherwise each batch size gets its own graph and session.
    `statistic` reduces the repeats per op: "median" (default: a preempted repeat on a shared CPU
    cannot move it), "mean" (the paper's average) or "min". With `target` (a server's
    "grpc://host:port"), `device` is a full device name on that cluster (".../task:1/device:GPU:0")
    and `device_type` what it is: how `tag-tf profile --cluster` measures the devices of servers.
    Past `deadline`, DeadlineExceeded (checked before every step).
    """
    batch_sizes = _checked_arguments(steps, repeats, warmup, statistic)
    if target:
        if not device_type:
            raise ProfileError(f"profiling {device} on {target}: the device type must be given")
        tf_device = device
    else:
        device_type, tf_device = resolve_device(device)
    traces = trace_steps(steps, batch_sizes, repeats=repeats, warmup=warmup, tf_device=tf_device,
                         config=session_config(tf_device, inter_op_threads), target=target,
                         rewritten_config=session_config(tf_device, inter_op_threads, as_written=False),
                         deadline=deadline)
    first = steps[batch_sizes[0]]
    return profile_from_traces(traces, first.graph_def, first.train_op, first.feed, device_type=device_type,
                               statistic=statistic, op_types=op_types, info=info)


def _checked_arguments(steps: Mapping[int, TrainStep], repeats: int, warmup: int, statistic: str
                       ) -> tuple[int, ...]:
    """The sorted batch sizes; every argument error raised before a session starts (profile_from_traces
    checks `statistic` again for callers that bring their own traces)."""
    if statistic not in STATISTICS:
        raise ProfileError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    if len(steps) < 2:
        raise ProfileError("profiling needs at least two distinct batch sizes")
    if repeats < 1 or warmup < 0:
        raise ProfileError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    batch_sizes = tuple(sorted(int(b) for b in steps))
    if batch_sizes[0] < 1:
        raise ProfileError(f"batch sizes must be >= 1, got {batch_sizes}")
    return batch_sizes


def trace_steps(steps: Mapping[int, TrainStep], batch_sizes: Sequence[int], *, repeats: int, warmup: int,
                tf_device: str, config: ConfigProto, target: str = "", rewritten_config: ConfigProto | None = None,
                deadline: Deadline | None = None) -> Traces:
    """Run the steps: warm-up, then `repeats` traced steps per batch size round-robin (drift on a
    shared machine hits every batch size alike), then as many untraced ones for the wall clock.
    With `rewritten_config` (the same settings with TensorFlow's graph rewrites on), then as many
    untraced steps again in sessions of that config, round-robin with as-written ones (what the
    rewrites do to a whole step: `OpProfile.runtime_fit`)."""
    import tensorflow as tf

    until = deadline or Deadline.never()
    by_batch: dict[int, _Session] = {}
    by_graph: dict[int, _Session] = {}
    raw: list[list[dict[str, float]]] = [[] for _ in batch_sizes]
    walls: list[list[float]] = [[] for _ in batch_sizes]
    rewritten: list[list[float]] | None = None
    kernel_timeline = False

    def sessions_for(cfg: ConfigProto, graphs: dict[int, _Session]) -> dict[int, _Session]:
        out = {}
        for b in batch_sizes:
            st = steps[b]
            key = id(st.graph_def)
            if key not in graphs:
                graphs[key] = _Session(st.graph_def, st.init_op, tf_device, cfg, target)
            out[b] = graphs[key]
        return out

    rewritten_graphs: dict[int, _Session] = {}
    try:
        by_batch = sessions_for(config, by_graph)
        for b in batch_sizes:                 # warm-up: allocations, autotuning, profiler start-up
            for _ in range(warmup):
                by_batch[b].run(steps[b].train_op, steps[b].feed, traced=False)
            by_batch[b].run(steps[b].train_op, steps[b].feed, traced=True)
        for _ in range(repeats):              # round-robin over batch sizes
            for k, b in enumerate(batch_sizes):
                until.check("profiling the training step")
                stats, _ = by_batch[b].run(steps[b].train_op, steps[b].feed, traced=True)
                raw[k].append(op_times_from_step_stats(stats))
                kernel_timeline = kernel_timeline or has_kernel_timeline(stats)
        by_rewritten = {}
        if rewritten_config is not None:
            by_rewritten = sessions_for(rewritten_config, rewritten_graphs)
            rewritten = [[] for _ in batch_sizes]
            for b in batch_sizes:             # warm-up: the rewrites run at a session's first steps
                for _ in range(max(warmup, 1)):
                    by_rewritten[b].run(steps[b].train_op, steps[b].feed, traced=False)
        for _ in range(repeats):
            for k, b in enumerate(batch_sizes):
                until.check("profiling the training step")
                _, wall = by_batch[b].run(steps[b].train_op, steps[b].feed, traced=False)
                walls[k].append(wall)
                if rewritten is not None:
                    _, wall = by_rewritten[b].run(steps[b].train_op, steps[b].feed, traced=False)
                    rewritten[k].append(wall)
    except (tf.errors.OpError, ValueError, TypeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ProfileError(f"running the training step failed: {first}") from None
    finally:
        for s in (*by_graph.values(), *rewritten_graphs.values()):
            s.close()
    return Traces(tuple(batch_sizes), raw, walls, kernel_timeline, rewritten)


def check_same_ops(graph_defs: Mapping[int, GraphDef]) -> None:
    """Raise ProfileError unless the graphs built at different batch sizes have the same op names
    (the per-op model compares one op across batch sizes)."""
    items = sorted(graph_defs.items())
    b0, gd0 = items[0]
    names0 = {n.name for n in gd0.node}
    for b, gd in items[1:]:
        names = {n.name for n in gd.node}
        if names != names0:
            diff = sorted(names ^ names0)
            raise ProfileError(f"op names differ between batch sizes {b0} and {b} ({len(diff)} ops, e.g. "
                               f"{diff[0]!r}): the graph's structure depends on the batch size")


def zoo_steps(name: str, batch_sizes: Sequence[int], *, seed: int = 0, **build_kwargs: Any) -> dict[int, TrainStep]:
    """A zoo model's training step at each batch size with seeded batches: built once when
    `dynamic_batch` is among `build_kwargs` (and true), else rebuilt per batch size (op names
    checked to be stable)."""
    from tag_tf.models import build_model

    sizes = sorted({int(b) for b in batch_sizes})
    rng = np.random.default_rng(seed)
    if build_kwargs.get("dynamic_batch"):
        model = build_model(name, batch_size=sizes[-1], seed=seed, **build_kwargs)
        return {b: TrainStep.from_model(model, b, rng) for b in sizes}
    models = {b: build_model(name, batch_size=b, seed=seed, **build_kwargs) for b in sizes}
    check_same_ops({b: m.graph_def for b, m in models.items()})
    return {b: TrainStep.from_model(m, b, rng) for b, m in models.items()}


def profile_model(name: str, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, *, repeats: int = 5,
                  warmup: int = 2, tiny: bool = False, dynamic_batch: bool = False, device: str = "local",
                  seed: int = 0, inter_op_threads: int | None = 1, target: str = "", device_type: str | None = None,
                  deadline: Deadline | None = None, **build_kwargs: Any) -> OpProfile:
    """Profile a zoo model: rebuilt at each batch size (op names checked to be stable), or built once
    with a dynamic batch dimension and fed each batch size."""
    sizes = sorted({int(b) for b in batch_sizes})
    steps = zoo_steps(name, sizes, seed=seed, tiny=tiny, dynamic_batch=dynamic_batch, **build_kwargs)
    info = {"model": name, "tiny": bool(tiny), "dynamic_batch": bool(dynamic_batch), "warmup": warmup,
            "inter_op_threads": inter_op_threads, **{k: _jsonable(v) for k, v in build_kwargs.items()}}
    log.info("profiling %s at batch sizes %s (%d repeats)", name, sizes, repeats)
    return profile_steps(steps, repeats=repeats, warmup=warmup, device=device,
                         inter_op_threads=inter_op_threads, info=info, target=target, device_type=device_type,
                         deadline=deadline)


def _jsonable(v: object) -> int | float | str | bool | None:
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


__all__ = ["TrainStep", "check_same_ops", "zoo_steps", "profile_model", "profile_steps", "resolve_device", "session_config",
           "trace_steps"]
