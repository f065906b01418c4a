"""Per-op compute times of a single-device training step, t(b) = fixed + per_sample * b: the profile,
its fit, and how traced step stats become op times (`tag_tf.measure.ops` runs the traced steps).

Following the TAG paper, single-device training runs under TensorFlow's full tracing at a few batch
sizes below 60, a few traced steps per batch size, and each op gets a linear model in the batch size
so that larger (unprofiled) batches and replicas processing a share of the global batch get
predicted times.

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

Fit
---
* Per op and batch size we keep the median over repeats (robust to the noise of a shared CPU; the
  paper averages: `statistic="mean"`), then fit the line with the Theil-Sen estimator (median of
  pairwise slopes), clipped to non-negative; a slope within the repeats' noise is set to 0.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import numpy as np

from tag_tf.errors import ProfileError

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.step_stats_pb2 import NodeExecStats, StepStats

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES: tuple[int, ...] = (2, 4, 8, 16)
KERNEL_STREAM = re.compile(r"/device:GPU:\d+/stream:all$")
_GPU_TIMELINE = re.compile(r"/device:GPU:\d+/")   # stream / memcpy / sync pseudo-devices


# ---------------------------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------------------------
class OpProfileDict(TypedDict):
    """`OpProfile.to_dict()` (JSON; see there); `from_dict` defaults the keys not required."""

    device_type: str
    op_names: list[str]
    fixed: list[float]
    per_sample: list[float]
    batch_sizes: list[int]
    times: list[list[float | None]]
    op_types: NotRequired[list[str]]
    raw_ns: NotRequired[list[list[list[int]]]]
    step_times: NotRequired[list[float] | None]
    repeats: NotRequired[int]
    fingerprint: NotRequired[str]
    info: NotRequired[dict[str, object]]
    rewritten_step_times: NotRequired[list[float] | None]


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
    rewritten_step_times: np.ndarray | None = None    # untraced steps with TensorFlow's graph rewrites on

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

    def runtime_fit(self) -> RuntimeFit | None:
        """How the graph should run and what its whole steps take against the sum of its op times
        (`RuntimeFit`), where the profile measured whole steps both as written and with TensorFlow's
        graph rewrites (Grappler); None for profiles without both."""
        if self.step_times is None or self.rewritten_step_times is None or not self.batch_sizes:
            return None
        written = np.asarray(self.step_times, dtype=np.float64)
        rewritten = np.asarray(self.rewritten_step_times, dtype=np.float64)
        totals = np.array([self.total(b) for b in self.batch_sizes])
        if written.shape != totals.shape or rewritten.shape != totals.shape or not np.all(totals > 0):
            return None
        ratio = float(np.median(rewritten / written))
        as_written = ratio > AS_WRITTEN_MARGIN
        chosen = written if as_written else rewritten
        scale, overhead = step_fit(totals, chosen, self.num_ops)
        return RuntimeFit(as_written=as_written, scale=scale, rewrites_ratio=ratio,
                          batch_sizes=tuple(self.batch_sizes), as_written_s=tuple(float(x) for x in written),
                          rewritten_s=tuple(float(x) for x in rewritten), op_overhead_s=overhead)

    def scaled(self, factor: float, overhead_s: float = 0.0) -> OpProfile:
        """This profile with every op time multiplied by `factor` and `overhead_s` added to each (what
        the ops take in whole steps: RuntimeFit)."""
        f, o = float(factor), float(overhead_s)
        return dataclasses.replace(self, fixed=self.fixed * f + o, per_sample=self.per_sample * f,
                                   times=self.times * f + o, raw=self.raw * f + o)

    def top(self, n: int, samples: float) -> list[tuple[str, str, float]]:
        """The n ops with the largest fitted time at `samples`: (name, type, seconds)."""
        t = self.predict(samples)
        order = np.argsort(-t, kind="stable")[:n]
        types = self.op_types or ("",) * self.num_ops
        return [(self.op_names[i], types[i], float(t[i])) for i in order]

    # -- serialisation (JSON-ready; raw times as integer nanoseconds, -1 = missing) ------------
    def to_dict(self) -> OpProfileDict:
        raw = np.where(np.isnan(self.raw), -1, np.round(self.raw * 1e9)).astype(np.int64)
        return {
            "device_type": self.device_type, "op_names": list(self.op_names), "op_types": list(self.op_types),
            "fixed": self.fixed.tolist(), "per_sample": self.per_sample.tolist(),
            "batch_sizes": list(self.batch_sizes), "times": _nan_to_none(self.times), "raw_ns": raw.tolist(),
            "step_times": None if self.step_times is None else self.step_times.tolist(),
            "repeats": self.repeats, "fingerprint": self.fingerprint, "info": dict(self.info),
            "rewritten_step_times": (None if self.rewritten_step_times is None
                                     else self.rewritten_step_times.tolist()),
        }

    @classmethod
    def from_dict(cls, d: OpProfileDict) -> OpProfile:
        n, k = len(d["op_names"]), len(d["batch_sizes"])
        raw = np.asarray(d.get("raw_ns", []), dtype=np.float64)
        raw = np.where(raw < 0, np.nan, raw * 1e-9) if raw.size else np.full((k, 0, n), np.nan)
        times = np.asarray(d["times"], dtype=np.float64).reshape(n, k)
        step, rewritten = d.get("step_times"), d.get("rewritten_step_times")
        return cls(device_type=str(d["device_type"]), op_names=tuple(d["op_names"]),
                   fixed=np.asarray(d["fixed"], dtype=np.float64).reshape(n),
                   per_sample=np.asarray(d["per_sample"], dtype=np.float64).reshape(n),
                   batch_sizes=tuple(int(b) for b in d["batch_sizes"]), times=times, raw=raw,
                   op_types=tuple(d.get("op_types", ())),
                   step_times=None if step is None else np.asarray(step, dtype=np.float64),
                   repeats=int(d.get("repeats", 0)), fingerprint=str(d.get("fingerprint", "")),
                   info=dict(d.get("info", {})),
                   rewritten_step_times=None if rewritten is None else np.asarray(rewritten, dtype=np.float64))


# A graph runs as written (TensorFlow's graph rewrites off) only where the rewritten steps were this
# much slower: on a tie the user's own runtime (TensorFlow's defaults) is kept.
AS_WRITTEN_MARGIN = 1.1


@dataclasses.dataclass(frozen=True)
class RuntimeFit:
    """What whole untraced steps of a profiled graph took, run as written (no Grappler: how its op
    times were traced) and with TensorFlow's default graph rewrites, at each profiled batch size.

    `as_written`: the rewrites made steps slower by more than AS_WRITTEN_MARGIN (median ratio
    `rewrites_ratio`), so compiled graphs of this program run as written. `scale` and
    `op_overhead_s`: the chosen runtime's steps against the sum of the fitted op times at the same
    batch sizes, step = scale * ops + (number of ops) * op_overhead_s (`step_fit`): what an op costs
    inside a whole step (rewrites, overlap; the executor's own time per op) against its traced
    kernel time."""

    as_written: bool
    scale: float
    rewrites_ratio: float
    batch_sizes: tuple[int, ...]
    as_written_s: tuple[float, ...]
    rewritten_s: tuple[float, ...]
    op_overhead_s: float = 0.0

    def describe(self) -> str:
        each = f" + {self.op_overhead_s * 1e6:.3g} us each" if self.op_overhead_s > 0 else ""
        return (f"TensorFlow's graph rewrites {'slow' if self.rewrites_ratio > 1 else 'speed'} whole steps "
                f"{max(self.rewrites_ratio, 1 / self.rewrites_ratio):.2f}x: "
                f"{'runs as written' if self.as_written else 'runs rewritten'}; op times x{self.scale:.2f}{each}")


def step_fit(totals: np.ndarray, steps: np.ndarray, num_ops: int) -> tuple[float, float]:
    """(scale, per-op overhead) with steps = scale * totals + num_ops * overhead, by least squares
    over the profiled batch sizes (three or more), where the line has a positive slope and an
    intercept of at least STEP_OVERHEAD_MIN of the smallest step; else (the median of steps /
    totals, 0). A constant share of every op (the median ratio alone) extrapolated the tiny mlp's
    steps from batches 8-32 to 48 at 2.5 ms where they take 1.6 ms: its steps are 0.5 ms of
    executor time (5.5 us per op over 89 ops) beside 0.76x of the traced kernels. The overhead
    repeats with every op run, as in each micro-batch of a pipelined plan; a share would not."""
    totals, steps = np.asarray(totals, dtype=np.float64), np.asarray(steps, dtype=np.float64)
    median = float(np.median(steps / totals))
    if len(totals) < 3 or num_ops < 1 or np.ptp(totals) <= 0:
        return median, 0.0
    slope, intercept = np.polyfit(totals, steps, 1)
    if not (slope > 0 and intercept >= STEP_OVERHEAD_MIN * float(steps.min())):
        return median, 0.0
    return float(slope), float(intercept) / num_ops


# The per-op overhead of `step_fit` counts where the fitted line's intercept is at least this much
# of the smallest profiled step (below, the median ratio describes the steps as well).
STEP_OVERHEAD_MIN = 0.05


def _nan_to_none(a: np.ndarray) -> list:
    """Nested lists with NaN as None: strict JSON (numpy reads None back as NaN)."""
    out = a.astype(object)
    out[np.isnan(a)] = None
    return out.tolist()


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
    with np.errstate(invalid="ignore", divide="ignore"), quiet_nan_warnings():
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
        with quiet_nan_warnings():
            level = np.nanmedian(t, axis=1)
        slope = np.where(flat, 0.0, slope)
        intercept = np.where(flat, level, intercept)
    missing = np.isnan(intercept)
    return np.where(missing, 0.0, intercept), np.where(missing | np.isnan(slope), 0.0, slope)


def repeat_noise(raw: np.ndarray) -> np.ndarray:
    """Per-op standard error of one batch size's time from repeats `raw` [K, R, N]: the median over
    batch sizes of 1.4826 * MAD / sqrt(R) (robust to a preempted repeat)."""
    with quiet_nan_warnings():
        med = np.nanmedian(raw, axis=1, keepdims=True)
        mad = np.nanmedian(np.abs(raw - med), axis=1)                       # [K, N]
        return 1.4826 * np.nanmedian(mad, axis=0) / np.sqrt(raw.shape[1])


class quiet_nan_warnings:
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
def _interval_ns(ns: NodeExecStats) -> float:
    if ns.all_start_nanos:
        return float(ns.op_end_rel_nanos - ns.op_start_rel_nanos)
    return 1000.0 * float(ns.op_end_rel_micros - ns.op_start_rel_micros)


def op_times_from_step_stats(step_stats: StepStats) -> dict[str, float]:
    """Per-op compute time in seconds from a RunMetadata.step_stats (see the module docstring)."""
    executor: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for dev in step_stats.dev_stats:
        if KERNEL_STREAM.search(dev.device):
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


def has_kernel_timeline(step_stats: StepStats) -> bool:
    """Whether a GPU trace carries the per-kernel stream timeline (it does not without CUPTI)."""
    return any(KERNEL_STREAM.search(d.device) for d in step_stats.dev_stats)


# ---------------------------------------------------------------------------------------------
# Traced steps -> the profile
# ---------------------------------------------------------------------------------------------
STATISTICS: dict[str, Callable[..., np.ndarray]] = {"median": np.nanmedian, "mean": np.nanmean, "min": np.nanmin}


@dataclasses.dataclass(frozen=True)
class Traces:
    """What the traced steps of one device gave: per batch size, per repeat, {op: seconds}; and the
    untraced wall-clock steps."""

    batch_sizes: tuple[int, ...]
    ops: list[list[dict[str, float]]]      # [batch size][repeat] -> {op: seconds}
    walls: list[list[float]]               # [batch size][repeat] -> seconds
    kernel_timeline: bool = False
    rewritten_walls: list[list[float]] | None = None     # the same steps with TensorFlow's graph rewrites


def profile_from_traces(traces: Traces, graph_def: GraphDef, train_op: str, feed: Mapping[str, object], *,
                        device_type: str, statistic: str = "median", op_types: Mapping[str, str] | None = None,
                        info: Mapping[str, object] | None = None) -> OpProfile:
    """The OpProfile of `traces` taken on the step (`graph_def`, `train_op`, `feed`) of the first
    batch size: ops in graph order, repeats reduced by `statistic`, lines fitted."""
    if statistic not in STATISTICS:
        raise ProfileError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    batch_sizes, raw = traces.batch_sizes, traces.ops
    repeats = len(raw[0]) if raw else 0
    # Ops in graph order (first step's GraphDef), restricted to those that ever ran.
    seen = set().union(*(d.keys() for runs in raw for d in runs))
    graph_order = [n.name for n in graph_def.node]
    names = tuple(n for n in graph_order if n in seen) + tuple(sorted(seen - set(graph_order)))
    idx = {n: i for i, n in enumerate(names)}
    cube = np.full((len(batch_sizes), repeats, len(names)), np.nan)
    for k, runs in enumerate(raw):
        for r, d in enumerate(runs):
            for name, t in d.items():
                cube[k, r, idx[name]] = t
    with quiet_nan_warnings():
        times = STATISTICS[statistic](cube, axis=1).T if names else np.zeros((0, len(batch_sizes)))
    fixed, per_sample = fit_linear(batch_sizes, times, repeat_noise(cube) if repeats > 1 else None)
    if op_types is None:
        op_types = {n.name: n.op for n in graph_def.node}
    absorbed, untraced = untraced_ops(graph_def, train_op, set(names), feed)
    info = {**dict(info or {}), "statistic": statistic, "absorbed": absorbed, "untraced": untraced}
    if device_type != "cpu":
        # Without CUPTI the GPU trace has no kernel timeline and GPU ops carry their launch time only.
        info["kernel_timeline"] = traces.kernel_timeline
        if not traces.kernel_timeline:
            log.warning("the GPU trace has no kernel timeline (is CUPTI available?): op times are launch "
                        "times, not kernel times")
    return OpProfile(device_type=device_type, op_names=names, fixed=fixed, per_sample=per_sample,
                     batch_sizes=batch_sizes, times=times, raw=cube,
                     op_types=tuple(op_types.get(n, "") for n in names),
                     step_times=np.array([float(np.median(w)) for w in traces.walls]), repeats=repeats, info=info,
                     rewritten_step_times=(None if not traces.rewritten_walls else
                                           np.array([float(np.median(w)) for w in traces.rewritten_walls])))


def untraced_ops(graph_def: GraphDef, train_op: str, traced: set[str], feed: Mapping[str, object]
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


__all__ = ["AS_WRITTEN_MARGIN", "OpProfile", "RuntimeFit", "Traces", "DEFAULT_BATCH_SIZES", "STATISTICS", "fit_linear", "repeat_noise",
           "op_times_from_step_stats", "has_kernel_timeline", "profile_from_traces", "untraced_ops"]
