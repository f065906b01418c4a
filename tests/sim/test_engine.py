"""The native simulator engine on hand-built graphs with known answers, plus a differential test
against a slow, independent Python model of the documented semantics (kernels/engine.h)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tag_tf.errors import TagError
from tag_tf.sim.engine import (
    CycleError,
    Engine,
    SimResult,
    SimSummary,
    TaskGraph,
    TaskGraphBuilder,
    make_task_graph,
    simulate,
)

INF = np.iinfo(np.int64).max


# ----------------------------------------------------------------------------- scheduling


def test_chain_on_one_device():
    b = TaskGraphBuilder(resources=["gpu0"])
    ids = [b.add_task(f"op{i}", d, ["gpu0"]) for i, d in enumerate([1.0, 2.0, 0.5])]
    b.add_edge(ids[0], ids[1])
    b.add_edge(ids[1], ids[2])
    r = simulate(b.build())
    assert list(r.start) == [0.0, 1.0, 3.0]
    assert list(r.end) == [1.0, 3.0, 3.5]
    assert list(r.ready) == [0.0, 1.0, 3.0]
    assert r.makespan == 3.5
    assert list(r.busy) == [3.5]
    assert list(r.idle_fraction) == [0.0]


def test_two_devices_in_parallel():
    b = TaskGraphBuilder(resources=["gpu0", "gpu1"])
    a0 = b.add_task("a0", 1.0, ["gpu0"])
    a1 = b.add_task("a1", 2.0, ["gpu0"])
    c0 = b.add_task("c0", 4.0, ["gpu1"])
    b.add_edge(a0, a1)
    r = simulate(b.build())
    assert list(r.start) == [0.0, 1.0, 0.0]
    assert list(r.end) == [1.0, 3.0, 4.0]
    assert r.makespan == 4.0
    assert list(r.busy) == [3.0, 4.0]
    assert list(r.idle_fraction) == [0.25, 0.0]
    assert c0 == 2


def test_fifo_same_ready_time_runs_in_id_order():
    # Four tasks become ready at t=1 together (all wait on `root` on another device); the device
    # serves them in id order, whatever order the edges were added in.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1"])
    root = b.add_task("root", 1.0, ["gpu1"])
    ts = [b.add_task(f"t{i}", 1.0 + i, ["gpu0"]) for i in range(4)]
    for t in reversed(ts):
        b.add_edge(root, t)
    r = simulate(b.build())
    assert [r.start[t] for t in ts] == [1.0, 2.0, 4.0, 7.0]
    assert [r.ready[t] for t in ts] == [1.0] * 4


def test_fifo_by_ready_time_not_id():
    # On gpu0: `late` (id 1) becomes ready at 3, `early` (id 2) at 1. gpu0 is busy with `hog` until
    # 5, so both wait; the earlier-ready one goes first although its id is larger.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1", "gpu2"])
    hog = b.add_task("hog", 5.0, ["gpu0"])
    late = b.add_task("late", 1.0, ["gpu0"])
    early = b.add_task("early", 1.0, ["gpu0"])
    p_late = b.add_task("p_late", 3.0, ["gpu1"])
    p_early = b.add_task("p_early", 1.0, ["gpu2"])
    b.add_edge(p_late, late)
    b.add_edge(p_early, early)
    r = simulate(b.build())
    assert (r.start[hog], r.start[early], r.start[late]) == (0.0, 5.0, 6.0)
    assert (r.ready[early], r.ready[late]) == (1.0, 3.0)


def test_ready_time_is_latest_predecessor_end():
    b = TaskGraphBuilder(resources=3)
    p1 = b.add_task("p1", 2.0, [0])
    p2 = b.add_task("p2", 3.5, [1])
    c = b.add_task("c", 1.0, [2])
    b.add_edge(p1, c)
    b.add_edge(p2, c, data=False)
    r = simulate(b.build())
    assert (r.ready[c], r.start[c], r.end[c]) == (3.5, 3.5, 4.5)


def test_task_without_resources_just_takes_its_duration():
    b = TaskGraphBuilder(resources=["gpu0"])
    a = b.add_task("a", 1.0, ["gpu0"])
    delay = b.add_task("delay", 2.5)      # e.g. a latency: no resource
    delay2 = b.add_task("delay2", 2.5)    # runs at the same time, no contention
    c = b.add_task("c", 1.0, ["gpu0"])
    b.add_edge(a, delay)
    b.add_edge(a, delay2)
    b.add_edge(delay, c)
    r = simulate(b.build())
    assert (r.start[delay], r.start[delay2], r.end[delay]) == (1.0, 1.0, 3.5)
    assert r.start[c] == 3.5
    assert list(r.busy) == [2.0]


def _links():
    return TaskGraphBuilder(resources=["nic0_out", "nic1_in", "nic1_out", "nic2_in", "nic0_in"],
                            resource_kinds=["link"] * 5)


def test_transfers_sharing_a_link_serialize():
    b = _links()
    x = b.add_task("x", 2.0, ["nic0_out", "nic1_in"])
    y = b.add_task("y", 3.0, ["nic0_out", "nic2_in"])  # shares nic0_out with x
    r = simulate(b.build())
    assert (r.start[x], r.end[x], r.start[y], r.end[y]) == (0.0, 2.0, 2.0, 5.0)
    assert list(r.busy) == [5.0, 2.0, 0.0, 3.0, 0.0]


def test_transfers_on_disjoint_links_overlap():
    b = _links()
    x = b.add_task("x", 2.0, ["nic0_out", "nic1_in"])
    z = b.add_task("z", 3.0, ["nic1_out", "nic2_in"])  # shares nothing with x
    r = simulate(b.build())
    assert (r.start[x], r.start[z]) == (0.0, 0.0)
    assert r.makespan == 3.0


def test_three_transfers_contend_and_overlap():
    b = _links()
    x = b.add_task("x", 2.0, ["nic0_out", "nic1_in"])
    y = b.add_task("y", 1.0, ["nic1_out", "nic1_in"])  # shares nic1_in with x
    z = b.add_task("z", 4.0, ["nic2_in", "nic0_in"])  # disjoint from both
    r = simulate(b.build())
    assert (r.start[x], r.start[y], r.start[z]) == (0.0, 2.0, 0.0)
    assert r.makespan == 4.0


def test_all_or_nothing_acquisition_waits_for_every_resource():
    # The collective needs gpu0..gpu2; gpu1 is busy until 3, so it starts at 3 although gpu0 and
    # gpu2 were free at 0. A later, smaller task on gpu0 (ready at 1) waits behind the collective
    # (FIFO: the collective was queued first), so gpu0 idles from 0 to 3.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1", "gpu2", "gpu3"])
    busy1 = b.add_task("busy1", 3.0, ["gpu1"])
    coll = b.add_task("allreduce", 2.0, ["gpu0", "gpu1", "gpu2"], category="collective")
    pre = b.add_task("pre", 1.0, ["gpu3"])
    small = b.add_task("small", 0.5, ["gpu0"])
    b.add_edge(pre, small)
    r = simulate(b.build())
    assert (r.start[busy1], r.start[coll], r.end[coll]) == (0.0, 3.0, 5.0)
    assert (r.ready[small], r.start[small]) == (1.0, 5.0)
    assert list(r.busy) == [2.5, 5.0, 2.0, 1.0]


def test_collective_behind_head_of_one_queue():
    # gpu1's queue head is `first` (ready at 0, needs gpu1 for 4s). The collective on gpu0+gpu1 is
    # also ready at 0 but has a larger id, so it waits for `first`; gpu0 stays free meanwhile and
    # a task ready later on gpu0 still cannot overtake the waiting collective.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1", "gpu2"])
    first = b.add_task("first", 4.0, ["gpu1"])
    coll = b.add_task("coll", 1.0, ["gpu0", "gpu1"])
    p = b.add_task("p", 1.0, ["gpu2"])
    later = b.add_task("later", 1.0, ["gpu0"])
    b.add_edge(p, later)
    r = simulate(b.build())
    assert (r.start[first], r.start[coll], r.start[later]) == (0.0, 4.0, 5.0)


def test_zero_duration_barrier_is_transparent():
    # A resource-free zero-duration no-op gathers two producers; its successors become ready in
    # the same round and are served in id order.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1"])
    p0 = b.add_task("p0", 1.0, ["gpu0"])
    p1 = b.add_task("p1", 2.0, ["gpu1"])
    bar = b.add_task("barrier", 0.0)
    s_hi = b.add_task("s_hi", 1.0, ["gpu0"])
    s_lo = b.add_task("s_lo", 1.0, ["gpu0"])
    direct = b.add_task("direct", 1.0, ["gpu0"])
    b.add_edge(p0, bar)
    b.add_edge(p1, bar)
    b.add_edge(bar, s_lo)
    b.add_edge(bar, s_hi)
    b.add_edge(p1, direct)  # ready at 2 like s_*, larger id: goes last
    r = simulate(b.build())
    assert (r.start[bar], r.end[bar]) == (2.0, 2.0)
    assert (r.start[s_hi], r.start[s_lo], r.start[direct]) == (2.0, 3.0, 4.0)


def test_zero_duration_task_holding_a_resource_runs_in_a_later_round():
    # z (0 s on gpu0) starts and ends at t=1; its successor w becomes ready in the next round at
    # t=1, after `big` (ready at 1 in the first round, larger id) already took gpu1.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1"])
    a = b.add_task("a", 1.0, ["gpu0"])
    z = b.add_task("z", 0.0, ["gpu0"])
    w = b.add_task("w", 1.0, ["gpu1"])
    big = b.add_task("big", 5.0, ["gpu1"])
    b.add_edge(a, z)
    b.add_edge(z, w)
    b.add_edge(a, big)
    r = simulate(b.build())
    assert (r.start[z], r.end[z]) == (1.0, 1.0)
    assert r.ready[w] == 1.0
    assert (r.start[big], r.start[w]) == (1.0, 6.0)


# ----------------------------------------------------------------------------- memory


def test_peak_with_refcounting_frees_after_last_reader():
    # a (100 B) is read by b and c; it lives until c ends, overlapping with b's and c's buffers.
    b = TaskGraphBuilder(resources=["gpu0"], pools=["gpu0"])
    a = b.add_task("a", 1.0, ["gpu0"], "gpu0", 100)
    bb = b.add_task("b", 1.0, ["gpu0"], "gpu0", 10)
    c = b.add_task("c", 1.0, ["gpu0"], "gpu0", 1)
    b.add_edge(a, bb)
    b.add_edge(a, c)
    b.add_edge(bb, c, data=False)
    r = simulate(b.build())
    # t in [0,1): a=100; [1,2): a+b=110; [2,3): a+b... b has no readers -> freed at its end (2).
    # So [2,3): a + c = 101.
    assert list(r.free_time) == [3.0, 2.0, 3.0]
    assert list(r.peak_bytes) == [110]
    assert list(r.peak_time) == [1.0]


def test_control_edges_do_not_keep_buffers_alive():
    b = TaskGraphBuilder(resources=["gpu0"], pools=1)
    a = b.add_task("a", 1.0, [0], 0, 100)
    c = b.add_task("c", 1.0, [0], 0, 50)
    b.add_edge(a, c, data=False)  # ordering only: a's buffer dies when a ends
    r = simulate(b.build())
    assert list(r.free_time) == [1.0, 2.0]
    assert list(r.peak_bytes) == [100]


def test_transient_buffers_and_persistent_bytes():
    # Two independent producer->consumer pairs on two devices in the same pool; persistent 1000.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1"], pools=["host"], persistent_bytes=[1000])
    p0 = b.add_task("p0", 2.0, ["gpu0"], "host", 40)
    c0 = b.add_task("c0", 2.0, ["gpu0"], "host", 0)
    p1 = b.add_task("p1", 1.0, ["gpu1"], "host", 30)
    c1 = b.add_task("c1", 1.0, ["gpu1"], "host", 5)
    b.add_edge(p0, c0)
    b.add_edge(p1, c1)
    r = simulate(b.build())
    # [0,1): 40+30  [1,2): 40+30+5  [2,4): 40 (+0)  -> peak 1075 at t=1
    assert list(r.peak_bytes) == [1075]
    assert list(r.peak_time) == [1.0]
    assert not r.any_oom


def test_frees_at_t_happen_before_allocations_at_t():
    # a's buffer (100) dies at t=1 when its reader r ends; n (100) is allocated at t=1.
    # Live never exceeds 100+1: with allocation-before-free it would be 201.
    b = TaskGraphBuilder(resources=["gpu0", "gpu1"], pools=1, capacity_bytes=[150])
    a = b.add_task("a", 0.5, ["gpu0"], 0, 100)
    rd = b.add_task("reader", 0.5, ["gpu0"], 0, 1)
    gate = b.add_task("gate", 1.0, ["gpu1"])
    n = b.add_task("n", 1.0, ["gpu1"], 0, 100)
    b.add_edge(a, rd)
    b.add_edge(gate, n, data=False)
    r = simulate(b.build())
    assert (r.free_time[a], r.start[n]) == (1.0, 1.0)
    assert list(r.peak_bytes) == [101]
    assert list(r.oom) == [False]


def test_zero_lifetime_buffer_is_not_counted():
    # A zero-duration task nobody reads: its buffer lives over [t, t), an empty interval.
    b = TaskGraphBuilder(resources=["gpu0"], pools=1)
    b.add_task("a", 1.0, ["gpu0"], 0, 10)
    b.add_task("blip", 0.0, [], 0, 1000)
    r = simulate(b.build())
    assert list(r.peak_bytes) == [10]


def test_oom_flags_exactly_the_pool_over_capacity():
    b = TaskGraphBuilder(resources=["gpu0", "gpu1", "gpu2"], pools=["m0", "m1", "m2"],
                         persistent_bytes=[50, 50, 200], capacity_bytes=[200, 149, 199])
    b.add_task("a", 1.0, ["gpu0"], "m0", 150)   # 200 <= 200: fits exactly
    b.add_task("b", 1.0, ["gpu1"], "m1", 100)   # 150 > 149: OOM
    b.add_task("c", 1.0, ["gpu2"])              # persistent alone 200 > 199: OOM
    r = simulate(b.build())
    assert list(r.peak_bytes) == [200, 150, 200]
    assert list(r.oom) == [False, True, True]
    assert r.any_oom


# ----------------------------------------------------------------------------- errors, edge cases


def test_cycle_raises_clear_error():
    b = TaskGraphBuilder(resources=["gpu0"])
    src = b.add_task("src", 1.0, ["gpu0"])
    x = b.add_task("x", 1.0, ["gpu0"])
    y = b.add_task("y", 1.0, ["gpu0"])
    z = b.add_task("z", 1.0)
    b.add_edge(src, x)
    b.add_edge(x, y)
    b.add_edge(y, x)
    b.add_edge(y, z)
    g = b.build()
    with pytest.raises(CycleError, match=r"3 of 4 tasks never become ready: (x -> y -> x|y -> x -> y)") as e:
        simulate(g)
    assert isinstance(e.value, TagError)
    assert sorted(e.value.cycle) == [x, y]
    assert e.value.num_unfinished == 3


def test_self_loop_is_a_cycle():
    b = TaskGraphBuilder()
    a = b.add_task("a", 1.0)
    b.add_edge(a, a)
    with pytest.raises(CycleError, match="a -> a"):
        simulate(b.build())


def test_empty_graph():
    g = TaskGraphBuilder(resources=2, pools=1, persistent_bytes=[7]).build()
    r = simulate(g)
    assert r.makespan == 0.0
    assert r.start.shape == (0,)
    assert list(r.busy) == [0.0, 0.0]
    assert list(r.idle_fraction) == [0.0, 0.0]
    assert list(r.peak_bytes) == [7]
    g0 = make_task_graph([], [0], [], [0], [])
    assert simulate(g0).makespan == 0.0


def _arrays(**over):
    base = dict(duration=np.array([1.0, 2.0]), res_ptr=np.array([0, 1, 2], np.int32),
                res=np.array([0, 1], np.int32), succ_ptr=np.array([0, 1, 1], np.int32),
                succ=np.array([1], np.int32), succ_data=np.array([1], np.uint8),
                mem_device=np.array([0, -1], np.int32), mem_bytes=np.array([5, 0], np.int64),
                persistent_bytes=np.array([0], np.int64), capacity_bytes=np.array([INF], np.int64),
                num_resources=2)
    base.update(over)
    return base


@pytest.mark.parametrize("over, message", [
    (dict(duration=np.array([1, 2], np.int64)), r"TaskGraph\.duration: expected dtype float64"),
    (dict(duration=np.array([1.0, -2.0])), r"duration\[1\] = -2.* must be finite"),
    (dict(duration=np.array([1.0, np.nan])), r"duration\[1\]"),
    (dict(res=np.array([0, 2], np.int32)), r"res\[1\] = 2 \(task 1\) is out of range \[0, 2\)"),
    (dict(res_ptr=np.array([0, 2], np.int32)), r"TaskGraph\.res_ptr: expected length 3"),
    (dict(res_ptr=np.array([0, 2, 1], np.int32)), r"res_ptr\[2\] is smaller than res_ptr\[1\]"),
    (dict(res_ptr=np.array([0, 2, 2], np.int32), res=np.array([1, 1], np.int32)), r"res\[1\]: task 0 lists resource 1 twice"),
    (dict(succ=np.array([5], np.int32)), r"succ\[0\] = 5 is out of range \[0, 2\)"),
    (dict(succ_data=np.array([2], np.uint8)), r"succ_data\[0\] = 2 must be 0 or 1"),
    (dict(succ_data=np.array([1, 1], np.uint8)), r"TaskGraph\.succ_data: expected length 1"),
    (dict(mem_device=np.array([0, 3], np.int32)), r"mem_device\[1\] = 3 is out of range \[-1, 1\)"),
    (dict(mem_bytes=np.array([-1, 0], np.int64)), r"mem_bytes\[0\] = -1 must be >= 0"),
    (dict(mem_bytes=np.array([5, 7], np.int64)), r"mem_bytes\[1\] = 7 but mem_device\[1\] = -1"),
    (dict(capacity_bytes=np.array([1, 2], np.int64)), r"TaskGraph\.capacity_bytes: expected length 1"),
    (dict(persistent_bytes=np.array([-3], np.int64)), r"persistent_bytes\[0\] must be >= 0"),
    (dict(res=np.array([[0, 1]], np.int32)), r"TaskGraph\.res: expected a 1-D array"),
    (dict(num_resources=1.5), r"TaskGraph\.num_resources"),
])
def test_validation_errors_name_the_array(over, message):
    with pytest.raises(ValueError, match=message):
        TaskGraph(**_arrays(**over))


def test_valid_arrays_and_display_lengths():
    g = TaskGraph(**_arrays(), names=("a", "b"))
    assert g.num_tasks == 2 and g.num_edges == 1 and g.num_pools == 1
    assert not g.duration.flags.writeable
    with pytest.raises(ValueError, match=r"TaskGraph\.names: expected 2 entries, got 1"):
        TaskGraph(**_arrays(), names=("a",))
    with pytest.raises(ValueError, match=r"TaskGraph\.resource_kinds: expected 2 entries"):
        TaskGraph(**_arrays(), resource_kinds=("gpu",))


def test_make_task_graph_converts_and_checks_ranges():
    g = make_task_graph(duration=[1, 2], res_ptr=[0, 1, 2], res=np.array([0, 1], np.int64),
                        succ_ptr=[0, 1, 1], succ=[1], succ_data=[True])
    assert g.res.dtype == np.int32 and g.succ_data.dtype == np.uint8 and g.num_resources == 2
    assert simulate(g).makespan == 3.0
    with pytest.raises(ValueError, match=r"res\[1\] = 4294967296 does not fit in int32"):
        make_task_graph([1, 2], [0, 1, 2], np.array([0, 2**32], np.int64), [0, 0, 0], [])
    with pytest.raises(ValueError, match=r"succ: expected integers"):
        make_task_graph([1.0], [0, 0], [], [0, 1], [0.5])


def test_builder_errors():
    b = TaskGraphBuilder(resources=["gpu0"], pools=["m"])
    with pytest.raises(ValueError, match="unknown resource 'gpu9'"):
        b.add_task("a", 1.0, ["gpu9"])
    with pytest.raises(ValueError, match="unknown memory pool 'x'"):
        b.add_task("a", 1.0, ["gpu0"], "x", 1)
    b.add_task("a", 1.0)
    with pytest.raises(ValueError, match="target task 3 does not exist"):
        b.add_edge(0, 3)


def test_native_run_checks_by_default():
    from tag_tf import _simcore
    args = list(TaskGraph(**_arrays()).native_args())
    args[2] = np.array([0, 7], np.int32)  # res out of range, bypassing TaskGraph validation
    with pytest.raises(ValueError, match=r"res\[1\] = 7"):
        _simcore.Engine().run(*args)
    args[1] = np.array([0, 1], np.int32)  # wrong length is caught even with check=False
    with pytest.raises(ValueError, match="res_ptr: expected a 1-D array of length 3"):
        _simcore.Engine().run(*args, check=False)


# ----------------------------------------------------------------------------- reuse, summary


def _random_graph(rng, n, num_res=4, num_pools=2, p_edge=0.25, ties=True, zero=0.15):
    """Random DAG (edges go from lower to higher id, then ids are shuffled) with ties, zero
    durations, multi-resource and resource-free tasks."""
    perm = rng.permutation(n)
    b = TaskGraphBuilder(resources=num_res, pools=num_pools,
                         persistent_bytes=list(rng.integers(0, 50, num_pools)),
                         capacity_bytes=list(rng.integers(100, 400, num_pools)))
    spec = []
    for _ in range(n):
        d = float(rng.integers(0, 4)) if ties else float(rng.uniform(0, 3))
        if rng.random() < zero:
            d = 0.0
        k = int(rng.choice([0, 1, 1, 1, 2, 3]))
        res = tuple(int(x) for x in rng.choice(num_res, size=min(k, num_res), replace=False))
        pool = int(rng.integers(-1, num_pools))
        spec.append((d, res, pool, int(rng.integers(0, 60)) if pool >= 0 else 0))
    for new in range(n):
        d, res, pool, nbytes = spec[int(np.flatnonzero(perm == new)[0])]
        b.add_task(f"t{new}", d, res, pool, nbytes)
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p_edge * 3 / max(j - i, 1):
                b.add_edge(int(perm[i]), int(perm[j]), data=bool(rng.random() < 0.7))
    return b.build()


def test_engine_reuse_across_graphs_of_different_sizes():
    rng = np.random.default_rng(1)
    graphs = [_random_graph(rng, n) for n in (40, 7, 40, 0, 25)]
    eng = Engine()
    for g in graphs + graphs[::-1]:
        got, want = eng.run(g), simulate(g)
        for field in ("start", "end", "ready", "free_time", "busy", "peak_bytes", "peak_time", "oom"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
        assert got.makespan == want.makespan


def test_results_held_by_the_caller_survive_later_runs():
    rng = np.random.default_rng(5)
    g1, g2 = _random_graph(rng, 30), _random_graph(rng, 30)  # same size: buffers may be reused
    eng = Engine()
    r1 = eng.run(g1)
    kept = {f: getattr(r1, f).copy() for f in ("start", "end", "ready", "free_time")}
    eng.run(g2)
    r2 = eng.run(g2)
    eng.run(g1)
    for f, want in kept.items():
        np.testing.assert_array_equal(getattr(r1, f), want, err_msg=f)
    np.testing.assert_array_equal(r2.start, simulate(g2).start)
    with pytest.raises(ValueError):
        r1.start[0] = 1.0  # read-only


def test_engine_reuse_after_a_cycle_error():
    b = TaskGraphBuilder(resources=1)
    x, y = b.add_task("x", 1.0, [0]), b.add_task("y", 1.0, [0])
    b.add_edge(x, y)
    b.add_edge(y, x)
    eng = Engine()
    with pytest.raises(CycleError):
        eng.run(b.build())
    b2 = TaskGraphBuilder(resources=1)
    b2.add_task("a", 2.0, [0])
    assert eng.run(b2.build()).makespan == 2.0


def test_run_summary_matches_run():
    g = _random_graph(np.random.default_rng(3), 30)
    eng = Engine()
    s, r = eng.run_summary(g), eng.run(g)
    assert isinstance(s, SimSummary) and not isinstance(s, SimResult)
    assert s.makespan == r.makespan
    np.testing.assert_array_equal(s.peak_bytes, r.peak_bytes)
    np.testing.assert_array_equal(s.idle_fraction, r.idle_fraction)


# ----------------------------------------------------------------------------- differential test


def _reference(g: TaskGraph) -> dict:
    """Slow model written from the semantics in kernels/engine.h: rounds at each timestamp,
    per-resource queues = waiting tasks sorted by (ready, id), start to a fixpoint."""
    n = g.num_tasks
    res = [tuple(int(r) for r in g.resources_of(i)) for i in range(n)]
    succ = [[(int(g.succ[e]), bool(g.succ_data[e])) for e in range(g.succ_ptr[i], g.succ_ptr[i + 1])]
            for i in range(n)]
    pending = [0] * n
    for i in range(n):
        for j, _ in succ[i]:
            pending[j] += 1
    start, end, ready = [math.nan] * n, [math.nan] * n, [math.nan] * n
    busy = [0.0] * g.num_resources
    holder = [None] * g.num_resources
    waiting: list[int] = []
    running: dict[int, float] = {}
    newly = [i for i in range(n) if pending[i] == 0]
    t = 0.0

    def finish(i):
        for r in res[i]:
            holder[r] = None
        for j, _ in succ[i]:
            pending[j] -= 1
            if pending[j] == 0:
                newly.append(j)

    while True:
        k = 0
        while k < len(newly):  # admit; zero-duration resource-free tasks finish in the round
            i = newly[k]
            k += 1
            ready[i] = t
            if res[i]:
                waiting.append(i)
            else:
                start[i], end[i] = t, t + float(g.duration[i])
                if g.duration[i] == 0:
                    finish(i)
                else:
                    running[i] = end[i]
        newly.clear()
        progress = True
        while progress:  # start to a fixpoint
            progress = False
            for h in sorted(waiting, key=lambda w: (ready[w], w)):
                heads_ok = all(holder[r] is None and
                               min((w for w in waiting if r in res[w]), key=lambda w: (ready[w], w)) == h
                               for r in res[h])
                if heads_ok:
                    waiting.remove(h)
                    start[h], end[h] = t, t + float(g.duration[h])
                    for r in res[h]:
                        holder[r] = h
                        busy[r] += float(g.duration[h])
                    running[h] = end[h]
                    progress = True
                    break
        done = [i for i, e in running.items() if e == t]
        if not done:
            if not running:
                break
            t = min(running.values())
            done = [i for i, e in running.items() if e == t]
        for i in sorted(done):
            del running[i]
            finish(i)
    assert not waiting
    # Memory from the finished schedule: [start, free) intervals, free = last data reader's end.
    free = list(end)
    for i in range(n):
        readers = [end[j] for j, data in succ[i] if data]
        if readers:
            free[i] = max(readers)
    peak = []
    for d in range(g.num_pools):
        bufs = [(start[i], free[i], int(g.mem_bytes[i])) for i in range(n) if g.mem_device[i] == d]
        best = 0
        for tt in {s for s, _, _ in bufs}:
            best = max(best, sum(b for s, f, b in bufs if s <= tt < f))
        peak.append(int(g.persistent_bytes[d]) + best)
    return dict(start=start, end=end, ready=ready, free_time=free, busy=busy, peak_bytes=peak,
                makespan=max(end, default=0.0))


@pytest.mark.parametrize("seed", range(12))
def test_matches_reference_model_on_random_graphs(seed):
    rng = np.random.default_rng(100 + seed)
    eng = Engine()
    for trial in range(6):
        g = _random_graph(rng, int(rng.integers(1, 28)), num_res=int(rng.integers(1, 5)),
                          ties=trial % 3 != 2, zero=0.3 if trial % 2 else 0.1)
        got, want = eng.run(g), _reference(g)
        for field in ("start", "end", "ready", "free_time", "busy", "peak_bytes"):
            np.testing.assert_array_equal(getattr(got, field), np.array(want[field]),
                                          err_msg=f"seed {seed} trial {trial}: {field}")
        assert got.makespan == want["makespan"]
        np.testing.assert_array_equal(got.oom, got.peak_bytes > g.capacity_bytes)


# ----------------------------------------------------------------------------- C++ use of engine.h


CPP_CLIENT = r"""
#include "engine.h"
#include <cstdio>
int main() {
  // a (gpu0, 1s, 100 B) -> b (gpu0 + link, 2s) ; c (link, 1s) contends with b for the link.
  tag_sim::TaskGraph g;
  g.num_resources = 2;
  g.duration = {1.0, 2.0, 1.0};
  g.res_ptr = {0, 1, 3, 4};
  g.res = {0, 0, 1, 1};
  g.succ_ptr = {0, 1, 1, 1};
  g.succ = {1};
  g.succ_data = {1};
  g.mem_device = {0, -1, -1};
  g.mem_bytes = {100, 0, 0};
  g.persistent_bytes = {10};
  g.capacity_bytes = {105};
  const tag_sim::GraphView v = g.view();
  if (!tag_sim::validate(v).empty()) return 2;
  tag_sim::Engine e;
  for (int rep = 0; rep < 2; ++rep)
    if (e.run(v) != tag_sim::Status::kOk) return 3;
  std::printf("%g %g %g %lld %d\n", e.makespan(), e.start()[1], e.start()[2],
              static_cast<long long>(e.peak_bytes()[0]), static_cast<int>(e.oom()[0]));
  g.succ_ptr = {0, 1, 2, 2};  // add b -> a: a cycle
  g.succ = {1, 0};
  g.succ_data = {1, 0};
  const tag_sim::GraphView c = g.view();
  if (e.run(c) != tag_sim::Status::kCycle) return 4;
  std::printf("%zu\n", tag_sim::find_cycle(c).size());
  return 0;
}
"""


def test_engine_header_is_self_contained_cpp(tmp_path):
    import os
    import shutil
    import subprocess

    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    kernels = os.path.join(os.path.dirname(__file__), "..", "..", "kernels")
    src, exe = tmp_path / "client.cpp", tmp_path / "client"
    src.write_text(CPP_CLIENT)
    subprocess.run([cxx, "-std=c++17", "-O0", "-Wall", "-Werror", "-I", kernels, str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    # c (id 2, link) starts at 0 and holds the link until 1, so b (ready at 1) starts at 1 too.
    assert out == ["3", "1", "0", "110", "1", "2"]
