"""The topology of a running cluster: devices as its servers report them, links as measured.

The chief reads every task's description (`runtime.discovery.gather`), types the GPUs
(`topology.gpus.type_from_device_name`; an unknown card keeps its name with placeholder numbers),
measures each task's compute speed on that task (a chain of matrix products placed on its CPU: it
runs in the task's own process, under its own CPU quota and threads), and measures the network with
the communication profiler: a few gRPC transfers between every pair of tasks, fitted to latency +
bytes / bandwidth, and what one such transfer's handling costs each task's CPU while it computes
(`measure_messages`: the simulator charges it to both ends of every transfer between tasks), and
the CPU time per byte an all-reduce between tasks takes beyond its link (`measure_copy`), how long
each step of an all-reduce waits for each task while it computes (`measure_collective_steps`), and, with
three tasks or more, what a ring all-reduce over every task moves per hop (`measure_fabric`). Tasks
of unequal speed get machine speeds (the fastest is 1.0); links of unequal bandwidth become a
bandwidth matrix (else one switch, the slowest pair). The measurement is cached
per cluster (its addresses and descriptions: a changed CPU quota or cpuset is another cluster) under
the cache directory; speeds are measured again every time, and links too when a speed moved.

A server that publishes nothing (a plain `tf.distribute.Server` someone else started) is described
as the cluster file says: `cpus_per_task` CPU devices, with a warning naming it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tag_tf.context import EMULATED_HOST_ENV
from tag_tf.datafiles import write_atomic
from tag_tf.errors import ProfileError
from tag_tf.runtime.discovery import gather

if TYPE_CHECKING:
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

    from tag_tf.runtime.cluster import ClusterSpec
    from tag_tf.topology.spec import Topology

log = logging.getLogger("tag_tf.discovery")

PROBE_SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20)   # bytes: a small one pins the latency
PROBE_BUDGET = 2 << 20     # bytes one timed step moves at most (0.3 s over a 50 Mbit/s link)
SPEED_SIZE = 512           # the compute probe's square matrices
SPEED_CHAIN = (2, 18)      # products per timed step (the difference: ~34 ms of work at 120 GFLOP/s, several CFS periods)
SPEED_PASSES = 2           # passes over the tasks; each task keeps its best (load only ever slows a probe)
SAME_SPEED = 0.20          # tasks within 20% of the fastest count as equally fast (probe noise)
SAME_BANDWIDTH = 0.20      # pairs within 20% of each other count as one switch
SPEED_MOVED = 0.25         # a task's relative speed this far from the cached one: measure the links again
COPY_SIZES = (1 << 20, 8 << 20)   # bytes of the two all-reduces whose difference times a collective's CPU per byte
RING_SIZES = COPY_SIZES    # bytes of the two all-reduces over every task whose difference times a ring's hop (at most)
RING_PASSES = 3            # passes of the ring probe; the fastest counts (measure_fabric)
RING_SECONDS = 0.25        # what the larger of them may take over the ring's slowest link
FABRIC_SHARED = 0.95       # a ring's hops below this share of its slowest link: a shared network (measure_fabric)
COPY_KEY = 1 << 28         # collective group and instance keys of the copy probe: far from the compiler's
MESSAGE_CHAIN = 40         # 256x256 products on the task while its messages are handled (~13 ms on a full core)
MESSAGES = 16              # small transfers each way per timed step of the message probe
PROBE_KEY_BITS = 22        # _all_reduce_time's instance keys: COPY_KEY + ((slot + 1) << 22) + the element count
PROBE_SLOTS = 64           # ... below COPY_KEY + (65 << 22) (int32 keys; the step probe's lie below COPY_KEY + (1 << 22))
COLLECTIVE_PROBES = 12     # tiny all-reduces over every task per timed step of the all-reduce step probe


class _Pair:
    """Two tasks of a running cluster, in the shape `measure.comm.measure_p2p` drives."""

    num_tasks = 2

    def __init__(self, spec: ClusterSpec, a: int, b: int):
        self.spec, self.tasks = spec, (a, b)
        self.target = spec.target

    def device(self, i: int, index: int = 0) -> str:
        return f"/job:{self.spec.job}/replica:0/task:{self.tasks[i]}/device:CPU:{index}"

    def session_config(self) -> ConfigProto:
        return self.spec.session_config(device_filters=[f"/job:{self.spec.job}/task:{t}" for t in self.tasks])


def fit_link(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of t = latency + bytes / bandwidth, least squares of the relative
    error (latency >= 0). Plain least squares lets the largest transfer's noise set the intercept
    (a 4 MB transfer's 10% jitter is several latencies): it found 0 us for loopback gRPC, whose small
    transfers take ~80 us, and the planner then took per-tensor all-reduces for free."""
    import numpy as np

    x = np.array([b for b, _ in samples], dtype=float)
    y = np.array([t for _, t in samples], dtype=float)
    if np.count_nonzero(y > 0) >= 2:     # a sample clamped at 0 (noise swamped it) says nothing: drop it
        x, y = x[y > 0], y[y > 0]
    weights = 1.0 / np.maximum(y, 1e-9)
    slope, intercept = np.polyfit(x, y, 1, w=weights) if len(x) > 1 else (y[0] / x[0], 0.0)
    if slope <= 0:      # noise swamped the sizes: all of it bandwidth, none latency
        slope, intercept = float(y.max() / x.max()), 0.0
    return float(1.0 / slope), float(max(intercept, 0.0))


def measure_links(spec: ClusterSpec, repeats: int = 3) -> dict:
    """Every pair of tasks' link, measured: {"pairs": [...], "bandwidth": B/s, "latency": s,
    "drive_s": s}; the slowest bandwidth, the largest latency and the largest driving cost
    (`measure_drive`, the chief's pairs) stand for the switch where one switch describes the links."""
    from tag_tf.measure.comm import measure_p2p

    pairs: list[dict[str, Any]] = []
    n = len(spec.tasks)
    for a in range(n):
        for b in range(a + 1, n):
            pair = _Pair(spec, a, b)
            samples = measure_p2p(PROBE_SIZES, repeats=repeats, warmup=1, cluster=pair, chain_budget=PROBE_BUDGET)
            bandwidth, latency = fit_link(samples)
            pairs.append({"tasks": [a, b], "bandwidth": bandwidth, "latency": latency,
                          "drive_s": measure_drive(pair) if a == 0 else None,
                          "samples": [[int(x), float(t)] for x, t in samples]})
    return {"pairs": pairs, "bandwidth": min(float(p["bandwidth"]) for p in pairs),
            "latency": max(float(p["latency"]) for p in pairs),
            "drive_s": max(float(p["drive_s"]) for p in pairs if p["drive_s"] is not None),
            **measure_fabric(spec, pairs, repeats)}


def measure_messages(spec: ClusterSpec, flops: Sequence[float] | None = None, repeats: int = 11) -> list[float]:
    """Per task, the CPU seconds one cross-process message (a small gRPC transfer) takes from it while
    it computes: a chain of MESSAGE_CHAIN matrix products on the task, timed alone and beside MESSAGES
    small transfers from the fastest other task and MESSAGES to it (`flops`: discovery's speeds;
    else task 0, or 1 for task 0). The transfers need no compute, so what they add to the chain is
    the CPU that handling them took from the task's quota. Measured on an emulated cluster: 60 us on
    a full core, 250 us on half a core, 330-400 us on a quarter (the transfers alone take under 100 us)."""
    n = len(spec.tasks)
    out = [0.0] * n
    if n < 2:
        return out
    for task in range(n):
        others = [k for k in range(n) if k != task]
        partner = max(others, key=lambda k: flops[k]) if flops is not None else others[0]
        out[task] = _message_cost(spec, task, partner, repeats)
    return out


def _message_cost(spec: ClusterSpec, task: int, partner: int, repeats: int) -> float:
    import tensorflow as tf

    from tag_tf.measure.comm import _run_tf, time_pair

    job = spec.job
    here, there = (f"/job:{job}/replica:0/task:{k}/device:CPU:0" for k in (task, partner))
    config = spec.session_config(device_filters=sorted({f"/job:{job}/task:{k}" for k in (0, task, partner)}))
    config.graph_options.rewrite_options.disable_meta_optimizer = True     # keep every transfer
    g = tf.Graph()
    with g.as_default():
        with tf.device(here):
            chain = _busy_chain("message_probe")
        moved = []
        for src, dst, tag in ((there, here, "in"), (here, there, "out")):
            with tf.device(src):
                values = [tf.Variable(tf.zeros([1]), name=f"message_{tag}{i}").read_value() for i in range(MESSAGES)]
            with tf.device(dst):
                moved += [tf.identity(v).op for v in values]
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(spec.target, graph=g, config=config) as sess:
        _run_tf(lambda: sess.run(init), f"message cost of task {task}: init")
        both, alone = _run_tf(lambda: time_pair(lambda: sess.run([chain, *moved]), lambda: sess.run(chain),
                                                repeats, warmup=2), f"message cost of task {task}")
    return max(both - alone, 0.0) / (2 * MESSAGES)


def _busy_chain(name: str) -> object:
    """MESSAGE_CHAIN 256x256 matrix products on the current device (the work a probe times its
    messages or all-reduces beside): the op that ends them."""
    import tensorflow as tf

    m = tf.Variable(tf.random.uniform([256, 256], -1.0, 1.0) / 256.0, name=name)
    x = m.read_value()
    for _ in range(MESSAGE_CHAIN):
        x = tf.matmul(x, m)
    return tf.reduce_sum(x[:1, :1]).op


def measure_collective_steps(spec: ClusterSpec, repeats: int = 7) -> list[float]:
    """Per task, the seconds each step of an all-reduce over every task waits for that task while it
    computes: a chain of MESSAGE_CHAIN matrix products on the task, timed alone and beside
    COLLECTIVE_PROBES tiny all-reduces over every task, one after another (a ring's steps cannot
    overlap: each waits for the one before); what they add to the chain, per step (2(n-1) steps an
    all-reduce). A step is a message the task takes, sums and passes on; on a CPU quota that runs
    out while the task computes, a step can wait for the task's next period. [] for one task."""
    n = len(spec.tasks)
    if n < 2:
        return []
    return [_collective_step(spec, task, repeats) for task in range(n)]


def _collective_step(spec: ClusterSpec, task: int, repeats: int) -> float:
    import tensorflow as tf

    from tag_tf.measure.comm import _run_tf, time_pair

    job, n = spec.job, len(spec.tasks)
    config = spec.session_config()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    g = tf.Graph()
    with g.as_default():
        with tf.device(f"/job:{job}/replica:0/task:{task}/device:CPU:0"):
            chain = _busy_chain("step_probe")
        values = []
        for t in range(n):
            with tf.device(f"/job:{job}/replica:0/task:{t}/device:CPU:0"):
                values.append(tf.Variable(tf.zeros([4]), name=f"step_value{t}").read_value())
        for k in range(COLLECTIVE_PROBES):        # each all-reduce reads the one before: one after another
            out = []
            for t in range(n):
                with tf.device(f"/job:{job}/replica:0/task:{t}/device:CPU:0"):
                    out.append(tf.raw_ops.CollectiveReduceV2(
                        input=values[t], group_size=tf.constant(n), group_key=tf.constant(COPY_KEY + n * n + 1),
                        instance_key=tf.constant(COPY_KEY + 64 + task * COLLECTIVE_PROBES + k), ordering_token=[],
                        merge_op="Add", final_op="Id"))
            values = out
        ends = []
        for t in range(n):
            with tf.device(f"/job:{job}/replica:0/task:{t}/device:CPU:0"):
                ends.append(tf.identity(values[t][:1]).op)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(spec.target, graph=g, config=config) as sess:
        _run_tf(lambda: sess.run(init), f"all-reduce steps of task {task}: init")
        both, alone = _run_tf(lambda: time_pair(lambda: sess.run([chain, *ends]), lambda: sess.run(chain),
                                                repeats, warmup=2), f"all-reduce steps of task {task}")
    return max(both - alone, 0.0) / (COLLECTIVE_PROBES * 2 * (n - 1))


def measure_copy(spec: ClusterSpec, pairs: Sequence[dict], speeds: Sequence[float] | None, repeats: int = 3) -> float:
    """Seconds per byte a CPU task at speed 1.0 (the fastest) spends on a cross-process all-reduce's
    data beyond what its link takes (gRPC copies and serialisation, the sums): two tasks (the pair
    with the fastest link, of the fastest tasks on a tie) all-reduce COPY_SIZES with TensorFlow's
    CollectiveReduceV2; the slope between the sizes less the link's own seconds per byte is what the
    slower task's CPU took, at its speed. Measured on two emulated hosts over 1 Gbit/s: a 51 MB
    all-reduce took 580 ms on full cores and 710 ms on half cores, where the link alone moves it in
    about 440 ms; 2.5 ms per MB at speed 1.0. 0 where noise leaves nothing above the link."""
    if len(spec.tasks) < 2 or not pairs:
        return 0.0
    speed = (lambda t: 1.0) if speeds is None else (lambda t: float(speeds[t]))
    best = max(pairs, key=lambda p: (float(p["bandwidth"]), min(speed(t) for t in p["tasks"])))
    a, b = best["tasks"]
    seconds = [_all_reduce_time(spec, (a, b), nbytes, k, repeats) for k, nbytes in enumerate(COPY_SIZES)]
    per_byte = (seconds[1] - seconds[0]) / (COPY_SIZES[1] - COPY_SIZES[0]) - 1.0 / float(best["bandwidth"])
    return max(per_byte, 0.0) * min(speed(a), speed(b))


def _all_reduce_time(spec: ClusterSpec, tasks: Sequence[int], nbytes: int, slot: int, repeats: int) -> float:
    """Seconds of one CollectiveReduceV2 of `nbytes` over `tasks` (less reading its inputs), under
    the probe's instance-key `slot`. A server keeps the shape each instance key first ran with and
    aborts a later all-reduce of another shape under that key (a second discovery on the same
    servers, whose links gave the ring probe other sizes, failed so): the key is the slot's and the
    element count's, so one key only ever carries one shape."""
    import tensorflow as tf

    from tag_tf.measure.comm import _run_tf, time_pair

    job, n = spec.job, len(spec.tasks)
    elements = nbytes // 4
    if not 0 <= slot < PROBE_SLOTS or not 0 < elements < 1 << PROBE_KEY_BITS:
        raise ProfileError(f"collective probe: slot {slot} of {nbytes} bytes is outside the probe's keys")
    instance = COPY_KEY + ((slot + 1) << PROBE_KEY_BITS) + elements
    # One group per task set: a pair (a, b) is a * n + b, every task together n * n.
    group = COPY_KEY + (tasks[0] * n + tasks[1] if len(tasks) == 2 else n * n)
    config = spec.session_config(device_filters=sorted({f"/job:{job}/task:{k}" for k in (0, *tasks)}))
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    g = tf.Graph()
    with g.as_default():
        xs, heads, ends = [], [], []
        for i, t in enumerate(tasks):
            with tf.device(f"/job:{job}/replica:0/task:{t}/device:CPU:0"):
                xs.append(tf.Variable(tf.random.uniform([nbytes // 4], seed=i), name=f"copy_probe{i}").read_value())
                heads.append(tf.identity(xs[-1][:1]).op)
        for i, t in enumerate(tasks):
            with tf.device(f"/job:{job}/replica:0/task:{t}/device:CPU:0"):
                y = tf.raw_ops.CollectiveReduceV2(input=xs[i], group_size=tf.constant(len(tasks)),
                                                  group_key=tf.constant(group), instance_key=tf.constant(instance),
                                                  ordering_token=[], merge_op="Add", final_op="Id")
                ends.append(tf.identity(y[:1]).op)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(spec.target, graph=g, config=config) as sess:
        _run_tf(lambda: sess.run(init), "collective probe: init")
        step, base = _run_tf(lambda: time_pair(lambda: sess.run(ends), lambda: sess.run(heads), repeats, warmup=1),
                             "collective probe")
    return max(step - base, 0.0)


def measure_fabric(spec: ClusterSpec, pairs: Sequence[dict], repeats: int = 3) -> dict:
    """What the network carries with every task sending at once, the way a ring all-reduce over
    every task moves it: the tasks all-reduce two sizes with TensorFlow's CollectiveReduceV2 (its
    ring over gRPC, each task sending to the next while it receives from the one before); the slope
    between the sizes gives each hop's rate (2(n-1)/n of the data crosses every hop). {"fabric": n x
    that rate, or None where the hops move at least FABRIC_SHARED of the ring's slowest link alone
    (nothing beyond the links limits them); "ring_hop": bytes/s per hop}.

    Every pair moving whole tensors at once, ping-pong (what this measured before), is not what a
    ring does and measured less than the ring's all-reduces then took: emulated compute cluster
    (speeds 1 : 0.5 : 0.25, 1 Gbit/s links), 65-70 MB/s per pair where the ring moved 99-104 MB/s
    per hop, and the plans' all-reduces ran at the ring's rate (data-parallel steps of the mlp and
    the cnn 12-34% below their predictions). On the same cluster in a scratch run hours later the
    ring moved 75 MB/s per hop: what the hosts' CPUs and the one kernel moving every link's packets leave varies, and
    is measured with the cluster it describes."""
    n = len(spec.tasks)
    if n < 3:             # one pair: nothing moves beside it (measure_copy times the pair's all-reduce)
        return {"fabric": None, "ring_hop": None}
    tasks = list(range(n))
    bandwidth = {frozenset(map(int, p["tasks"])): float(p["bandwidth"]) for p in pairs}
    slowest = min(bandwidth.get(frozenset((t, (t + 1) % n)), math.inf) for t in tasks)
    # The larger all-reduce moves its hops in about RING_SECONDS over the slowest link, 8 MB at most.
    large = int(min(RING_SIZES[1], slowest * RING_SECONDS * n / (2 * (n - 1))))
    sizes = (max(large // 8, 4 << 10), max(large, 32 << 10))
    # Other work on the tasks' cores only ever slows a ring: the fastest of RING_PASSES passes is what
    # the ring moves (the same cluster measured 72 and 99 MB/s per hop in two discoveries minutes
    # apart, one pass each; in the run that read 72, the cnn's, its fused all-reduce plans ran 15-28%
    # faster than predicted with it).
    hop = 0.0
    for k in range(RING_PASSES):
        seconds = [_all_reduce_time(spec, tasks, nbytes, len(COPY_SIZES) + 2 * k + i, repeats)
                   for i, nbytes in enumerate(sizes)]
        slope = (seconds[1] - seconds[0]) / (sizes[1] - sizes[0])
        if slope > 0:     # else noise swamped the sizes
            hop = max(hop, 2.0 * (n - 1) / n / slope)
    if hop <= 0:
        return {"fabric": None, "ring_hop": None}
    return {"fabric": n * hop if hop < FABRIC_SHARED * slowest else None, "ring_hop": hop}


def measure_speeds(spec: ClusterSpec, repeats: int = 5, passes: int = SPEED_PASSES) -> list[float]:
    """Each task's FLOP/s on a chain of float32 matrix products placed on its first CPU device
    (timed from the chief; the chain's length difference cancels the round trip): the best of
    `passes` passes over the tasks. Other work on a task's cores (its program starting up beside the
    probe, another task sharing them) only ever slows a probe: on an emulated cluster of three equal
    half-core hosts, one pass measured one host at 0.5-0.8 of the others; the best of two is what the
    host does when the step is what runs there."""
    best = [0.0] * len(spec.tasks)
    for _ in range(max(1, passes)):
        for task in range(len(spec.tasks)):
            best[task] = max(best[task], measure_speed(spec, task, repeats))
    return best


def measure_speed(spec: ClusterSpec, task: int, repeats: int = 5) -> float:
    import tensorflow as tf

    from tag_tf.measure.comm import _run_tf, time_pair

    device = f"/job:{spec.job}/replica:0/task:{task}/device:CPU:0"
    config = spec.session_config(device_filters=sorted({f"/job:{spec.job}/task:0", f"/job:{spec.job}/task:{task}"}))
    config.graph_options.rewrite_options.disable_meta_optimizer = True     # keep every product
    g = tf.Graph()
    with g.as_default():
        with tf.device(device):
            a = tf.Variable(tf.random.uniform([SPEED_SIZE, SPEED_SIZE], -1.0, 1.0) / SPEED_SIZE, name="speed_probe")
            ends = []
            for length in SPEED_CHAIN:
                x = a.read_value()
                for _ in range(length):
                    x = tf.matmul(x, a)
                ends.append(tf.reduce_sum(x[:1, :1]).op)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(spec.target, graph=g, config=config) as sess:
        _run_tf(lambda: sess.run(init), f"compute speed of task {task}: init")
        long, short = _run_tf(lambda: time_pair(lambda: sess.run(ends[1]), lambda: sess.run(ends[0]), repeats,
                                                warmup=2), f"compute speed of task {task}")
    seconds = max(long - short, 1e-9) / (SPEED_CHAIN[1] - SPEED_CHAIN[0])
    return 2.0 * SPEED_SIZE ** 3 / seconds


def alike_flops(flops: Sequence[float], descriptions: Sequence[dict | None]) -> list[float]:
    """Each task's FLOP/s, the median of its kind's: tasks that describe themselves alike (same host,
    cores, CPU affinity and cgroups, same GPUs) are the same machine, and what their probes differ by
    is noise (local tasks sharing cores measure each other's load)."""
    import statistics

    kinds: dict[str, list[int]] = {}
    for i, d in enumerate(descriptions):
        kinds.setdefault(json.dumps(d, sort_keys=True) if d is not None else f"task{i}", []).append(i)
    out = list(flops)
    for members in kinds.values():
        for i in members:
            out[i] = statistics.median(flops[k] for k in members)
    return out


def relative_speeds(flops: Sequence[float]) -> list[float]:
    """Each task's speed against the fastest (1.0 for all where they are within SAME_SPEED of it)."""
    top = max(flops)
    speeds = [f / top for f in flops]
    if min(speeds) >= 1.0 - SAME_SPEED:
        return [1.0] * len(speeds)
    return [float(f"{s:.2g}") for s in speeds]


def link_matrix(links: dict, n: int) -> list[list[float]] | None:
    """The pairs' bandwidths as a symmetric matrix (bytes/s), or None where one switch describes them."""
    bws = [float(p["bandwidth"]) for p in links["pairs"]]
    if not bws or max(bws) <= (1.0 + SAME_BANDWIDTH) * min(bws) or len(links["pairs"]) < n * (n - 1) // 2:
        return None
    matrix = [[0.0] * n for _ in range(n)]
    for p in links["pairs"]:
        a, b = p["tasks"]
        matrix[a][b] = matrix[b][a] = float(p["bandwidth"])
    return matrix


def link_ports(links: dict, n: int) -> list[float] | None:
    """Each task's port (bytes/s: the fastest of its pairs) where the ports explain every pair (each
    within SAME_BANDWIDTH of the slower of its two ports: a host behind a slow link), else None (the
    pairs' own links: `link_matrix`). A port carries all of its host's transfers, each direction on
    its own: on the emulated link cluster two hosts sending into the one behind 50 Mbit/s at once
    took 2x one host's time (16 x 50 KB: 137.8 ms against 71.6), where a matrix of pairs gave each
    sender the whole link, and a pipeline's activations and gradients crossed together (a matrix
    pair is shared by both directions): the mixed cluster's pipelined cnn ran 116.3 ms a step,
    predicted 207.6 ms with the pairs and 132.6 with the ports."""
    matrix = link_matrix(links, n)
    if matrix is None:
        return None
    ports = [max(matrix[i][j] for j in range(n) if j != i) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if abs(matrix[i][j] / min(ports[i], ports[j]) - 1.0) > SAME_BANDWIDTH:
                return None
    return ports


def measure_drive(pair: _Pair, repeats: int = 41) -> float:
    """Seconds a step driven by one client spends reaching the pair's second task: a session.run that
    adds a value read on each task (the second one's pulled over) against one that adds to the first
    task's value alone (median of `repeats`, interleaved).
    It is what a plan with edges between tasks pays every step on top of its work: each task driving
    its own part of the step (between-graph execution) does not pay it."""
    import tensorflow as tf

    from tag_tf.measure.comm import _run_tf, time_pair

    config = pair.session_config()
    config.graph_options.rewrite_options.disable_meta_optimizer = True     # keep both reads
    g = tf.Graph()
    with g.as_default():
        values = []
        for i in range(2):
            with tf.device(pair.device(i)):
                values.append(tf.Variable(tf.zeros([1]), name=f"drive_probe{i}").read_value())
        with tf.device(pair.device(0)):
            alone, both = values[0] + 1.0, values[0] + values[1]     # `both` pulls the other task's value
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(pair.target, graph=g, config=config) as sess:
        _run_tf(lambda: sess.run(init), "driving cost: init")
        driven, local = _run_tf(lambda: time_pair(lambda: sess.run(both.op), lambda: sess.run(alone.op), repeats,
                                                  warmup=3), "driving cost")
    return max(driven - local, 0.0)


def cluster_key(spec: ClusterSpec, descriptions: Sequence[dict | None]) -> str:
    text = json.dumps({"tasks": list(spec.tasks), "job": spec.job, "devices": list(descriptions)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _machine(task: int, spec: ClusterSpec, description: dict | None, custom: dict[str, dict]) -> dict:
    if description is None:
        log.warning("tag_tf: task %d (%s) did not report its devices (not a tag_tf server?); taking %d CPU "
                    "device(s) from the cluster", task, spec.tasks[task], spec.cpus_per_task)
        return {"name": f"task{task}", "gpus": f"{spec.cpus_per_task}x cpu", "intra": "local"}
    gpus = description.get("gpus") or []
    if not gpus:
        return {"name": f"task{task}", "gpus": f"{int(description['cpu_devices'])}x cpu", "intra": "local"}
    from tag_tf.topology.gpus import GPU_TYPES, type_from_device_name

    types = []
    for g in gpus:
        name = (g.get("name") or "").strip() or "unknown-gpu"
        known = type_from_device_name(name)
        if known is None and name not in custom:      # placeholder numbers, as for local GPUs
            base = GPU_TYPES["V100-32GB"]
            log.warning("tag_tf: task %d: GPU %r is not a known type; using V100-32GB numbers", task, name)
            custom[name] = {"name": name, "peak_flops": base.peak_flops, "mem_bandwidth": f"{base.mem_bandwidth:.0f}B/s",
                            "memory": f"{g.get('memory_bytes') or base.memory_bytes}B"}
        types.append(known or name)
    return {"name": f"task{task}", "gpus": [{"type": t} for t in types], "intra": "pcie"}


def discover(spec: ClusterSpec, cache_dir: str | None = None, measure: bool = True) -> tuple[Topology, dict]:
    """(Topology, report) of the running cluster `spec`: machine i = task i, devices as reported,
    the inter-machine switch as measured (or read from the cache). report: descriptions, link figures,
    whether they came from the cache, the cache file."""
    from tag_tf.topology.load import load_topology

    descriptions = gather(spec)
    custom: dict[str, dict] = {}
    machines = [_machine(i, spec, d, custom) for i, d in enumerate(descriptions)]
    all_cpu = all(isinstance(m["gpus"], str) and m["gpus"].endswith("cpu") for m in machines)
    key = cluster_key(spec, descriptions)
    name = (f"cpu-{len(machines)}x{spec.cpus_per_task}" if all_cpu and
            all(m["gpus"] == f"{spec.cpus_per_task}x cpu" for m in machines) else f"cluster-{key[:8]}")
    for m, d in zip(machines, descriptions):
        if d and d.get("host") and os.environ.get(EMULATED_HOST_ENV):
            m["name"] = str(d["host"])          # an emulated cluster's host names
    topo_spec: dict = {"name": name, "machines": machines}
    if custom:
        topo_spec["gpu_types"] = list(custom.values())
    report: dict = {"descriptions": descriptions, "cache": None, "cached": False, "links": None, "speeds": None}
    flops = measure_speeds(spec) if measure else None
    speeds = None
    if flops is not None:
        speeds = relative_speeds(alike_flops(flops, descriptions))
        report["speeds"] = {"flops": flops, "relative": speeds}
        for m, speed in zip(machines, speeds):
            if speed != 1.0:
                m["speed"] = speed
        if any(speed != 1.0 for speed in speeds):
            name = f"cluster-{key[:8]}"
    topo_spec["name"] = name
    if len(machines) > 1:
        links, path = None, None
        if cache_dir:
            path = os.path.join(cache_dir, "topology", f"{key}.json")
            report["cache"] = path
            try:
                with open(path) as f:
                    links = json.load(f)
                # measured before the driving cost, the pairs, the speeds or the ring were, or a speed moved: again
                report["cached"] = all(k in links for k in ("drive_s", "speeds", "ring_hop", "messages", "copy",
                                                                   "collective")) and \
                    len(links["pairs"]) == len(machines) * (len(machines) - 1) // 2 and \
                    (speeds is None or all(abs(f / c - 1.0) <= SPEED_MOVED for f, c in zip(speeds, links["speeds"])))
                links = links if report["cached"] else None
            except (OSError, ValueError, TypeError, KeyError, ZeroDivisionError):
                links = None
        if links is None and measure:
            links = measure_links(spec)
            links["speeds"] = speeds
            links["messages"] = measure_messages(spec, flops)
            links["copy"] = measure_copy(spec, links["pairs"], speeds)
            links["collective"] = measure_collective_steps(spec)
            if path:
                write_atomic(path, json.dumps(links, indent=1))
        report["links"] = links
        if links is not None:
            for i, (m, seconds) in enumerate(zip(machines, links["messages"])):
                if not (isinstance(m["gpus"], str) and m["gpus"].endswith("cpu")):
                    continue                                    # the executor model is CPU devices'
                if seconds > 0:
                    m["message"] = f"{seconds * 1e6:.4g}us"
                if links["copy"] > 0:                           # at this task's speed
                    m["copy"] = f"{(1.0 if speeds is None else speeds[i]) / links['copy'] / 1e6:.4g}MB/s"
                if links["collective"][i] > 0:
                    m["collective"] = f"{links['collective'][i] * 1e6:.4g}us"
            matrix = link_matrix(links, len(machines))
            ports = link_ports(links, len(machines))
            latency = f"{max(links['latency'], 1e-7) * 1e6:.6g}us"
            if ports is not None:           # a switch, some hosts behind slower ports
                fastest = max(ports)
                topo_spec["inter"] = {"switch": f"{fastest * 8 / 1e9:.6g}Gbps", "latency": latency}
                for m, port in zip(machines, ports):
                    if port < fastest / (1.0 + SAME_BANDWIDTH):
                        m["nic"] = f"{port * 8 / 1e9:.6g}Gbps"
            elif matrix is not None:
                topo_spec["inter"] = {"matrix": [[f"{bw * 8 / 1e9:.6g}Gbps" for bw in row] for row in matrix],
                                      "latency": latency}
            else:
                topo_spec["inter"] = {"switch": f"{links['bandwidth'] * 8 / 1e9:.6g}Gbps", "latency": latency}
            if links.get("fabric"):
                topo_spec["inter"]["fabric"] = f"{links['fabric'] * 8 / 1e9:.6g}Gbps"
        else:
            topo_spec["inter"] = {"switch": "10Gbps"}
    return load_topology(topo_spec), report
