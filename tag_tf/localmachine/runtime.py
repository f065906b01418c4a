"""How the local machine model runs TensorFlow: runtime settings, setups and their sessions.

Runtime configuration (`configure_runtime` before TensorFlow is imported, `session_config` for
every session; the profile, the measurements and the real runs all use it; RUNTIME_TAG names it in
every ProfileDB key):
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

A `LocalSetup` is P local processes with n virtual CPU devices each; a `SetupRunner` opens sessions
on one, in this process or on its `local_servers`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Iterator

from tag_tf.errors import ProfileError

if TYPE_CHECKING:
    from tag_tf.topology.spec import Topology

log = logging.getLogger(__name__)

THREADS = 1                  # inter-op and intra-op threads of a process that runs the strategy itself
SERVER_INTER_OP_THREADS = 2  # inter-op threads of local server processes (see the module docstring)
RUNTIME_TAG = f"t{THREADS}s{SERVER_INTER_OP_THREADS}-eigen"             # part of every ProfileDB key
TIMEOUT_MS = 60_000


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
    timeout, and the collective group leader for cluster sessions (`tag_tf.runtime.sessions.session_config`
    with these settings)."""
    from tag_tf.runtime.sessions import session_config as runtime_session_config

    return runtime_session_config(num_cpus, timeout_ms=timeout_ms, collective_leader=leader,
                                  inter_op_threads=THREADS, intra_op_threads=THREADS, as_written=True)


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
