"""Measure per-op compute times of a single-device training step and fit t(b) = fixed + per_sample * b.

Following the TAG paper, the profiler runs single-device training under TensorFlow's full tracing at a
few batch sizes below 60, `repeats` traced steps per batch size (default 5), and fits per op a linear
model in the batch size so that larger (unprofiled) batches and replicas processing a share of the
global batch get predicted times.

What is timed
-------------
* CPU and executor-side ops: `op_end_rel - op_start_rel` of the op's NodeExecStats (nanosecond fields
  when present, else microseconds). That interval is the kernel's `Compute`; `all_start..all_end`
  also covers the executor's input/output bookkeeping (scheduling successors), which on a GPU
  overlaps with kernels and which the cost model charges as launch/host overhead instead.
* GPU ops: the summed duration of their kernels from the "/device:GPU:N/stream:all" timeline (node
  names "op:Type"); the executor interval of an asynchronous GPU op is only its launch. GPU ops that
  launch no kernel (Reshape, Identity...) keep their executor interval.
* Ignored: the executor's internal nodes (names starting with "_": _SOURCE, _Send/_Recv, _Arg/_Retval
  feeds and fetches), memcpys and stream syncs.

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
* Per op and batch size we keep the median over repeats (robust to the noise of a shared CPU; the
  paper averages: `statistic="mean"`), then fit the line with the Theil-Sen estimator (median of
  pairwise slopes), clipped to non-negative; a slope within the repeats' noise is set to 0.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any, Mapping, Sequence

import numpy as np

from tag_tf.errors import ProfileError

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES: tuple[int, ...] = (2, 4, 8, 16)
_STREAM_ALL = re.compile(r"/device:GPU:\d+/stream:all$")
_GPU_TIMELINE = re.compile(r"/device:GPU:\d+/")   # stream / memcpy / sync pseudo-devices


# ---------------------------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class OpProfile:
    """Per-op linear time models measured on one device type (seconds).

    time(op, b) = fixed[i] + per_sample[i] * b, b = samples the op instance processes.
    `times[i, k]` is the median measured time at batch_sizes[k]; `raw[k, r, i]` every traced repeat
    (NaN where the op did not run); `step_times[k]` the median untraced wall-clock step.
    """

    device_type: str
    op_names: tuple[str, ...]
    fixed: np.ndarray
    per_sample: np.ndarray
    batch_sizes: tuple[int, ...]
    times: np.ndarray
    raw: np.ndarray
    op_types: tuple[str, ...] = ()
    step_times: np.ndarray | None = None
    repeats: int = 0
    fingerprint: str = ""
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.op_names)
        if self.fixed.shape != (n,) or self.per_sample.shape != (n,):
            raise ValueError("fixed/per_sample must have one entry per op")
        if self.times.shape != (n, len(self.batch_sizes)):
            raise ValueError("times must be [ops, batch sizes]")

    @property
    def num_ops(self) -> int:
        return len(self.op_names)

    def index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.op_names)}

    def predict(self, samples: float) -> np.ndarray:
        """Fitted time of every op at `samples` samples."""
        return self.fixed + self.per_sample * float(samples)

    def total(self, samples: float) -> float:
        """Fitted sum of op times for one step at `samples` samples."""
        return float(self.predict(samples).sum())

    def measured_total(self, batch_size: int) -> float:
        """Sum of the median measured op times at a profiled batch size."""
        k = self.batch_sizes.index(batch_size)
        return float(np.nansum(self.times[:, k]))

    def top(self, n: int, samples: float) -> list[tuple[str, str, float]]:
        """The n ops with the largest fitted time at `samples`: (name, type, seconds)."""
        t = self.predict(samples)
        order = np.argsort(-t, kind="stable")[:n]
        types = self.op_types or ("",) * self.num_ops
        return [(self.op_names[i], types[i], float(t[i])) for i in order]

    # -- serialisation (JSON-ready; raw times as integer nanoseconds, -1 = missing) ------------
    def to_dict(self) -> dict[str, Any]:
        raw = np.where(np.isnan(self.raw), -1, np.round(self.raw * 1e9)).astype(np.int64)
        return {
            "device_type": self.device_type, "op_names": list(self.op_names), "op_types": list(self.op_types),
            "fixed": self.fixed.tolist(), "per_sample": self.per_sample.tolist(),
            "batch_sizes": list(self.batch_sizes), "times": _nan_to_none(self.times), "raw_ns": raw.tolist(),
            "step_times": None if self.step_times is None else self.step_times.tolist(),
            "repeats": self.repeats, "fingerprint": self.fingerprint, "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OpProfile":
        n, k = len(d["op_names"]), len(d["batch_sizes"])
        raw = np.asarray(d.get("raw_ns", []), dtype=np.float64)
        raw = np.where(raw < 0, np.nan, raw * 1e-9) if raw.size else np.full((k, 0, n), np.nan)
        times = np.asarray(d["times"], dtype=np.float64).reshape(n, k)
        step = d.get("step_times")
        return cls(device_type=str(d["device_type"]), op_names=tuple(d["op_names"]),
                   fixed=np.asarray(d["fixed"], dtype=np.float64).reshape(n),
                   per_sample=np.asarray(d["per_sample"], dtype=np.float64).reshape(n),
                   batch_sizes=tuple(int(b) for b in d["batch_sizes"]), times=times, raw=raw,
                   op_types=tuple(d.get("op_types", ())),
                   step_times=None if step is None else np.asarray(step, dtype=np.float64),
                   repeats=int(d.get("repeats", 0)), fingerprint=str(d.get("fingerprint", "")),
                   info=dict(d.get("info", {})))


def _nan_to_none(a: np.ndarray) -> list:
    """Nested lists with NaN as None: strict JSON (numpy reads None back as NaN)."""
    return np.where(np.isnan(a), None, a).tolist()


# ---------------------------------------------------------------------------------------------
# The linear fit
# ---------------------------------------------------------------------------------------------
def fit_linear(batch_sizes: Sequence[int], times: np.ndarray, noise: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Fit t = fixed + per_sample * b per row of `times` [N, K] (NaN = missing). Non-negative.

    Theil-Sen: the slope is the median of the pairwise slopes, the intercept the median residual,
    so one noisy batch size (a preempted run on a shared CPU) cannot tilt the line. A negative slope
    becomes 0 (the op does not grow with the batch); a negative intercept becomes 0 with the slope
    refit through the origin. With `noise` (per op, the standard error of one point), a slope whose
    rise over the profiled range is below 2 standard errors of a difference is noise: it becomes 0
    and fixed the median time. Clipping negative slopes alone would keep every positive noise slope
    and bias per_sample upwards summed over the thousands of batch-independent ops of a graph.
    """
    b = np.asarray(batch_sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 2 or t.shape[1] != b.size:
        raise ValueError(f"times must be [ops, {b.size}], got {t.shape}")
    if b.size < 2 or len(set(b.tolist())) < 2:
        raise ValueError("the linear fit needs at least two distinct batch sizes")
    n = t.shape[0]
    i, j = np.triu_indices(b.size, k=1)
    keep = b[j] != b[i]
    i, j = i[keep], j[keep]
    with np.errstate(invalid="ignore", divide="ignore"), _quiet_nan_warnings():
        slopes = (t[:, j] - t[:, i]) / (b[j] - b[i])
        slope = np.nanmedian(slopes, axis=1) if n else np.zeros(0)
        slope = np.where(np.isnan(slope), 0.0, np.maximum(slope, 0.0))
        intercept = np.nanmedian(t - slope[:, None] * b, axis=1) if n else np.zeros(0)
        through_origin = np.nanmedian(t / b, axis=1) if n else np.zeros(0)
    neg = intercept < 0
    slope = np.where(neg, np.maximum(through_origin, 0.0), slope)
    intercept = np.where(neg, 0.0, intercept)
    if noise is not None and n:
        rise = slope * (b.max() - b.min())
        flat = rise < 2.0 * np.sqrt(2.0) * np.nan_to_num(np.asarray(noise, dtype=np.float64))
        with _quiet_nan_warnings():
            level = np.nanmedian(t, axis=1)
        slope = np.where(flat, 0.0, slope)
        intercept = np.where(flat, level, intercept)
    missing = np.isnan(intercept)
    return np.where(missing, 0.0, intercept), np.where(missing | np.isnan(slope), 0.0, slope)


def repeat_noise(raw: np.ndarray) -> np.ndarray:
    """Per-op standard error of one batch size's time from repeats `raw` [K, R, N]: the median over
    batch sizes of 1.4826 * MAD / sqrt(R) (robust to a preempted repeat)."""
    with _quiet_nan_warnings():
        med = np.nanmedian(raw, axis=1, keepdims=True)
        mad = np.nanmedian(np.abs(raw - med), axis=1)                       # [K, N]
        return 1.4826 * np.nanmedian(mad, axis=0) / np.sqrt(raw.shape[1])


class _quiet_nan_warnings:
    """Silence numpy's 'All-NaN slice' RuntimeWarning (all-NaN rows become 0 explicitly)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# ---------------------------------------------------------------------------------------------
# Step stats -> per-op times
# ---------------------------------------------------------------------------------------------
def _interval_ns(ns: Any) -> float:
    if ns.all_start_nanos:
        return float(ns.op_end_rel_nanos - ns.op_start_rel_nanos)
    return 1000.0 * float(ns.op_end_rel_micros - ns.op_start_rel_micros)


def op_times_from_step_stats(step_stats: Any) -> dict[str, float]:
    """Per-op compute time in seconds from a RunMetadata.step_stats (see the module docstring)."""
    executor: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for dev in step_stats.dev_stats:
        if _STREAM_ALL.search(dev.device):
            for ns in dev.node_stats:
                name = ns.node_name.split(":", 1)[0]    # "op_name:OpType"; ':' is not legal in op names
                if name and not name.startswith("_"):
                    kernels[name] = kernels.get(name, 0.0) + 1e-9 * _interval_ns(ns)
        elif _GPU_TIMELINE.search(dev.device):
            continue                                     # per-stream duplicates, memcpy, sync
        else:
            for ns in dev.node_stats:
                name = ns.node_name
                if name and not name.startswith("_"):
                    executor[name] = executor.get(name, 0.0) + 1e-9 * max(_interval_ns(ns), 0.0)
    executor.update(kernels)
    return executor


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


def _gpu_type_name(physical_device: Any) -> str:
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

    graph_def: Any
    train_op: str
    init_op: str | None
    feed: Mapping[str, np.ndarray]

    @classmethod
    def from_model(cls, model: Any, batch_size: int, rng: np.random.Generator) -> "TrainStep":
        """From a zoo ModelGraph (its graph must accept `batch_size`: built at it, or dynamic)."""
        return cls(model.graph_def, model.train_op, model.init_op, model.feed(rng, batch_size))


def session_config(tf_device: str, inter_op_threads: int | None = 1) -> Any:
    """A ConfigProto that keeps every node as written (no Grappler, no folding, no CSE)."""
    import tensorflow as tf

    from tag_tf.runtime.sessions import DEFAULT_TIMEOUT_MS, keep_as_written

    cfg = keep_as_written(tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                                   operation_timeout_in_ms=DEFAULT_TIMEOUT_MS))
    if "device:CPU" in tf_device:
        cfg.device_count["GPU"] = 0
        if inter_op_threads:
            cfg.inter_op_parallelism_threads = int(inter_op_threads)
    else:
        cfg.gpu_options.allow_growth = True
    return cfg


class _Session:
    """A tf.Session on an imported GraphDef, variables initialised once."""

    def __init__(self, graph_def: Any, init_op: str | None, tf_device: str, config: Any, target: str = ""):
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

    def run(self, fetch: str, feed: Mapping[str, np.ndarray], traced: bool) -> tuple[Any, float]:
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
                  op_types: Mapping[str, str] | None = None, info: Mapping[str, Any] | None = None,
                  statistic: str = "median", target: str = "", device_type: str | None = None) -> OpProfile:
    """Trace `repeats` steps at each batch size (keys of `steps`) and fit the per-op linear models.

    Steps that share one GraphDef object (a graph with a dynamic batch dimension fed different batch
    sizes) share one session; otherwise each batch size gets its own graph and session.
    `statistic` reduces the repeats per op: "median" (default: a preempted repeat on a shared CPU
    cannot move it), "mean" (the paper's average) or "min". With `target` (a server's
    "grpc://host:port"), `device` is a full device name on that cluster (".../task:1/device:GPU:0")
    and `device_type` what it is: how `tag-tf profile --cluster` measures the devices of servers.
    """
    reducers = {"median": np.nanmedian, "mean": np.nanmean, "min": np.nanmin}
    if statistic not in reducers:
        raise ProfileError(f"statistic must be one of {', '.join(reducers)}, got {statistic!r}")
    if len(steps) < 2:
        raise ProfileError("profiling needs at least two distinct batch sizes")
    if repeats < 1 or warmup < 0:
        raise ProfileError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    batch_sizes = tuple(sorted(int(b) for b in steps))
    if batch_sizes[0] < 1:
        raise ProfileError(f"batch sizes must be >= 1, got {batch_sizes}")
    import tensorflow as tf

    if target:
        if not device_type:
            raise ProfileError(f"profiling {device} on {target}: the device type must be given")
        tf_device = device
    else:
        device_type, tf_device = resolve_device(device)
    config = session_config(tf_device, inter_op_threads)

    sessions: dict[int, _Session] = {}
    by_graph: dict[int, _Session] = {}
    raw: list[list[dict[str, float]]] = [[] for _ in batch_sizes]
    walls: list[list[float]] = [[] for _ in batch_sizes]
    kernel_timeline = False
    try:
        for b in batch_sizes:
            st = steps[b]
            key = id(st.graph_def)
            if key not in by_graph:
                by_graph[key] = _Session(st.graph_def, st.init_op, tf_device, config, target)
            sessions[b] = by_graph[key]
        for b in batch_sizes:                 # warm-up: allocations, autotuning, profiler start-up
            for _ in range(warmup):
                sessions[b].run(steps[b].train_op, steps[b].feed, traced=False)
            sessions[b].run(steps[b].train_op, steps[b].feed, traced=True)
        for _ in range(repeats):              # round-robin over batch sizes
            for k, b in enumerate(batch_sizes):
                stats, _ = sessions[b].run(steps[b].train_op, steps[b].feed, traced=True)
                raw[k].append(op_times_from_step_stats(stats))
                kernel_timeline = kernel_timeline or any(_STREAM_ALL.search(d.device) for d in stats.dev_stats)
        for _ in range(repeats):
            for k, b in enumerate(batch_sizes):
                _, wall = sessions[b].run(steps[b].train_op, steps[b].feed, traced=False)
                walls[k].append(wall)
    except (tf.errors.OpError, ValueError, TypeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ProfileError(f"running the training step failed: {first}") from None
    finally:
        for s in by_graph.values():
            s.close()

    # Ops in graph order (first step's GraphDef), restricted to those that ever ran.
    seen = set().union(*(d.keys() for runs in raw for d in runs))
    graph_order = [n.name for n in steps[batch_sizes[0]].graph_def.node]
    names = tuple(n for n in graph_order if n in seen) + tuple(sorted(seen - set(graph_order)))
    idx = {n: i for i, n in enumerate(names)}
    cube = np.full((len(batch_sizes), repeats, len(names)), np.nan)
    for k, runs in enumerate(raw):
        for r, d in enumerate(runs):
            for name, t in d.items():
                cube[k, r, idx[name]] = t
    with _quiet_nan_warnings():
        times = reducers[statistic](cube, axis=1).T if names else np.zeros((0, len(batch_sizes)))
    fixed, per_sample = fit_linear(batch_sizes, times, repeat_noise(cube) if repeats > 1 else None)
    first = steps[batch_sizes[0]]
    if op_types is None:
        op_types = {n.name: n.op for n in first.graph_def.node}
    absorbed, untraced = _untraced_ops(first.graph_def, first.train_op, set(names), first.feed)
    info = {**dict(info or {}), "statistic": statistic, "absorbed": absorbed, "untraced": untraced}
    if device_type != "cpu":
        # Without CUPTI the GPU trace has no kernel timeline and GPU ops carry their launch time only.
        info["kernel_timeline"] = kernel_timeline
        if not kernel_timeline:
            log.warning("the GPU trace has no kernel timeline (is CUPTI available?): op times are launch "
                        "times, not kernel times")
    return OpProfile(device_type=device_type, op_names=names, fixed=fixed, per_sample=per_sample,
                     batch_sizes=batch_sizes, times=times, raw=cube,
                     op_types=tuple(op_types.get(n, "") for n in names),
                     step_times=np.array([float(np.median(w)) for w in walls]), repeats=repeats, info=info)


def _untraced_ops(graph_def: Any, train_op: str, traced: set[str], feed: Mapping[str, Any]
                  ) -> tuple[dict[str, str], list[str]]:
    """Ops the step must run that left no trace: ({op: traced consumer whose kernel absorbed it},
    [others]). Runtime passes outside Grappler fuse ops (oneDNN turns Conv2D+BiasAdd into one kernel
    named after the BiasAdd); fed placeholders become _Arg nodes and are not counted."""
    nodes = {n.name: n for n in graph_def.node}
    fed = {name.split(":", 1)[0] for name in feed}
    consumers: dict[str, list[str]] = {}
    for n in graph_def.node:
        for inp in n.input:
            if not inp.startswith("^"):
                consumers.setdefault(inp.split(":", 1)[0], []).append(n.name)
    reach: set[str] = set()
    stack = [train_op]
    while stack:
        name = stack.pop()
        if name in reach or name not in nodes or name in fed:
            continue
        reach.add(name)
        stack.extend(i.lstrip("^").split(":", 1)[0] for i in nodes[name].input)
    absorbed: dict[str, str] = {}
    others: list[str] = []
    for name in sorted(reach - traced):
        users = sorted({c for c in consumers.get(name, ()) if c in traced and c in reach})
        if len(users) == 1:
            absorbed[name] = users[0]
        else:
            others.append(name)
    return absorbed, others


def check_same_ops(graph_defs: Mapping[int, Any]) -> None:
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


def profile_model(name: str, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, *, repeats: int = 5,
                  warmup: int = 2, tiny: bool = False, dynamic_batch: bool = False, device: str = "local",
                  seed: int = 0, inter_op_threads: int | None = 1, target: str = "", device_type: str | None = None,
                  **build_kwargs: Any) -> OpProfile:
    """Profile a zoo model: rebuilt at each batch size (op names checked to be stable), or built once
    with a dynamic batch dimension and fed each batch size."""
    from tag_tf.models import build_model

    sizes = sorted({int(b) for b in batch_sizes})
    rng = np.random.default_rng(seed)
    if dynamic_batch:
        model = build_model(name, batch_size=sizes[-1], tiny=tiny, dynamic_batch=True, seed=seed, **build_kwargs)
        steps = {b: TrainStep.from_model(model, b, rng) for b in sizes}
    else:
        models = {b: build_model(name, batch_size=b, tiny=tiny, seed=seed, **build_kwargs) for b in sizes}
        check_same_ops({b: m.graph_def for b, m in models.items()})
        steps = {b: TrainStep.from_model(m, b, rng) for b, m in models.items()}
    info = {"model": name, "tiny": bool(tiny), "dynamic_batch": bool(dynamic_batch), "warmup": warmup,
            "inter_op_threads": inter_op_threads, **{k: _jsonable(v) for k, v in build_kwargs.items()}}
    log.info("profiling %s at batch sizes %s (%d repeats)", name, sizes, repeats)
    return profile_steps(steps, repeats=repeats, warmup=warmup, device=device,
                         inter_op_threads=inter_op_threads, info=info, target=target, device_type=device_type)


def _jsonable(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


__all__ = ["OpProfile", "TrainStep", "DEFAULT_BATCH_SIZES", "fit_linear", "repeat_noise", "op_times_from_step_stats",
           "resolve_device", "session_config", "profile_steps", "profile_model", "check_same_ops"]
