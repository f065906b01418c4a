"""How the local machine model runs TensorFlow: runtimes, setups and their sessions.

A `Runtime` is how every process of a setup runs TensorFlow; the model describes one runtime at a
time (its tag is part of every ProfileDB key), and the process that measures or predicts must run
it too (`configure_runtime` before TensorFlow is imported: thread pools and oneDNN are per process).

PINNED (tag "t1s2-eigen"), the runtime the simulator-accuracy benchmark judges the model on:
  * one intra-op thread per process: an op uses one core, as when it was profiled alone, and P
    processes on this machine's cores do not fight over intra-op threads;
  * one inter-op thread in a process that runs ops itself: the simulator runs the ops of all CPU
    devices of one machine one at a time (they share the process's executor), and with one
    inter-op thread that is literally what TensorFlow does;
  * 2 inter-op threads in server processes: a gRPC worker runs its request handlers
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

TF_DEFAULTS (tag "tfdefault"): what a user's program gets: TensorFlow's own thread pools, oneDNN as
TensorFlow sets it, Grappler on in the real runs. Probes and op traces still run as written (their
graphs and names must survive); the per-graph correction is fitted to untraced steps with Grappler
on, so the whole-step effect of its rewrites (measured: the remapper makes the zoo transformer's
step 2.4x slower here) reaches the prediction.

A `LocalSetup` is P local processes with n virtual CPU devices each, run by one client (the chief
drives every step) or as between-graph tasks (each process drives its own part of every step
through its own in-process server, as under TF_CONFIG); a `SetupRunner` opens sessions on one, in
this process or on its `local_servers`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, NotRequired, TypedDict

from tag_tf.errors import ProfileError

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

    from tag_tf.runtime.cluster import ClusterSpec
    from tag_tf.topology.spec import Topology

log = logging.getLogger(__name__)

TIMEOUT_MS = 60_000
RUNTIME_KEYS = ("TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_ENABLE_ONEDNN_OPTS")


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How the processes of a setup run TensorFlow (see the module docstring)."""

    tag: str                              # part of every ProfileDB key of what is measured under it
    threads: int | None                   # inter- and intra-op threads of a process that runs ops (None: TF's)
    server_inter_op_threads: int | None   # inter-op threads of server processes (None: TF's)
    onednn: bool | None                   # TF_ENABLE_ONEDNN_OPTS (None: TensorFlow's default)
    grappler: bool                        # graph optimizations in real runs (probes and traces never)

    @property
    def one_op_at_a_time(self) -> bool:
        """One inter-op thread: a process runs its devices' ops one at a time (TF's own pools run
        them side by side)."""
        return self.threads == 1

    @property
    def env(self) -> dict[str, str]:
        """The environment a process of this runtime starts with (unset keys: TensorFlow's default)."""
        env = {}
        if self.threads:
            env["TF_NUM_INTEROP_THREADS"] = env["TF_NUM_INTRAOP_THREADS"] = str(self.threads)
        if self.onednn is not None:
            env["TF_ENABLE_ONEDNN_OPTS"] = "1" if self.onednn else "0"
        return env

    def server_env(self) -> dict[str, str]:
        env = self.env
        if self.server_inter_op_threads:
            env["TF_NUM_INTEROP_THREADS"] = str(self.server_inter_op_threads)
        return env


PINNED = Runtime("t1s2-eigen", threads=1, server_inter_op_threads=2, onednn=False, grappler=False)
TF_DEFAULTS = Runtime("tfdefault", threads=None, server_inter_op_threads=None, onednn=None, grappler=True)
RUNTIMES = {r.tag: r for r in (PINNED, TF_DEFAULTS)}

# The pinned runtime's figures, named as before (benchmarks record them).
THREADS = 1
RUNTIME_TAG = PINNED.tag
RUNTIME_ENV = PINNED.env


def _apply_env(env: dict[str, str]) -> None:
    for key in RUNTIME_KEYS:
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)


def configure_runtime(runtime: Runtime = PINNED) -> bool:
    """Set `runtime`'s environment for this process and the server processes it starts (they
    inherit it; keys the runtime leaves to TensorFlow are unset). Must run before TensorFlow is
    imported (oneDNN) and before its first session (thread pools are created once per process).
    Returns False, and logs a warning, when TensorFlow was imported already: the setting may then
    not apply to this process."""
    _apply_env(runtime.env)
    if "tensorflow" in sys.modules:
        log.warning("configure_runtime: TensorFlow is already imported; this process may keep "
                    "oneDNN and its thread pool sizes")
        return False
    return True


@contextlib.contextmanager
def local_servers(processes: int, devices_per_process: int, runtime: Runtime = PINNED) -> Iterator[ClusterSpec]:
    """`runtime.cluster.local_cluster` whose servers run `runtime`'s server environment. Yields the
    ClusterSpec."""
    from tag_tf.runtime.cluster import local_cluster

    saved = {k: os.environ.get(k) for k in RUNTIME_KEYS}
    _apply_env(runtime.server_env())
    cluster = local_cluster(processes, devices_per_process, timeout_ms=TIMEOUT_MS)
    try:
        spec, _ = cluster.__enter__()          # the servers start here, with this environment
    finally:
        _apply_env({k: v for k, v in saved.items() if v is not None})
    try:
        yield spec
    finally:
        cluster.__exit__(None, None, None)


def session_config(num_cpus: int = 1, *, leader: str | None = None, timeout_ms: int = TIMEOUT_MS,
                   runtime: Runtime = PINNED, as_written: bool = True) -> ConfigProto:
    """ConfigProto of the local model's sessions: `num_cpus` virtual CPU devices, `runtime`'s threads,
    an operation timeout and the collective group leader for cluster sessions
    (`tag_tf.runtime.sessions.session_config` with these settings). `as_written` (the default, for
    probes and traces): no Grappler, folding or CSE; False: the runtime's own graph optimizations."""
    from tag_tf.runtime.sessions import session_config as runtime_session_config

    return runtime_session_config(num_cpus, timeout_ms=timeout_ms, collective_leader=leader,
                                  inter_op_threads=runtime.threads, intra_op_threads=runtime.threads,
                                  as_written=as_written or not runtime.grappler)


# ---------------------------------------------------------------------------------------------
# Setups
# ---------------------------------------------------------------------------------------------
class SetupDict(TypedDict):
    """A LocalSetup as the ProfileDB stores it (older entries lack the runtime and between_graph)."""

    processes: int
    devices_per_process: int
    runtime: NotRequired[str]
    between_graph: NotRequired[bool]


@dataclasses.dataclass(frozen=True)
class LocalSetup:
    """`processes` TensorFlow processes on this machine with `devices_per_process` CPU devices each,
    run by `runtime`; `between_graph`: every process drives its own part of each step (TF_CONFIG
    tasks), else one client drives them all."""

    processes: int = 1
    devices_per_process: int = 1
    runtime: Runtime = PINNED
    between_graph: bool = False

    def __post_init__(self) -> None:
        if self.processes < 1 or self.devices_per_process < 1:
            raise ProfileError(f"local setup: need >= 1 process and device, got {self}")
        if self.between_graph and self.processes < 2:
            raise ProfileError(f"local setup: between-graph needs >= 2 processes, got {self}")

    def to_dict(self) -> SetupDict:
        return {"processes": self.processes, "devices_per_process": self.devices_per_process,
                "runtime": self.runtime.tag, "between_graph": self.between_graph}

    @classmethod
    def from_dict(cls, d: SetupDict) -> LocalSetup:
        tag = d.get("runtime", PINNED.tag)
        if tag not in RUNTIMES:
            raise ProfileError(f"local setup: unknown runtime {tag!r} (known: {', '.join(RUNTIMES)})")
        return cls(int(d["processes"]), int(d["devices_per_process"]), RUNTIMES[tag], bool(d.get("between_graph")))

    @property
    def num_devices(self) -> int:
        return self.processes * self.devices_per_process

    @property
    def name(self) -> str:
        return f"{self.processes}proc-{self.devices_per_process}cpu" + ("-tasks" if self.between_graph else "")

    def topology(self) -> Topology:
        """The simulator's topology: `local:N` (one process) or `cpu_topology(P, n)`."""
        if self.processes == 1:
            from tag_tf.topology.load import load_topology

            return load_topology(f"local:{self.devices_per_process}")
        from tag_tf.runtime.cluster import cpu_topology

        return cpu_topology(self.processes, self.devices_per_process)

    def device_names(self, job: str = "worker") -> list[str]:
        """TF device names in topology order (what DeviceMap.local_cpus / for_topology give)."""
        if self.processes == 1:
            return [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(self.devices_per_process)]
        return [f"/job:{job}/replica:0/task:{t}/device:CPU:{i}"
                for t in range(self.processes) for i in range(self.devices_per_process)]


class SetupRunner:
    """Sessions on one setup: in this process, or on a cluster of local servers (started here)."""

    def __init__(self, setup: LocalSetup, cluster_spec: ClusterSpec | None = None):
        self.setup = setup
        self.spec = cluster_spec
        self.devices = setup.device_names(cluster_spec.job if cluster_spec else "worker")

    def session(self, graph: tf.Graph) -> tf.compat.v1.Session:
        import tensorflow as tf

        runtime = self.setup.runtime
        if self.spec is None:
            return tf.compat.v1.Session(graph=graph, config=session_config(self.setup.devices_per_process,
                                                                           runtime=runtime))
        return tf.compat.v1.Session(self.spec.target, graph=graph,
                                    config=session_config(self.setup.devices_per_process, leader=self.spec.leader,
                                                          runtime=runtime))
