"""Communication measurements on real TensorFlow transfers (the samples `profile.comm.CommModel`
is fitted to).

Measurements
------------
* `measure_p2p(sizes)`: gRPC transfers between two local `tf.distribute.Server` processes
  (`tag_tf.runtime.cluster.LocalCluster`: ``tag-tf server`` processes). A random float32
  variable lives on /job:worker/task:0; the timed step reads it there and passes it task:0 -> task:1
  -> task:0 ... through Identity ops, so the whole tensor crosses the process boundary at every hop.
  Each repeat also runs a *baseline* step with the same participants and no cross-task tensor
  (task:0 slices its own data, task:1 reads a tiny variable); the transfer time is
  (median(step) - median(baseline)) / hops: the session-run and RunGraph overheads cancel, the
  RecvTensor RPC (including its latency) stays.
* `measure_allreduce(num_devices, sizes)`: `CollectiveReduceV2` (Add/Id) over N virtual CPU devices
  in one session (``device_count={'CPU': N}``), or over N server processes with ``processes=True``
  (each server and the client set ``experimental.collective_group_leader``). Same baseline scheme
  (a step that only reads every input). The step chains several all-reduces, each reducing the
  previous one's outputs with its own instance key. Every size is checked: the leading (up to 1024)
  elements of every device's output must equal the (scaled) sum of the inputs.
Why chains: on a shared CPU host a session step costs ~1 ms with millisecond jitter, far more than a
small transfer. Messages below 1 MiB are repeated 16 times (all-reduce: 8) in one step, larger ones
fewer times (16 MiB moved per step at most), which spreads that overhead and its jitter.
Every session and server sets ``operation_timeout_in_ms``,
so a mistake fails with an error instead of hanging; server processes are stopped by PID and also
exit on their own when their parent dies.

Sizes go from 1 KiB doubling up to a cap (`sizes_up_to`; default 1 GiB as in the paper, tests and
the local benchmark use a few MiB / 64 MiB).
"""
from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from tag_tf.errors import ProfileError, tf_reason
from tag_tf.profile.comm import Sample
from tag_tf.runtime.cluster import LocalCluster
from tag_tf.runtime.sessions import session_config

if TYPE_CHECKING:
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

__all__ = ["chain_length", "measure_allreduce", "measure_p2p", "run_allreduce", "sizes_up_to", "time_pair"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_CAP = GiB              # the paper profiles up to 1 GB on real clusters
DEFAULT_TIMEOUT_S = 60.0       # per TF operation; a hung transfer fails after this
CHECK_ELEMENTS = 1024          # all-reduce correctness check: this many leading elements
_FLOAT = 4                     # bytes per float32

T = TypeVar("T")


class Tasks(Protocol):
    """Server processes to measure on: a LocalCluster, or tasks of a running cluster
    (`measure.links`)."""

    @property
    def num_tasks(self) -> int: ...

    @property
    def target(self) -> str: ...

    def device(self, i: int, index: int = 0) -> str: ...

    def session_config(self) -> ConfigProto: ...


def sizes_up_to(cap: int = DEFAULT_CAP, start: int = KiB) -> list[int]:
    """start, 2*start, ... up to and including cap (bytes)."""
    if start < _FLOAT or cap < start:
        raise ProfileError(f"sizes: need 4 <= start <= cap, got start={start}, cap={cap}")
    out, s = [], start
    while s <= cap:
        out.append(s)
        s *= 2
    return out


# ---- local server processes --------------------------------------------------------------------
def _config(timeout_s: float, leader: str | None = None, cpus: int | None = None) -> ConfigProto:
    return session_config(cpus, timeout_ms=int(timeout_s * 1000), collective_leader=leader, soft_placement=False)


def time_pair(run: Callable[[], object], baseline: Callable[[], object], repeats: int,
              warmup: int = 2) -> tuple[float, float]:
    """Median seconds of `run` and of `baseline`, interleaved so drift hits both alike."""
    if repeats < 1:
        raise ProfileError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        baseline()
        run()
    steps, bases = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        baseline()
        t1 = time.perf_counter()
        run()
        t2 = time.perf_counter()
        bases.append(t1 - t0)
        steps.append(t2 - t1)
    return statistics.median(steps), statistics.median(bases)


def _elements(nbytes: int) -> int:
    if nbytes < _FLOAT:
        raise ProfileError(f"sizes must be >= {_FLOAT} bytes (one float32), got {nbytes}")
    return nbytes // _FLOAT


def _run_tf(fn: Callable[[], T], what: str) -> T:
    import tensorflow as tf

    try:
        return fn()
    except tf.errors.OpError as e:
        raise ProfileError(f"{what}: {type(e).__name__}: {tf_reason(e)}") from None


def chain_length(nbytes: int, budget: int = 16 * MiB, most: int = 16) -> int:
    """How many back-to-back transfers (or all-reduces) one timed step chains: small messages are
    repeated so the per-step overhead and its jitter are spread over many of them."""
    return max(1, min(most, budget // max(nbytes, 1)))


def measure_p2p(sizes: Sequence[int], repeats: int = 5, warmup: int = 1,
                cluster: Tasks | None = None, record: list | None = None, chain_budget: int = 16 * MiB
                ) -> list[Sample]:
    """[(bytes, seconds)]: one gRPC transfer between the two tasks of a local cluster per size
    (median of `repeats` after `warmup`, baseline subtracted, clamped at 0). Starts and stops its
    own cluster unless one with >= 2 tasks is given. `record`, if given, gets one dict per size
    with the raw step and baseline medians and the chain length.

    The timed step chains `chain_length(bytes)` hops task:0 -> task:1 -> task:0 ... (an Identity
    on the receiving task, grappler off so it stays), each hop moving the whole tensor, and the
    per-transfer time is (median(step) - median(baseline)) / hops."""
    if cluster is None:
        with LocalCluster(2, timeout_ms=int(DEFAULT_TIMEOUT_S * 1000)) as own:
            return measure_p2p(sizes, repeats, warmup, own, record, chain_budget)
    if cluster.num_tasks < 2:
        raise ProfileError("measure_p2p: the cluster needs at least 2 tasks")
    import tensorflow as tf

    config = cluster.session_config()
    config.graph_options.rewrite_options.disable_meta_optimizer = True   # keep the Identity hops
    out: list[Sample] = []
    for nbytes in sizes:
        n, hops = _elements(nbytes), chain_length(nbytes, chain_budget)
        g = tf.Graph()
        with g.as_default():
            with tf.device(cluster.device(0)):
                src = tf.Variable(tf.random.uniform([n], dtype=tf.float32), name="src")
                x = src.read_value()
                local_slice = x[:1]
            with tf.device(cluster.device(1)):
                tiny = tf.Variable(tf.zeros([1]), name="tiny")
                tiny_read = tiny.read_value()
            for hop in range(hops):
                with tf.device(cluster.device((hop + 1) % 2)):
                    x = tf.identity(x)             # receives the whole tensor from the other task
            with tf.device(cluster.device(hops % 2)):
                end = x[:1]
            init = tf.compat.v1.global_variables_initializer()
        with tf.compat.v1.Session(cluster.target, graph=g, config=config) as sess:
            _run_tf(lambda: sess.run(init), f"p2p {nbytes} B: init")
            step, base = _run_tf(lambda: time_pair(
                lambda: sess.run(end.op), lambda: sess.run([local_slice.op, tiny_read.op]),
                repeats, warmup), f"p2p {nbytes} B")
        out.append((int(nbytes), max(step - base, 0.0) / hops))
        if record is not None:
            record.append({"bytes": int(nbytes), "chain": hops, "step_s": step,
                           "baseline_s": base, "seconds": out[-1][1]})
    return out


def _allreduce_graph(tf, devices: list[str], inputs: list, keys: Callable[[], int], rounds: int = 1):
    """Variables holding `inputs` on `devices`, their reads, and `rounds` chained CollectiveReduceV2
    (Add/Id) per device, each round reducing the previous round's outputs. Returns (reads, final
    outputs). Every round is its own collective instance, so it gets its own instance key."""
    reads = []
    for i, (dev, init) in enumerate(zip(devices, inputs)):
        with tf.device(dev):
            reads.append(tf.Variable(init, name=f"in{i}").read_value())
    group_key, xs = keys(), reads
    for _ in range(rounds):
        instance_key, nxt = keys(), []
        for dev, x in zip(devices, xs):
            with tf.device(dev):
                nxt.append(tf.raw_ops.CollectiveReduceV2(
                    input=x, group_size=tf.constant(len(devices)), group_key=tf.constant(group_key),
                    instance_key=tf.constant(instance_key), ordering_token=[], merge_op="Add",
                    final_op="Id"))   # no timeout_seconds: it starts a timer thread per run, which
                                      # inflates small timings; the session's operation timeout
                                      # still turns a hang into an error
        xs = nxt
    return reads, xs


class _Placement:
    """Where an all-reduce runs: N virtual CPUs in this process, or N tasks of a LocalCluster."""

    def __init__(self, num_devices: int, processes: bool, cluster: LocalCluster | None,
                 timeout_s: float):
        if num_devices < 2:
            raise ProfileError(f"all-reduce needs >= 2 devices, got {num_devices}")
        self.num_devices, self.processes = num_devices, processes
        self.cluster = cluster if processes else None   # in-process runs ignore a given cluster
        self.timeout_s = self.cluster.timeout_ms / 1000 if self.cluster else timeout_s
        self._keys = itertools.count(1)
        if self.cluster is not None and self.cluster.num_tasks < num_devices:
            raise ProfileError(f"all-reduce over {num_devices} processes needs as many tasks, "
                               f"the cluster has {self.cluster.num_tasks}")

    @property
    def tasks(self) -> LocalCluster:
        assert self.cluster is not None, "processes=True runs on a cluster (_with_placement starts one)"
        return self.cluster

    @property
    def devices(self) -> list[str]:
        if self.processes:
            return [self.tasks.device(i) for i in range(self.num_devices)]
        return [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(self.num_devices)]

    def next_key(self) -> int:
        if self.processes:
            return self.tasks.next_key()
        return next(self._keys)   # a fresh in-process session per graph: keys only need to differ

    def session(self, tf, graph):
        if self.processes:
            return tf.compat.v1.Session(self.tasks.target, graph=graph, config=self.tasks.session_config())
        return tf.compat.v1.Session(graph=graph, config=_config(self.timeout_s, cpus=self.num_devices))


def _with_placement(num_devices: int, processes: bool, cluster: LocalCluster | None,
                    timeout_s: float, body: Callable[[_Placement], T]) -> T:
    if processes and cluster is None:
        with LocalCluster(num_devices, timeout_ms=int(timeout_s * 1000)) as own:
            return body(_Placement(num_devices, True, own, timeout_s))
    return body(_Placement(num_devices, processes, cluster, timeout_s))


def run_allreduce(inputs: Sequence[np.ndarray], processes: bool = False,
                  cluster: LocalCluster | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> list[np.ndarray]:
    """Run one CollectiveReduceV2 (sum) over len(inputs) devices and return every device's output."""
    import tensorflow as tf

    arrays = [np.asarray(a, dtype=np.float32) for a in inputs]

    def body(p: _Placement) -> list[np.ndarray]:
        g = tf.Graph()
        with g.as_default():
            _, outs = _allreduce_graph(tf, p.devices, arrays, p.next_key)
            init = tf.compat.v1.global_variables_initializer()
        with p.session(tf, g) as sess:
            _run_tf(lambda: sess.run(init), "all-reduce: init")
            return _run_tf(lambda: sess.run(outs), "all-reduce")

    return _with_placement(len(arrays), processes, cluster, timeout_s, body)


def measure_allreduce(num_devices: int, sizes: Sequence[int], processes: bool = False,
                      repeats: int = 5, warmup: int = 1, cluster: LocalCluster | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S,
                      record: list | None = None) -> list[Sample]:
    """[(bytes, seconds)] of a sum all-reduce of `bytes` per device over `num_devices` virtual CPU
    devices (or server processes with `processes=True`; a given `cluster` is reused). Each size is
    checked for the correct sum (ProfileError otherwise)."""
    import tensorflow as tf

    def body(p: _Placement) -> list[Sample]:
        out: list[Sample] = []
        for nbytes in sizes:
            n, rounds = _elements(nbytes), chain_length(nbytes, most=8)
            g = tf.Graph()
            with g.as_default():
                inits = [tf.random.uniform([n], dtype=tf.float32, seed=i) for i in range(num_devices)]
                reads, outs = _allreduce_graph(tf, p.devices, inits, p.next_key, rounds)
                k = min(n, CHECK_ELEMENTS)
                heads = [r[:k] for r in reads]
                out_heads = [o[:k] for o in outs]
                init = tf.compat.v1.global_variables_initializer()
            with p.session(tf, g) as sess:
                what = f"all-reduce {nbytes} B over {num_devices} devices"
                _run_tf(lambda: sess.run(init), f"{what}: init")
                ins, res = _run_tf(lambda: sess.run([heads, out_heads]), what)
                # round 1 gives every device the sum S; each later round multiplies by D
                want = np.sum(ins, axis=0, dtype=np.float64) * float(num_devices) ** (rounds - 1)
                for i, r in enumerate(res):
                    if not np.allclose(r, want, rtol=1e-4, atol=1e-5):
                        raise ProfileError(f"{what}: device {i} got a wrong sum")
                step, base = _run_tf(lambda: time_pair(
                    lambda: sess.run([o.op for o in out_heads]),
                    lambda: sess.run([h.op for h in heads]), repeats, warmup), what)
            out.append((int(nbytes), max(step - base, 0.0) / rounds))
            if record is not None:
                record.append({"bytes": int(nbytes), "chain": rounds, "step_s": step,
                               "baseline_s": base, "seconds": out[-1][1]})
        return out

    return _with_placement(num_devices, processes, cluster, timeout_s, body)
