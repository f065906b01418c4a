"""Chrome Trace Event Format export of a simulation (loads in Perfetto and chrome://tracing).

Layout: one process per resource kind (e.g. "gpu", "link"; "resources" when the graph has no kinds)
with one thread row per resource, a "no resource" process for tasks that hold none, and a "memory"
process with one counter track per pool (persistent + live buffer bytes). Each task is one complete
event ("ph": "X") on the row of its first resource; with `held_rows=True` a task holding several
resources also appears on each of its other rows as an event of category "held", so every row shows
when its resource is busy. Times are microseconds.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from tag_tf.sim.engine import SimResult, TaskGraph

__all__ = ["memory_timeline", "to_chrome_trace", "write_chrome_trace"]

_US = 1e6
HELD_CATEGORY = "held"


def memory_timeline(graph: TaskGraph, result: SimResult, pool: int) -> tuple[np.ndarray, np.ndarray]:
    """(times, bytes): the pool's total (persistent + live buffers) from each time until the next.

    Buffers are live over [start, free_time), so at one time frees apply before allocations, exactly
    as the engine counts them; max(bytes) equals result.peak_bytes[pool].
    """
    mask = (graph.mem_device == pool) & (graph.mem_bytes > 0) & np.isfinite(result.start)
    size = graph.mem_bytes[mask]
    times = np.concatenate([result.start[mask], result.free_time[mask]])
    delta = np.concatenate([size, -size])
    keep = np.isfinite(times)  # a buffer whose reader never ran (cyclic graph) is never freed
    times, delta = times[keep], delta[keep]
    order = np.lexsort((delta, times))  # by time, then frees (negative) first
    times, level = times[order], np.cumsum(delta[order]) + int(graph.persistent_bytes[pool])
    last = np.ones(times.shape[0], dtype=bool)  # the value after every change at one time
    last[:-1] = times[1:] != times[:-1]
    out_t = np.concatenate([[0.0], times[last]])
    out_b = np.concatenate([[int(graph.persistent_bytes[pool])], level[last]])
    if out_t.shape[0] > 1 and out_t[1] == 0.0:  # changes at t=0 replace the initial point
        out_t, out_b = out_t[1:], out_b[1:]
    return out_t, out_b.astype(np.int64)


def to_chrome_trace(graph: TaskGraph, result: SimResult, *, held_rows: bool = True,
                    memory: bool = True) -> dict[str, object]:
    """The trace as a dict ({"traceEvents": [...], "displayTimeUnit": "ms"}), ready for json.dump."""
    n, num_res = graph.num_tasks, graph.num_resources
    kinds = graph.resource_kinds or ("resources",) * num_res
    kind_names = list(dict.fromkeys(kinds))  # first-appearance order
    pid_of_kind = {k: i + 1 for i, k in enumerate(kind_names)}
    no_res_pid = len(kind_names) + 1
    mem_pid = len(kind_names) + 2

    events: list[dict[str, Any]] = []

    def meta(pid: int, name: str, tid: int | None = None, thread: str | None = None) -> None:
        if tid is None:
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        else:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})

    for k in kind_names:
        meta(pid_of_kind[k], k)
    for r in range(num_res):
        meta(pid_of_kind[kinds[r]], "", tid=r, thread=graph.resource_name(r))

    # Plain Python lists: this loop runs once per task, and numpy scalar access is slow.
    ts = (result.start * _US).tolist()
    dur = ((result.end - result.start) * _US).tolist()
    ready_us = (result.ready * _US).tolist()
    ptr, res = graph.res_ptr.tolist(), graph.res.tolist()
    mem_dev, mem_bytes = graph.mem_device.tolist(), graph.mem_bytes.tolist()
    names = graph.names or [f"task{i}" for i in range(n)]
    res_names = [graph.resource_name(r) for r in range(num_res)]
    pool_names = [graph.pool_name(d) for d in range(graph.num_pools)]
    cats = graph.categories
    if any(ptr[i] == ptr[i + 1] for i in range(n)):
        meta(no_res_pid, "no resource")
        meta(no_res_pid, "", tid=0, thread="no resource")
    for i in range(n):
        if ts[i] != ts[i]:
            continue  # NaN: never ran (only in a cyclic graph, which simulate() rejects)
        rs = res[ptr[i]:ptr[i + 1]]
        name = names[i]
        cat = cats[i] if cats is not None and cats[i] else (kinds[rs[0]] if rs else "task")
        args: dict[str, Any] = {"task": i, "ready_us": ready_us[i]}
        if len(rs) > 1:
            args["resources"] = [res_names[r] for r in rs]
        if mem_dev[i] >= 0 and mem_bytes[i] > 0:
            args["bytes"] = mem_bytes[i]
            args["pool"] = pool_names[mem_dev[i]]
        if rs:
            pid, tid = pid_of_kind[kinds[rs[0]]], rs[0]
        else:
            pid, tid = no_res_pid, 0
        events.append({"name": name, "cat": cat, "ph": "X", "ts": ts[i], "dur": dur[i],
                       "pid": pid, "tid": tid, "args": args})
        if held_rows:
            for r in rs[1:]:
                events.append({"name": name, "cat": HELD_CATEGORY, "ph": "X", "ts": ts[i], "dur": dur[i],
                               "pid": pid_of_kind[kinds[r]], "tid": r,
                               "args": {"task": i, "primary_row": res_names[rs[0]]}})

    if memory and graph.num_pools:
        meta(mem_pid, "memory")
        for d in range(graph.num_pools):
            times, level = memory_timeline(graph, result, d)
            cname = f"{pool_names[d]} bytes"
            events.extend({"name": cname, "ph": "C", "ts": t, "pid": mem_pid, "tid": 0, "args": {"bytes": b}}
                          for t, b in zip((times * _US).tolist(), level.tolist()))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"makespan_s": result.makespan, "num_tasks": n}}


def write_chrome_trace(path: str | os.PathLike, graph: TaskGraph, result: SimResult, **kwargs: bool) -> str:
    """Write to_chrome_trace(graph, result, **kwargs) as JSON to `path`; returns the path."""
    trace = to_chrome_trace(graph, result, **kwargs)
    path = os.fspath(path)
    text = json.dumps(trace, separators=(",", ":"))  # dumps uses the C encoder, dump does not
    with open(path, "w") as f:
        f.write(text)
    return path
