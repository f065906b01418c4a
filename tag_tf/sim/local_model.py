"""The local machine model: a Simulator that predicts real runs of compiled strategies on this machine.

    sim = local_simulator(analysis, 4, model=ZooModel("mlp", tiny=True))            # 4 virtual CPUs, 1 process
    sim = local_simulator(analysis, 4, processes=2, model=ZooModel("mlp", tiny=True))  # 2 servers x 2 CPUs
    sim.simulate(strategy).iteration_time_s    # predicted seconds per session.run of the train op

Two local setups are modelled:
  * one TensorFlow process with N virtual CPU devices (`DeviceMap.local_cpus(N)`): topology `local:N`;
  * P local server processes with n virtual CPU devices each (`local_servers(P, n)`, a
    `runtime.cluster.local_cluster`; `DeviceMap.for_topology`): topology `cpu_topology(P, n)`, one
    topology machine per process.

Runtime configuration (`configure_runtime` before TensorFlow is imported, `session_config` for
every session; the profile, the measurements below and the real runs all use it):
  * one intra-op thread per process: an op uses one core, as when it was profiled alone, and P
    processes on this machine's cores do not fight over intra-op threads;
  * one inter-op thread in a process that runs ops itself: the simulator runs the ops of all CPU
    devices of one machine one at a time (they share the process's executor), and with one
    inter-op thread that is literally what TensorFlow does;
  * SERVER_INTER_OP_THREADS (2) in server processes: a gRPC worker runs its request handlers
    (RecvTensor, RecvBuf of collectives, RunGraph) on the inter-op pool, and the executor runs a
    chain of ready ops inline without returning to the pool; with one thread a peer's request for a
    tensor waits until that whole chain has run (measured: the second process of a 2-process DP
    step idled 15 ms for its input split). Server ops still run about one at a time per process
    (one device per process, or two processes on the machine's two cores);
  * oneDNN off (TF_ENABLE_ONEDNN_OPTS=0): its graph rewrite picks kernels by placement (MaxPoolGrad
    uses the forward's workspace only when both are on one device: 45x slower otherwise; Conv2D +
    BiasAdd fuse only when colocated), which per-op costs cannot express; TensorFlow's own kernels
    cost the same wherever they run;
  * Grappler, constant folding and CSE off, as in the profiler: every op runs as written.

What the model is made of (everything measured on this machine, cached in the ProfileDB, keyed by
RUNTIME_TAG):
  * an OpProfile of the graph (`profile_model` at PROFILE_BATCH_SIZES, single device), stored under
    device type DEVICE_TYPE_KEY;
  * an executor correction per graph: the untraced step time minus the traced op times, spread over
    the ops (the executor's per-op dispatch, plus full tracing inflating small ops), so one-device
    predictions add up to the untraced step that real runs see;
  * per setup (`LocalMachine`): a CommModel fitted to TensorFlow's own Send/Recv between two virtual
    devices of one process ("intra" p2p), gRPC RecvTensor between processes ("inter" p2p), and
    CollectiveReduceV2 chains over k devices of one process ("intra:k") or spanning processes
    ("inter:k"); a "cpu" device type whose per-op cost and bandwidth are fitted to the compiler's
    ConcatV2/AddN/ZerosLike on this CPU (the simulator charges conversions launch + bytes /
    bandwidth); and the per-step cost of a session.run (client, master, one RunGraph per process,
    the feed), linear in the fed bytes. The simulator's makespan plus that per-step cost is the
    predicted wall time of one `session.run(train_op)`.
Each transfer/collective time is (median chained step - median baseline step) / chain length, the
baseline having the same participants without the communication (see `tag_tf.profile.comm`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import statistics
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from tag_tf.errors import ProfileError
from tag_tf.profile.segmented import SegmentedLinear
from tag_tf.sim.simulator import SimReport, Simulator, training_costs

log = logging.getLogger(__name__)

THREADS = 1                  # inter-op and intra-op threads of a process that runs the strategy itself
SERVER_INTER_OP_THREADS = 2  # inter-op threads of local server processes (see the module docstring)
PROFILE_BATCH_SIZES: tuple[int, ...] = (8, 16, 32, 64)
COMM_SIZES: tuple[int, ...] = tuple(64 * 4 ** k for k in range(10))     # 64 B .. 16 MiB
FEED_SIZES: tuple[int, ...] = (4, 1 << 20, 4 << 20)                     # bytes fed per step
RUNTIME_TAG = f"t{THREADS}s{SERVER_INTER_OP_THREADS}-eigen"             # part of every ProfileDB key
DEVICE_TYPE_KEY = f"cpu-{RUNTIME_TAG}"       # ProfileDB device-type key of profiles measured this way
TIMEOUT_MS = 60_000
_KEYS = itertools.count(1 << 30)   # collective keys of the measurements: far above the ones compiled graphs use


# ---------------------------------------------------------------------------------------------
# Threads and sessions
# ---------------------------------------------------------------------------------------------
RUNTIME_ENV = {"TF_NUM_INTEROP_THREADS": str(THREADS), "TF_NUM_INTRAOP_THREADS": str(THREADS),
               "TF_ENABLE_ONEDNN_OPTS": "0"}


def configure_runtime() -> bool:
    """Set RUNTIME_ENV for this process and the server processes it starts (they inherit the
    environment). Must run before TensorFlow is imported (oneDNN) and before its first session
    (thread pools are created once per process). Returns False, and logs a warning, when TensorFlow
    was imported already: the setting may then not apply to this process."""
    os.environ.update(RUNTIME_ENV)
    if "tensorflow" in sys.modules:
        log.warning("configure_runtime: TensorFlow is already imported; this process may keep "
                    "oneDNN and its thread pool sizes")
        return False
    return True


@contextlib.contextmanager
def local_servers(processes: int, devices_per_process: int) -> Iterator[Any]:
    """`runtime.cluster.local_cluster` whose servers run SERVER_INTER_OP_THREADS inter-op threads
    (and RUNTIME_ENV otherwise). Yields the ClusterSpec."""
    from tag_tf.runtime.cluster import local_cluster

    saved = {k: os.environ.get(k) for k in RUNTIME_ENV}
    os.environ.update(RUNTIME_ENV)
    os.environ["TF_NUM_INTEROP_THREADS"] = str(SERVER_INTER_OP_THREADS)
    cluster = local_cluster(processes, devices_per_process, timeout_ms=TIMEOUT_MS)
    try:
        spec, _ = cluster.__enter__()          # the servers start here, with this environment
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield spec
    finally:
        cluster.__exit__(None, None, None)


def session_config(num_cpus: int = 1, *, leader: str | None = None, timeout_ms: int = TIMEOUT_MS) -> Any:
    """ConfigProto of the local model's sessions: `num_cpus` virtual CPU devices, THREADS threads,
    every op as written (no Grappler, folding or CSE: the profiler's setting), an operation
    timeout, and the collective group leader for cluster sessions."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    cfg = tf.compat.v1.ConfigProto(device_count={"CPU": num_cpus}, allow_soft_placement=True,
                                   inter_op_parallelism_threads=THREADS,
                                   intra_op_parallelism_threads=THREADS,
                                   operation_timeout_in_ms=timeout_ms)
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True
    opts = cfg.graph_options.optimizer_options
    opts.opt_level = config_pb2.OptimizerOptions.L0
    opts.do_constant_folding = False
    opts.do_common_subexpression_elimination = False
    opts.do_function_inlining = False
    if leader:
        cfg.experimental.collective_group_leader = leader
    return cfg


# ---------------------------------------------------------------------------------------------
# Setups
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LocalSetup:
    """`processes` TensorFlow processes on this machine with `devices_per_process` CPU devices each."""

    processes: int = 1
    devices_per_process: int = 1

    def __post_init__(self) -> None:
        if self.processes < 1 or self.devices_per_process < 1:
            raise ProfileError(f"local setup: need >= 1 process and device, got {self}")

    @property
    def num_devices(self) -> int:
        return self.processes * self.devices_per_process

    @property
    def name(self) -> str:
        return f"{self.processes}proc-{self.devices_per_process}cpu"

    def topology(self) -> Any:
        """The simulator's topology: `local:N` (one process) or `cpu_topology(P, n)`."""
        if self.processes == 1:
            from tag_tf.topology.parse import load_topology

            return load_topology(f"local:{self.devices_per_process}")
        from tag_tf.runtime.cluster import cpu_topology

        return cpu_topology(self.processes, self.devices_per_process)

    def device_names(self, job: str = "worker") -> list[str]:
        """TF device names in topology order (what DeviceMap.local_cpus / for_topology give)."""
        if self.processes == 1:
            return [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(self.devices_per_process)]
        return [f"/job:{job}/replica:0/task:{t}/device:CPU:{i}"
                for t in range(self.processes) for i in range(self.devices_per_process)]


class _Runner:
    """Sessions on one setup: in this process, or on a cluster of local servers (started here)."""

    def __init__(self, setup: LocalSetup, cluster_spec: Any = None):
        self.setup = setup
        self.spec = cluster_spec
        self.devices = setup.device_names(cluster_spec.job if cluster_spec else "worker")

    def session(self, graph: Any) -> Any:
        import tensorflow as tf

        if self.spec is None:
            return tf.compat.v1.Session(graph=graph, config=session_config(self.setup.devices_per_process))
        return tf.compat.v1.Session(self.spec.target, graph=graph,
                                    config=session_config(self.setup.devices_per_process, leader=self.spec.leader))


def _median_pair(run: Callable[[], Any], base: Callable[[], Any], repeats: int, warmup: int = 2
                 ) -> tuple[float, float]:
    """Median seconds of `run` and `base`, alternated so machine noise hits both alike."""
    for _ in range(warmup):
        base()
        run()
    runs, bases = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        base()
        t1 = time.perf_counter()
        run()
        t2 = time.perf_counter()
        bases.append(t1 - t0)
        runs.append(t2 - t1)
    return statistics.median(runs), statistics.median(bases)


def _chain(nbytes: int, budget: int = 16 << 20, most: int = 16) -> int:
    """Operations chained in one timed step: small ones are repeated to spread the step's overhead."""
    return max(1, min(most, budget // max(nbytes, 1)))


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------
def measure_transfers(runner: _Runner, src: int, dst: int, sizes: Sequence[int], repeats: int
                      ) -> list[tuple[int, float]]:
    """[(bytes, seconds)] of one TF transfer src -> dst (device indices of the setup). The timed step
    passes a tensor back and forth through Identity ops placed alternately on dst and src; the
    baseline runs as many Identity ops on src (and a tiny op on dst, so both processes take part
    in both steps). Their difference per hop is the Send/Recv pair (in-process rendezvous or gRPC
    RecvTensor), without the Identity's own cost, which the profile already has."""
    import tensorflow as tf

    out = []
    a, b = runner.devices[src], runner.devices[dst]
    for nbytes in sizes:
        hops = _chain(nbytes)
        g = tf.Graph()
        with g.as_default():
            with tf.device(a):
                var = tf.Variable(tf.random.uniform([max(1, nbytes // 4)]), name="src")
                x = y = var.read_value()
            with tf.device(b):
                tiny = tf.Variable(tf.zeros([1]), name="tiny").read_value()
            for hop in range(hops):
                with tf.device(b if hop % 2 == 0 else a):
                    x = tf.identity(x)
                with tf.device(a):
                    y = tf.identity(y)
            with tf.device(a):
                end_x, end_y = tf.identity(x[:1]), tf.identity(y[:1])
            init = tf.compat.v1.global_variables_initializer()
        with runner.session(g) as sess:
            sess.run(init)
            step, base = _median_pair(lambda: sess.run(end_x.op), lambda: sess.run([end_y.op, tiny.op]), repeats)
        out.append((int(nbytes), max(step - base, 0.0) / hops))
    return out


def measure_collectives(runner: _Runner, devices: Sequence[int], sizes: Sequence[int], repeats: int
                        ) -> list[tuple[int, float]]:
    """[(bytes, seconds)] of one CollectiveReduceV2 (sum) of `bytes` per device over `devices`, the
    op the compiler emits on CPUs, with its default timeout_seconds=0 (a timeout starts a timer
    thread per op run: it would inflate the measured time and leak threads for the timeout's
    duration; the session's operation timeout still stops a hung step). Rounds are chained (each
    reduces the previous outputs, with its own instance key); the baseline reads the inputs on the
    same devices."""
    import tensorflow as tf

    names = [runner.devices[d] for d in devices]
    out = []
    for nbytes in sizes:
        rounds = _chain(nbytes, most=8)
        n = max(1, nbytes // 4)
        g = tf.Graph()
        with g.as_default():
            xs, heads = [], []
            for i, dev in enumerate(names):
                with tf.device(dev):
                    xs.append(tf.Variable(tf.random.uniform([n], seed=i), name=f"in{i}").read_value())
                    heads.append(tf.identity(xs[-1][:1]))
            group = next(_KEYS)
            for _ in range(rounds):
                instance = next(_KEYS)
                nxt = []
                for dev, x in zip(names, xs):
                    with tf.device(dev):
                        nxt.append(tf.raw_ops.CollectiveReduceV2(
                            input=x, group_size=tf.constant(len(names)), group_key=tf.constant(group),
                            instance_key=tf.constant(instance), ordering_token=[], merge_op="Add",
                            final_op="Id"))
                xs = nxt
            ends = []
            for dev, x in zip(names, xs):
                with tf.device(dev):
                    ends.append(tf.identity(x[:1]))
            init = tf.compat.v1.global_variables_initializer()
        with runner.session(g) as sess:
            sess.run(init)
            step, base = _median_pair(lambda: sess.run([e.op for e in ends]),
                                      lambda: sess.run([h.op for h in heads]), repeats)
        out.append((int(nbytes), max(step - base, 0.0) / rounds))
    return out


def measure_step_overhead(runner: _Runner, feed_sizes: Sequence[int], repeats: int) -> list[tuple[int, float]]:
    """[(fed bytes, seconds)] of a session.run that does no work: a float32 placeholder of that size
    fed to a Shape op on device 0, and a no-op on the first device of every other process (a real
    step runs a graph partition in every process). What any step costs beyond its ops."""
    import tensorflow as tf

    per_process = runner.setup.devices_per_process
    out = []
    for nbytes in feed_sizes:
        g = tf.Graph()
        with g.as_default():
            with tf.device(runner.devices[0]):
                ph = tf.compat.v1.placeholder(tf.float32, [max(1, nbytes // 4)], name="feed")
                fetch = [tf.shape(ph).op]
            for p in range(1, runner.setup.processes):
                with tf.device(runner.devices[p * per_process]):
                    fetch.append(tf.constant(0.0).op)
        value = np.zeros(max(1, nbytes // 4), np.float32)
        with runner.session(g) as sess:
            step, _ = _median_pair(lambda: sess.run(fetch, {ph: value}), lambda: None, repeats)
        out.append((int(nbytes), step))
    return out


# The compiler's conversions on a CPU device, and the bytes the simulator charges for each
# (kernels/expand.h: split and concat 2x the tensor, AddN (n+1)x, zeros 1x).
def measure_conversions(sizes: Sequence[int] = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22),
                        repeats: int = 7) -> list[tuple[float, float]]:
    """[(charged bytes, seconds)] of ConcatV2, AddN (2 inputs) and ZerosLike on one CPU device of
    this process, from traced op times (like the profile). SplitV is left out: on the batch axis it
    returns views of its input (about 1 us at any size), which the simulator's one memcpy model
    for all conversions cannot express; it overcharges those splits slightly instead of
    undercharging every copy."""
    import tensorflow as tf

    from tag_tf.profile.op_profiler import op_times_from_step_stats

    samples = []
    for nbytes in sizes:
        n = max(4, nbytes // 4) // 4 * 4
        g = tf.Graph()
        with g.as_default(), tf.device("/device:CPU:0"):
            v = tf.Variable(tf.random.uniform([n]), name="v").read_value()
            w = tf.Variable(tf.random.uniform([n]), name="w").read_value()
            cat = tf.concat([v, w], 0, name="concat")
            total = tf.add_n([v, w], name="addn")
            zeros = tf.zeros_like(v, name="zeros")
            fetch = [cat.op, total.op, zeros.op]
            init = tf.compat.v1.global_variables_initializer()
        charged = {"concat": 2.0 * 2 * nbytes, "addn": 3.0 * nbytes, "zeros": 1.0 * nbytes}
        times: dict[str, list[float]] = {k: [] for k in charged}
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        with tf.compat.v1.Session(graph=g, config=session_config(1)) as sess:
            sess.run(init)
            for r in range(repeats + 2):
                meta = tf.compat.v1.RunMetadata()
                sess.run(fetch, options=opts, run_metadata=meta)
                if r < 2:
                    continue
                got = op_times_from_step_stats(meta.step_stats)
                for k in charged:
                    if k in got:
                        times[k].append(got[k])
        for k, b in charged.items():
            if times[k]:
                samples.append((b, statistics.median(times[k])))
    return samples


def fit_line(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of a least-squares line, both clipped non-negative."""
    x = np.array([s[0] for s in samples], dtype=np.float64)
    y = np.array([s[1] for s in samples], dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return float(max(np.mean(y), 0.0)), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:
        return 0.0, float(max(np.sum(x * y) / np.sum(x * x), 0.0))
    return float(intercept), float(max(slope, 0.0))


# ---------------------------------------------------------------------------------------------
# The local machine (per setup)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LocalMachine:
    """What one setup costs beyond the ops: communication, conversions, the step itself."""

    setup: LocalSetup
    p2p: Mapping[str, list]                 # "intra" / "inter" -> [(bytes, seconds)]
    allreduce: Mapping[str, list]           # "intra:k" / "inter:k" -> [(bytes, seconds)]
    conversion_launch_s: float              # per Split/Concat/AddN/zeros op
    conversion_bandwidth: float             # bytes/s of the bytes the simulator charges them
    step_fixed_s: float                     # a session.run with no work
    step_per_feed_byte_s: float             # ... plus this per fed byte
    single_step_fixed_s: float              # the same in one process with one device (the profiler's session)
    single_step_per_feed_byte_s: float
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def comm_model(self, topology: Any) -> Any:
        from tag_tf.profile.comm import CommModel

        p2p = {k: SegmentedLinear.fit(*zip(*v), max_segments=3) for k, v in self.p2p.items() if v}
        ar = {k: SegmentedLinear.fit(*zip(*v), max_segments=3) for k, v in self.allreduce.items() if v}
        return CommModel(topology, p2p, ar)

    def topology(self) -> Any:
        """The setup's topology with the "cpu" device type replaced by this machine's measured one
        (custom types take precedence over GPU_TYPES; only conversion costs read these numbers)."""
        from tag_tf.topology.gpus import GPU_TYPES, GpuType

        base = self.setup.topology()
        cpu = GPU_TYPES["cpu"]
        measured = GpuType("cpu", cpu.peak_flops, self.conversion_bandwidth, cpu.memory_bytes,
                           self.conversion_launch_s)
        return dataclasses.replace(base, gpu_types=(measured,))

    def step_overhead(self, feed_bytes: float) -> float:
        return self.step_fixed_s + self.step_per_feed_byte_s * feed_bytes

    def single_step_overhead(self, feed_bytes: float) -> float:
        return self.single_step_fixed_s + self.single_step_per_feed_byte_s * feed_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"setup": dataclasses.asdict(self.setup), "runtime": RUNTIME_TAG,
                "p2p": {k: [list(s) for s in v] for k, v in self.p2p.items()},
                "allreduce": {k: [list(s) for s in v] for k, v in self.allreduce.items()},
                "conversion_launch_s": self.conversion_launch_s,
                "conversion_bandwidth": self.conversion_bandwidth,
                "step_fixed_s": self.step_fixed_s, "step_per_feed_byte_s": self.step_per_feed_byte_s,
                "single_step_fixed_s": self.single_step_fixed_s,
                "single_step_per_feed_byte_s": self.single_step_per_feed_byte_s, "info": dict(self.info)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LocalMachine":
        return cls(LocalSetup(**d["setup"]), {k: [tuple(s) for s in v] for k, v in d["p2p"].items()},
                   {k: [tuple(s) for s in v] for k, v in d["allreduce"].items()},
                   float(d["conversion_launch_s"]), float(d["conversion_bandwidth"]),
                   float(d["step_fixed_s"]), float(d["step_per_feed_byte_s"]), float(d["single_step_fixed_s"]),
                   float(d["single_step_per_feed_byte_s"]), dict(d.get("info", {})))


def _db_key(setup: LocalSetup) -> str:
    return f"local-{setup.name}-{RUNTIME_TAG}-{setup.topology().fingerprint}"


def _ring_devices(setup: LocalSetup, k: int) -> list[int]:
    """k devices spanning the processes, dealt round-robin (process 0 device 0, process 1 device 0,
    ...), in topology order: the shape of a group that spans machines."""
    n = setup.devices_per_process
    order = [p * n + i for i in range(n) for p in range(setup.processes)]
    return sorted(order[:k])


def measure_machine(setup: LocalSetup, *, sizes: Sequence[int] = COMM_SIZES, repeats: int = 7) -> LocalMachine:
    """Measure everything `LocalMachine` holds for `setup` (starts and stops its servers)."""
    t0 = time.perf_counter()
    if setup.processes == 1:
        return _measure(setup, _Runner(setup), sizes, repeats, t0)
    with local_servers(setup.processes, setup.devices_per_process) as spec:
        return _measure(setup, _Runner(setup, spec), sizes, repeats, t0)


def _measure(setup: LocalSetup, runner: _Runner, sizes: Sequence[int], repeats: int, t0: float) -> LocalMachine:
    n = setup.devices_per_process
    p2p: dict[str, list] = {}
    allreduce: dict[str, list] = {}
    if n > 1:
        p2p["intra"] = measure_transfers(runner, 0, 1, sizes, repeats)
        for k in range(2, n + 1):
            allreduce[f"intra:{k}"] = measure_collectives(runner, list(range(k)), sizes, repeats)
    if setup.processes > 1:
        p2p["inter"] = measure_transfers(runner, 0, n, sizes, repeats)
        for k in range(2, setup.num_devices + 1):
            allreduce[f"inter:{k}"] = measure_collectives(runner, _ring_devices(setup, k), sizes, repeats)
    step = measure_step_overhead(runner, FEED_SIZES, max(repeats, 15))
    single = step if setup == LocalSetup(1, 1) else \
        measure_step_overhead(_Runner(LocalSetup(1, 1)), FEED_SIZES, max(repeats, 15))
    conv = measure_conversions(repeats=repeats)
    launch, per_byte = fit_line(conv)
    return LocalMachine(setup, p2p, allreduce, launch, 1.0 / per_byte if per_byte > 0 else 1e12,
                        *fit_line(step), *fit_line(single),
                        {"step_samples": [list(s) for s in step], "single_step_samples": [list(s) for s in single],
                         "conversion_samples": [list(s) for s in conv],
                         "measure_s": round(time.perf_counter() - t0, 1), "repeats": repeats})


def local_machine(setup: LocalSetup, db: Any = None, *, refresh: bool = False, **measure_kw: Any) -> LocalMachine:
    """The setup's LocalMachine from the ProfileDB, or measured now (and stored)."""
    key = _db_key(setup)
    if db is not None and not refresh:
        found = db.get_comm(key)
        if found is not None:
            try:
                return LocalMachine.from_dict(found)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("ignoring malformed local machine model %s (%s)", key, e)
    machine = measure_machine(setup, **measure_kw)
    if db is not None:
        db.put_comm(key, machine.to_dict())
    return machine


# ---------------------------------------------------------------------------------------------
# The op profile (per graph)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ZooModel:
    """How to rebuild the analysed graph at other batch sizes: a zoo model name and build arguments
    (everything but batch_size, exactly as the analysed graph was built)."""

    name: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, **kwargs: Any) -> "ZooModel":
        return cls(name, tuple(sorted(kwargs.items())))


def local_profile(analysis: Any, model: ZooModel | None, db: Any = None, *,
                  batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES, repeats: int = 7,
                  refresh: bool = False) -> Any:
    """The graph's OpProfile on this CPU with the local threads: from the ProfileDB (keyed by the
    analysed graph's fingerprint and device type DEVICE_TYPE_KEY), or measured with `profile_model`
    (single device, full tracing, `repeats` traced steps per batch size) and stored."""
    from tag_tf.profile.op_profiler import profile_model

    fingerprint = analysis.graph.fingerprint
    sizes = tuple(sorted(set(int(b) for b in batch_sizes)))

    def measure():
        if model is None:
            raise ProfileError("no stored profile of this graph on this CPU: pass model=ZooModel(...) "
                               "so it can be measured")
        prof = profile_model(model.name, sizes, repeats=repeats, inter_op_threads=THREADS, **dict(model.kwargs))
        return dataclasses.replace(prof, fingerprint=fingerprint,
                                   info={**prof.info, "runtime": RUNTIME_TAG, "env": dict(RUNTIME_ENV)})

    if db is None:
        return measure()
    if refresh:
        prof = measure()
        db.put_op_profile(prof, fingerprint, DEVICE_TYPE_KEY, sizes)
        return prof
    prof, _ = db.op_profile(fingerprint, DEVICE_TYPE_KEY, sizes, measure)
    return prof


def executor_overhead(profile: Any, machine: LocalMachine, feed_bytes: Mapping[int, float]) -> float:
    """Seconds to add to every profiled op so that the fitted single-device step adds up to the
    untraced one: median over profiled batch sizes of (wall step - per-step overhead - sum of fitted
    op times) / ops. Positive: the executor's dispatch between ops; negative: tracing inflated the
    traced times (small ops)."""
    if profile.step_times is None or profile.num_ops == 0:
        return 0.0
    per_op = []
    for k, b in enumerate(profile.batch_sizes):
        rest = profile.step_times[k] - machine.single_step_overhead(feed_bytes.get(b, 0.0)) - profile.total(b)
        per_op.append(rest / profile.num_ops)
    return float(np.median(per_op))


def feed_bytes_of(graph: Any) -> float:
    """Bytes fed per step (the batch inputs at the graph's batch size)."""
    total = 0
    for name in graph.meta.feeds:
        total += graph.tensor(name).nbytes or 0
    return float(total)


def corrected_costs(analysis: Any, profile: Any, per_op_s: float) -> Any:
    """Training op costs from the profile, each profiled op's fixed time shifted by `per_op_s`
    (clipped at 0)."""
    costs = training_costs(analysis, ("cpu",), profile)
    index = profile.index()
    rows = np.array([n in index for n in costs.op_names], dtype=bool)
    fixed = costs.fixed.copy()
    fixed[:, rows] = np.maximum(fixed[:, rows] + per_op_s, 0.0)
    return dataclasses.replace(costs, fixed=fixed)


# ---------------------------------------------------------------------------------------------
# The simulator
# ---------------------------------------------------------------------------------------------
class LocalSimulator(Simulator):
    """A Simulator whose reports add the per-step cost of a session.run: iteration_time_s is the
    predicted wall time of one training step on the local setup."""

    def __init__(self, analysis: Any, machine: LocalMachine, profile: Any, per_op_s: float):
        topology = machine.topology()
        costs = corrected_costs(analysis, profile, per_op_s)
        super().__init__(analysis, topology, costs=costs, comm=machine.comm_model(topology))
        self.machine = machine
        self.profile = profile
        self.per_op_s = per_op_s
        self.step_overhead_s = machine.step_overhead(feed_bytes_of(analysis.graph_b1))

    def simulate(self, strategy: Any, *, detail: bool = False) -> SimReport:
        report = super().simulate(strategy, detail=detail)
        return dataclasses.replace(report, iteration_time_s=report.iteration_time_s + self.step_overhead_s)


def local_simulator(analysis: Any, num_devices: int, processes: int = 1, *, db: Any = None,
                    model: ZooModel | None = None, profile: Any = None, machine: LocalMachine | None = None,
                    refresh: bool = False, profile_repeats: int = 7, comm_repeats: int = 7) -> LocalSimulator:
    """A simulator of `analysis` on this machine: `num_devices` virtual CPU devices spread evenly
    over `processes` local TensorFlow processes. The op profile and the machine measurements come
    from `db` (a ProfileDB) when stored there, else they are measured now (the profile needs `model`
    to rebuild the graph at the profiled batch sizes) and stored. `profile` / `machine` override."""
    if num_devices < 1 or processes < 1 or num_devices % processes:
        raise ProfileError(f"local simulator: {num_devices} devices do not split evenly over {processes} processes")
    setup = LocalSetup(processes, num_devices // processes)
    if machine is None:
        machine = local_machine(setup, db, refresh=refresh, repeats=comm_repeats)
    if profile is None:
        profile = local_profile(analysis, model, db, repeats=profile_repeats, refresh=refresh)
    per_op = executor_overhead(profile, machine, _profile_feed_bytes(analysis, profile))
    return LocalSimulator(analysis, machine, profile, per_op)


def _profile_feed_bytes(analysis: Any, profile: Any) -> dict[int, float]:
    """Fed bytes at each profiled batch size (the analysed graph's feed scaled by batch)."""
    per_sample = feed_bytes_of(analysis.graph_b1) / analysis.batch_size
    return {b: per_sample * b for b in profile.batch_sizes}


__all__ = ["THREADS", "SERVER_INTER_OP_THREADS", "RUNTIME_ENV", "PROFILE_BATCH_SIZES", "LocalSetup", "LocalMachine",
           "LocalSimulator", "ZooModel", "configure_runtime", "local_servers", "session_config", "local_machine", "measure_machine", "local_profile",
           "local_simulator", "executor_overhead", "measure_transfers", "measure_collectives",
           "measure_step_overhead", "measure_conversions"]
