"""Python face of the native discrete-event engine (kernels/engine.h).

A `TaskGraph` is an already-expanded task graph: compute ops, transfers and collectives are all
tasks that hold a set of resources (device queues, links, collective channels) for their duration.
`Engine.run` / `simulate` return a `SimResult` with per-task times, makespan, per-resource busy time
and per-pool peak memory. The exact scheduling and memory semantics are documented at the top of
kernels/engine.h; in short:

* a task is ready when all predecessors have ended (ready time = latest predecessor end, 0 if none);
* each resource serves one task at a time, FIFO in the global order (ready_time, task_id); a task
  starts once it heads the queue of *every* resource it holds and all are free (all-or-nothing);
* a buffer is live over [start of its producer, end of its last data reader) (its producer's own
  end if nobody reads it), so at one timestamp frees happen before allocations;
  peak = persistent + max live, oom = peak > capacity.

Hot loops should keep one `Engine` and call `run` repeatedly: its buffers are reused.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Sequence

import numpy as np

from tag_tf import _simcore
from tag_tf.errors import TagError

__all__ = [
    "CycleError",
    "Engine",
    "SimResult",
    "SimSummary",
    "TaskGraph",
    "TaskGraphBuilder",
    "make_task_graph",
    "simulate",
]


class CycleError(TagError):
    """The task graph has a cycle: some tasks can never become ready. `cycle` holds one, as ids."""

    def __init__(self, message: str, cycle: tuple[int, ...], num_unfinished: int):
        super().__init__(message)
        self.cycle = cycle
        self.num_unfinished = num_unfinished


# (field, dtype) of the per-graph arrays, in the order the native functions take them.
_ARRAYS: tuple[tuple[str, type], ...] = (
    ("duration", np.float64),
    ("res_ptr", np.int32),
    ("res", np.int32),
    ("succ_ptr", np.int32),
    ("succ", np.int32),
    ("succ_data", np.uint8),
    ("mem_device", np.int32),
    ("mem_bytes", np.int64),
    ("persistent_bytes", np.int64),
    ("capacity_bytes", np.int64),
)


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


@dataclasses.dataclass(frozen=True, eq=False)
class TaskGraph:
    """An expanded task graph in CSR form (validated on construction; arrays are read-only views).

    duration[n] f64 seconds; res_ptr[n+1]/res int32: resources each task holds; succ_ptr[n+1]/succ
    int32 successors with succ_data uint8 (1 = the successor reads this task's buffer);
    mem_device[n] int32 pool of the task's output buffer (-1 = none) and mem_bytes[n] int64;
    persistent_bytes[D], capacity_bytes[D] int64. The optional tuples are for display only.
    Construct with exact dtypes, or use `make_task_graph` / `TaskGraphBuilder` to convert.
    """

    duration: np.ndarray
    res_ptr: np.ndarray
    res: np.ndarray
    succ_ptr: np.ndarray
    succ: np.ndarray
    succ_data: np.ndarray
    mem_device: np.ndarray
    mem_bytes: np.ndarray
    persistent_bytes: np.ndarray
    capacity_bytes: np.ndarray
    num_resources: int
    names: tuple[str, ...] | None = None            # per task
    categories: tuple[str, ...] | None = None       # per task, colours the Gantt chart / trace "cat"
    resource_names: tuple[str, ...] | None = None   # per resource
    resource_kinds: tuple[str, ...] | None = None   # per resource, e.g. "gpu", "link", "collective"
    pool_names: tuple[str, ...] | None = None       # per memory pool

    def __post_init__(self) -> None:
        for field, dtype in _ARRAYS:
            a = getattr(self, field)
            if not isinstance(a, np.ndarray):
                raise ValueError(f"TaskGraph.{field}: expected a numpy array, got {type(a).__name__}")
            if a.dtype != dtype:
                raise ValueError(f"TaskGraph.{field}: expected dtype {np.dtype(dtype).name}, got {a.dtype.name} "
                                 "(use make_task_graph to convert)")
            if a.ndim != 1:
                raise ValueError(f"TaskGraph.{field}: expected a 1-D array, got shape {a.shape}")
            object.__setattr__(self, field, _readonly(np.ascontiguousarray(a)))
        if isinstance(self.num_resources, bool) or not isinstance(self.num_resources, (int, np.integer)):
            raise ValueError(f"TaskGraph.num_resources: expected an int, got {self.num_resources!r}")
        object.__setattr__(self, "num_resources", int(self.num_resources))
        n = self.duration.shape[0]
        expect = {"res_ptr": n + 1, "succ_ptr": n + 1, "mem_device": n, "mem_bytes": n,
                  "succ_data": self.succ.shape[0], "capacity_bytes": self.persistent_bytes.shape[0]}
        for field, size in expect.items():
            got = getattr(self, field).shape[0]
            if got != size:
                raise ValueError(f"TaskGraph.{field}: expected length {size}, got {got}")
        for field, size in (("names", n), ("categories", n), ("resource_names", self.num_resources),
                            ("resource_kinds", self.num_resources), ("pool_names", self.num_pools)):
            value = getattr(self, field)
            if value is None:
                continue
            value = tuple(str(v) for v in value)
            if len(value) != size:
                raise ValueError(f"TaskGraph.{field}: expected {size} entries, got {len(value)}")
            object.__setattr__(self, field, value)
        err = _simcore.validate(*self.native_args())
        if err:
            raise ValueError(f"TaskGraph.{err}")

    @property
    def num_tasks(self) -> int:
        return int(self.duration.shape[0])

    @property
    def num_pools(self) -> int:
        return int(self.persistent_bytes.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.succ.shape[0])

    def native_args(self) -> tuple:
        """Positional arguments of the _simcore functions (arrays are passed without copying)."""
        return (self.duration, self.res_ptr, self.res, self.succ_ptr, self.succ, self.succ_data,
                self.mem_device, self.mem_bytes, self.persistent_bytes, self.capacity_bytes,
                self.num_resources)

    def task_name(self, i: int) -> str:
        return self.names[i] if self.names is not None else f"task{i}"

    def resource_name(self, r: int) -> str:
        return self.resource_names[r] if self.resource_names is not None else f"res{r}"

    def pool_name(self, d: int) -> str:
        return self.pool_names[d] if self.pool_names is not None else f"pool{d}"

    def resources_of(self, i: int) -> np.ndarray:
        return self.res[self.res_ptr[i]:self.res_ptr[i + 1]]

    def successors_of(self, i: int) -> np.ndarray:
        return self.succ[self.succ_ptr[i]:self.succ_ptr[i + 1]]


def _as_int_array(field: str, value, dtype, lo: int | None = None) -> np.ndarray:
    a = np.asarray(value)
    if a.size == 0:
        return np.zeros(0, dtype=dtype)
    if a.dtype == bool:
        a = a.astype(np.uint8)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{field}: expected integers, got dtype {a.dtype.name}")
    info = np.iinfo(dtype)
    bad: np.ndarray | list[int] = np.flatnonzero((a < info.min) | (a > info.max)) if a.ndim == 1 else []
    if len(bad):
        raise ValueError(f"{field}[{bad[0]}] = {a[bad[0]]} does not fit in {np.dtype(dtype).name}")
    return a.astype(dtype, copy=False)


def make_task_graph(duration, res_ptr, res, succ_ptr, succ, succ_data=None, mem_device=None,
                    mem_bytes=None, persistent_bytes=(), capacity_bytes=None, num_resources=None,
                    **display) -> TaskGraph:
    """Build a TaskGraph from array-likes, converting dtypes where no value changes.

    Defaults: succ_data all 1, no buffers, no pools, capacity unlimited (int64 max),
    num_resources = len(resource_names) if given else max(res) + 1. Raises ValueError naming the
    array (and index) at fault.
    """
    dur = np.asarray(duration)
    if dur.dtype.kind not in "fiu":
        raise ValueError(f"duration: expected numbers, got dtype {dur.dtype.name}")
    dur = dur.astype(np.float64, copy=False)
    n = dur.shape[0] if dur.ndim == 1 else -1
    if n < 0:
        raise ValueError(f"duration: expected a 1-D array, got shape {dur.shape}")
    succ_a = _as_int_array("succ", succ, np.int32)
    persistent = _as_int_array("persistent_bytes", persistent_bytes, np.int64)
    res_a = _as_int_array("res", res, np.int32)
    if num_resources is None:
        rn = display.get("resource_names")
        num_resources = len(rn) if rn is not None else (int(res_a.max()) + 1 if res_a.size else 0)
    return TaskGraph(
        duration=dur,
        res_ptr=_as_int_array("res_ptr", res_ptr, np.int32),
        res=res_a,
        succ_ptr=_as_int_array("succ_ptr", succ_ptr, np.int32),
        succ=succ_a,
        succ_data=(np.ones(succ_a.shape[0], np.uint8) if succ_data is None
                   else _as_int_array("succ_data", succ_data, np.uint8)),
        mem_device=(np.full(n, -1, np.int32) if mem_device is None
                    else _as_int_array("mem_device", mem_device, np.int32)),
        mem_bytes=(np.zeros(n, np.int64) if mem_bytes is None
                   else _as_int_array("mem_bytes", mem_bytes, np.int64)),
        persistent_bytes=persistent,
        capacity_bytes=(np.full(persistent.shape[0], np.iinfo(np.int64).max, np.int64) if capacity_bytes is None
                        else _as_int_array("capacity_bytes", capacity_bytes, np.int64)),
        num_resources=num_resources,
        **display,
    )


class TaskGraphBuilder:
    """Builds small TaskGraphs by hand (tests, examples). Not for large graphs: pure Python."""

    def __init__(self, resources: Sequence[str] | int = (), pools: Sequence[str] | int = (),
                 persistent_bytes: Sequence[int] | None = None, capacity_bytes: Sequence[int] | None = None,
                 resource_kinds: Sequence[str] | None = None):
        """resources/pools: names, or a count (then named res0.., pool0..)."""
        self.resource_names = [f"res{i}" for i in range(resources)] if isinstance(resources, int) else list(resources)
        self.pool_names = [f"pool{i}" for i in range(pools)] if isinstance(pools, int) else list(pools)
        d = len(self.pool_names)
        self.persistent_bytes = list(persistent_bytes) if persistent_bytes is not None else [0] * d
        self.capacity_bytes = (list(capacity_bytes) if capacity_bytes is not None
                               else [np.iinfo(np.int64).max] * d)
        if len(self.persistent_bytes) != d or len(self.capacity_bytes) != d:
            raise ValueError(f"persistent_bytes/capacity_bytes: expected {d} entries (one per pool)")
        self.resource_kinds = list(resource_kinds) if resource_kinds is not None else None
        self._names: list[str] = []
        self._categories: list[str] = []
        self._duration: list[float] = []
        self._res: list[tuple[int, ...]] = []
        self._pool: list[int] = []
        self._bytes: list[int] = []
        self._edges: list[tuple[int, int, int]] = []

    def _resource_id(self, r: int | str) -> int:
        if isinstance(r, str):
            try:
                return self.resource_names.index(r)
            except ValueError:
                raise ValueError(f"unknown resource {r!r}") from None
        return int(r)

    def _pool_id(self, p: int | str) -> int:
        if isinstance(p, str):
            try:
                return self.pool_names.index(p)
            except ValueError:
                raise ValueError(f"unknown memory pool {p!r}") from None
        return int(p)

    def add_task(self, name: str, duration: float, resources: Iterable[int | str] = (),
                 mem_pool: int | str = -1, mem_bytes: int = 0, category: str = "") -> int:
        """Add a task; resources and mem_pool may be given by index or name. Returns its id."""
        self._names.append(str(name))
        self._categories.append(str(category))
        self._duration.append(float(duration))
        self._res.append(tuple(self._resource_id(r) for r in resources))
        self._pool.append(self._pool_id(mem_pool))
        self._bytes.append(int(mem_bytes))
        return len(self._names) - 1

    def add_edge(self, a: int, b: int, data: bool = True) -> None:
        """b runs after a; data=True if b reads a's output buffer (keeps it alive until b ends)."""
        n = len(self._names)
        for end, t in (("source", a), ("target", b)):
            if not 0 <= t < n:
                raise ValueError(f"add_edge: {end} task {t} does not exist ({n} tasks)")
        self._edges.append((int(a), int(b), int(bool(data))))

    def build(self) -> TaskGraph:
        n = len(self._names)
        res_ptr = np.zeros(n + 1, np.int32)
        res_ptr[1:] = np.cumsum([len(r) for r in self._res])
        res = np.array([r for rs in self._res for r in rs], dtype=np.int64)
        edges = sorted(self._edges, key=lambda e: e[0])  # stable: keeps insertion order per source
        succ_ptr = np.zeros(n + 1, np.int32)
        np.add.at(succ_ptr, np.array([e[0] + 1 for e in edges], dtype=np.int64), 1)
        succ_ptr = np.cumsum(succ_ptr).astype(np.int32)
        return make_task_graph(
            duration=np.array(self._duration, dtype=np.float64),
            res_ptr=res_ptr,
            res=res,
            succ_ptr=succ_ptr,
            succ=np.array([e[1] for e in edges], dtype=np.int64),
            succ_data=np.array([e[2] for e in edges], dtype=np.uint8),
            mem_device=np.array(self._pool, dtype=np.int64),
            mem_bytes=np.array(self._bytes, dtype=np.int64),
            persistent_bytes=np.array(self.persistent_bytes, dtype=np.int64),
            capacity_bytes=np.array(self.capacity_bytes, dtype=np.int64),
            num_resources=len(self.resource_names),
            names=tuple(self._names),
            categories=tuple(self._categories) if any(self._categories) else None,
            resource_names=tuple(self.resource_names),
            resource_kinds=tuple(self.resource_kinds) if self.resource_kinds is not None else None,
            pool_names=tuple(self.pool_names),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class SimSummary:
    """The aggregate outcome of one simulation (what a search needs). Arrays are read-only.

    makespan: max task end (0 for an empty graph). busy[R]: seconds each resource was held.
    peak_bytes[D]: persistent bytes + peak of live buffers per pool; peak_time[D]: first time the
    peak was reached; oom[D]: peak_bytes > capacity_bytes.
    """

    makespan: float
    busy: np.ndarray
    peak_bytes: np.ndarray
    peak_time: np.ndarray
    oom: np.ndarray

    @property
    def idle_fraction(self) -> np.ndarray:
        """1 - busy/makespan per resource (all zeros when the makespan is 0)."""
        if self.makespan <= 0:
            return np.zeros_like(self.busy)
        return 1.0 - self.busy / self.makespan

    @property
    def any_oom(self) -> bool:
        return bool(self.oom.any())


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult(SimSummary):
    """SimSummary plus per-task times in seconds (read-only arrays of length n).

    start/end: when each task ran; ready: when its last predecessor ended; free_time: when its
    output buffer was freed (end of its last data reader, else its own end).
    """

    start: np.ndarray
    end: np.ndarray
    ready: np.ndarray
    free_time: np.ndarray


class Engine:
    """Reusable simulator: keeps its native buffers between runs, so a search should hold one.

    Not thread-safe; the native run releases the GIL, so threads can each use their own Engine.
    """

    def __init__(self) -> None:
        self._native = _simcore.Engine()
        self._times: np.ndarray | None = None  # (4, n) block behind the last SimResult's arrays

    def _simulate(self, graph: TaskGraph) -> None:
        if not isinstance(graph, TaskGraph):
            raise TypeError(f"expected a TaskGraph, got {type(graph).__name__}")
        # TaskGraph validated its (read-only) arrays on construction: skip the O(n) re-check.
        if not self._native.run(*graph.native_args(), check=False):
            _raise_cycle(graph, self._native.num_finished)

    def _summary_fields(self) -> dict:
        e = self._native
        return dict(makespan=float(e.makespan), busy=_readonly(e.busy()), peak_bytes=_readonly(e.peak_bytes()),
                    peak_time=_readonly(e.peak_time()), oom=_readonly(e.oom()))

    def run(self, graph: TaskGraph) -> SimResult:
        """Simulate `graph` with per-task times. Raises CycleError if some task can never start."""
        self._simulate(graph)
        block = self._times
        # Reuse the previous result's block when nothing outside this Engine references it any
        # more (refcount 2 = self._times + getrefcount's argument): fresh arrays of this size cost
        # page faults that can exceed the copy itself. A result still held elsewhere is never touched.
        if block is None or block.shape != (4, graph.num_tasks) or sys.getrefcount(block) != 2:
            block = self._times = np.empty((4, graph.num_tasks))
        self._native.copy_times(block)
        return SimResult(**self._summary_fields(), start=_readonly(block[0]), end=_readonly(block[1]),
                         ready=_readonly(block[2]), free_time=_readonly(block[3]))

    def run_summary(self, graph: TaskGraph) -> SimSummary:
        """Like run() without copying out the four per-task arrays (the cheap path for a search)."""
        self._simulate(graph)
        return SimSummary(**self._summary_fields())


def _raise_cycle(graph: TaskGraph, num_finished: int) -> None:
    cycle = tuple(int(i) for i in _simcore.find_cycle(*graph.native_args()))
    unfinished = graph.num_tasks - num_finished
    shown = [graph.task_name(i) for i in cycle[:8]]
    if len(cycle) > 8:
        shown.append(f"... ({len(cycle) - 8} more)")
    path = " -> ".join(shown + shown[:1])
    raise CycleError(f"task graph has a cycle, {unfinished} of {graph.num_tasks} tasks never become ready: "
                     f"{path}", cycle, unfinished)


def simulate(graph: TaskGraph) -> SimResult:
    """One-off simulation with a fresh Engine (hot loops should reuse an Engine)."""
    return Engine().run(graph)
