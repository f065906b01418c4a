"""Chrome trace export and Gantt chart of a simulation."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tag_tf.sim.engine import TaskGraphBuilder, simulate
from tag_tf.sim.gantt import plot_gantt
from tag_tf.sim.trace import HELD_CATEGORY, memory_timeline, to_chrome_trace, write_chrome_trace


def _graph():
    b = TaskGraphBuilder(resources=["gpu0", "gpu1", "nic0", "nic1"],
                         resource_kinds=["gpu", "gpu", "link", "link"],
                         pools=["gpu0", "gpu1"], persistent_bytes=[1000, 500], capacity_bytes=[1200, 600])
    f0 = b.add_task("fwd0", 1.0, ["gpu0"], "gpu0", 100, category="forward")
    f1 = b.add_task("fwd1", 1.5, ["gpu1"], "gpu1", 80, category="forward")
    x = b.add_task("send", 0.5, ["nic0", "nic1"], "gpu1", 100, category="transfer")
    lat = b.add_task("latency", 0.25, category="transfer")   # resource-free
    bwd = b.add_task("bwd1", 2.0, ["gpu1"], "gpu1", 40, category="backward")
    ar = b.add_task("allreduce", 0.75, ["gpu0", "gpu1", "nic0", "nic1"], category="collective")
    b.add_edge(f0, x)
    b.add_edge(x, lat, data=False)
    b.add_edge(lat, bwd, data=False)
    b.add_edge(x, bwd)
    b.add_edge(f1, bwd)
    b.add_edge(bwd, ar)
    b.add_edge(f0, ar)
    return b.build()


def test_trace_is_valid_json_with_every_task_once(tmp_path):
    g = _graph()
    r = simulate(g)
    path = write_chrome_trace(tmp_path / "trace.json", g, r, held_rows=False)
    trace = json.loads(Path(path).read_text())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert Counter(e["args"]["task"] for e in xs) == Counter(range(g.num_tasks))
    for e in xs:
        i = e["args"]["task"]
        assert e["name"] == g.task_name(i)
        assert e["ts"] == r.start[i] * 1e6
        assert e["dur"] == (r.end[i] - r.start[i]) * 1e6
    # Rows: each X event sits on a row named after the task's first resource (or "no resource").
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                    if e["ph"] == "M" and e["name"] == "thread_name"}
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    for e in xs:
        i = e["args"]["task"]
        rs = g.resources_of(i)
        want = g.resource_name(int(rs[0])) if len(rs) else "no resource"
        assert thread_names[(e["pid"], e["tid"])] == want
    assert {"gpu", "link", "no resource", "memory"} <= set(process_names.values())
    by_name = {e["name"]: e for e in xs}
    assert by_name["fwd0"]["cat"] == "forward"
    assert by_name["allreduce"]["args"]["resources"] == ["gpu0", "gpu1", "nic0", "nic1"]


def test_held_rows_show_every_resource_of_multi_resource_tasks():
    g = _graph()
    r = simulate(g)
    events = to_chrome_trace(g, r)["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    primary = [e for e in xs if e["cat"] != HELD_CATEGORY]
    held = [e for e in xs if e["cat"] == HELD_CATEGORY]
    assert Counter(e["args"]["task"] for e in primary) == Counter(range(g.num_tasks))
    extra = {i: max(len(g.resources_of(i)) - 1, 0) for i in range(g.num_tasks)}
    assert Counter(e["args"]["task"] for e in held) == Counter({i: k for i, k in extra.items() if k})
    rows = {(e["pid"], e["tid"]) for e in xs if e["args"]["task"] == 5}  # allreduce: 4 rows
    assert len(rows) == 4


def test_memory_counters_follow_buffers_and_reach_the_peak():
    g = _graph()
    r = simulate(g)
    events = to_chrome_trace(g, r)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    for d in range(g.num_pools):
        mine = [e for e in counters if e["name"] == f"{g.pool_name(d)} bytes"]
        assert mine[0]["ts"] == 0.0
        assert max(e["args"]["bytes"] for e in mine) == r.peak_bytes[d]
        t, b = memory_timeline(g, r, d)
        assert list(t * 1e6) == [e["ts"] for e in mine]
        assert b[-1] == g.persistent_bytes[d]  # everything freed at the end
    # gpu1: fwd1 80 [0,2.0) (read by bwd1), send 100 [1,..), bwd1 40.
    t, b = memory_timeline(g, r, 1)
    assert r.peak_bytes[1] == 500 + 80 + 100 + 40
    assert r.oom.tolist() == [False, True]


def test_gantt_writes_png(tmp_path):
    g = _graph()
    r = simulate(g)
    path = plot_gantt(g, r, tmp_path / "gantt.png", title="toy")
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_gantt_with_thousands_of_tasks(tmp_path):
    rng = np.random.default_rng(0)
    b = TaskGraphBuilder(resources=[f"gpu{i}" for i in range(8)])
    prev = [None] * 8
    for k in range(3000):
        d = k % 8
        t = b.add_task(f"op{k}", float(rng.uniform(0.1, 1.0)), [d], category=("fwd", "bwd")[k % 2])
        if prev[d] is not None:
            b.add_edge(prev[d], t)
        prev[d] = t
    g = b.build()
    r = simulate(g)
    path = plot_gantt(g, r, tmp_path / "big.png")
    assert Path(path).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="categories: expected 3000 entries"):
        plot_gantt(g, r, tmp_path / "bad.png", categories=("x",))
