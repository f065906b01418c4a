"""Several machines: one `tf.distribute.Server` per machine, a client session on the chief.

Cluster file (JSON or YAML)::

    job: worker                      # optional, default "worker"
    tasks: ["10.0.0.1:2222", "10.0.0.2:2222"]   # task i = topology machine i
    cpus_per_task: 2                 # optional: virtual CPU devices per server (CPU-only clusters)
    timeout_ms: 60000                # optional: operation timeout of every session

Every server's ConfigProto sets `experimental.collective_group_leader` (cross-process collectives
need it on every server, not only the client) and `operation_timeout_in_ms`, so a mistake fails
with a deadline error instead of hanging.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, TypedDict, cast

from tag_tf.errors import ClusterError, tf_reason
from tag_tf.runtime.sessions import DEFAULT_TIMEOUT_MS, session_config

if TYPE_CHECKING:
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

    from tag_tf.topology.spec import Topology


class ClusterSpecDict(TypedDict):
    """`ClusterSpec.to_dict()`: the cluster file's fields."""

    job: str
    tasks: list[str]
    cpus_per_task: int
    timeout_ms: int


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    tasks: tuple[str, ...]
    job: str = "worker"
    cpus_per_task: int = 1
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    @property
    def leader(self) -> str:
        return f"/job:{self.job}/replica:0/task:0"

    @property
    def target(self) -> str:
        return f"grpc://{self.tasks[0]}"

    def target_of(self, task: int) -> str:
        return f"grpc://{self.tasks[task]}"

    def to_dict(self) -> ClusterSpecDict:
        return {"job": self.job, "tasks": list(self.tasks), "cpus_per_task": self.cpus_per_task,
                "timeout_ms": self.timeout_ms}

    @classmethod
    def load(cls, path: str) -> ClusterSpec:
        import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs

        from tag_tf.datafiles import CLUSTER_FILE_LIMIT, read_text

        text = read_text(path, "cluster file", CLUSTER_FILE_LIMIT, ClusterError)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ClusterError(f"{path}: not valid YAML/JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
            raise ClusterError(f"{path}: field 'tasks' must be a non-empty list of host:port")
        for i, t in enumerate(data["tasks"]):
            if not isinstance(t, str) or ":" not in t:
                raise ClusterError(f"{path}: tasks[{i}] must be 'host:port', got {t!r}")
        cpus = data.get("cpus_per_task", 1)
        if not isinstance(cpus, int) or cpus < 1:
            raise ClusterError(f"{path}: cpus_per_task must be a positive integer")
        timeout = data.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
            raise ClusterError(f"{path}: timeout_ms must be a positive integer (milliseconds), got {timeout!r}")
        job = data.get("job", "worker")
        if not isinstance(job, str) or not job.replace("_", "").isalnum():
            raise ClusterError(f"{path}: job must be a name of letters, digits and '_', got {job!r}")
        unknown = sorted(set(data) - {"tasks", "job", "cpus_per_task", "timeout_ms"})
        if unknown:
            raise ClusterError(f"{path}: unknown field(s) {', '.join(map(repr, unknown))}; known: tasks, job, "
                               f"cpus_per_task, timeout_ms")
        return cls(tuple(data["tasks"]), job, cpus, timeout)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    def server_config(self) -> ConfigProto:
        """The servers' ConfigProto: the sessions' (`session_config`), with at least two inter-op
        threads (`SERVER_INTER_OP_THREADS`)."""
        config = self.session_config()
        config.inter_op_parallelism_threads = server_inter_op_threads()
        return config

    def session_config(self, *, timeout_ms: int | None = None, device_filters: Sequence[str] = ()) -> ConfigProto:
        """The ConfigProto of this cluster's servers and sessions: `cpus_per_task` CPU devices, the
        collective leader, the cluster's timeout (or `timeout_ms`); `device_filters` for a session that
        must only wait for some tasks."""
        return session_config(self.cpus_per_task, timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
                              collective_leader=self.leader, device_filters=device_filters)

    # -- health ---------------------------------------------------------------------------------
    def unreachable(self, timeout_s: float = 1.0) -> list[int]:
        """Tasks whose port does not accept connections."""
        dead = []
        for i, address in enumerate(self.tasks):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=timeout_s):
                    pass
            except OSError:
                dead.append(i)
        return dead

    def check(self) -> None:
        dead = self.unreachable()
        if dead:
            names = ", ".join(f"task {i} ({self.tasks[i]})" for i in dead)
            raise ClusterError(f"cluster: {names} unreachable")

    def explain(self, error: Exception) -> ClusterError:
        """A session error turned into one line naming the dead task(s), if any."""
        dead = self.unreachable()
        if dead:
            names = ", ".join(f"task {i} ({self.tasks[i]})" for i in dead)
            return ClusterError(f"cluster: {names} died or became unreachable ({type(error).__name__})")
        return ClusterError(f"cluster: {type(error).__name__}: {tf_reason(error)}")


READY = "tag-tf server: ready"
TRUST_WARNING = ("anyone who can reach this port can run any code as this user (TensorFlow servers execute "
                 "whatever graph they are sent): keep the cluster on a trusted network")


# A server's executor needs a second inter-op thread: TensorFlow runs the op that a finished op makes
# ready inline and queues the rest, Sends among them, to the inter-op pool. With one thread (a task
# confined to one core: TensorFlow sizes the pool by the cores it may use) a stage's Sends wait until
# its whole chain of ops is done: a pipeline stage passed its micro-batches on all at once, after its
# last forward op (measured on an emulated cluster: the next stage started 250 ms late of 2.3 s).
SERVER_INTER_OP_THREADS = 2


def server_inter_op_threads() -> int:
    """Inter-op threads for a server here: the cores this process may use, at least
    `SERVER_INTER_OP_THREADS`."""
    return max(SERVER_INTER_OP_THREADS, len(os.sched_getaffinity(0)))


def untrusted_addresses(tasks: Sequence[str], unresolved: list[str] | None = None) -> list[str]:
    """Task addresses outside loopback and private ranges (RFC 1918, link-local, IPv6 ULA); a host
    name counts by what it resolves to. Names that do not resolve (yet) go to `unresolved`."""
    import ipaddress

    out = []
    for address in tasks:
        host = address.rpartition(":")[0].strip("[]")
        try:
            ips = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                ips = [ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(host, None)]
            except OSError:
                if unresolved is not None:
                    unresolved.append(address)
                continue
        if not all(ip.is_loopback or ip.is_private or ip.is_link_local for ip in ips):
            out.append(address)
    return out


def check_trusted(spec: ClusterSpec, trusted_network: bool, resolve_timeout_s: float = 60.0) -> None:
    """Refuse a cluster reachable from public addresses unless the user says the network is trusted.
    Peer names that do not resolve yet (Kubernetes creates them as pods start) are retried."""
    if trusted_network:
        return
    deadline = time.monotonic() + resolve_timeout_s
    while True:
        unresolved: list[str] = []
        public = untrusted_addresses(spec.tasks, unresolved)
        if public:
            raise ClusterError(f"cluster address {public[0]} is not loopback or private: a TensorFlow server there "
                               f"would run code sent by anyone who reaches it; pass --trusted-network "
                               f"(trusted_network=True) if this network is yours alone")
        if not unresolved:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"cluster address {unresolved[0]}: the host name does not resolve, so tag_tf cannot "
                               f"tell whether it is on a private network; check the name, or pass --trusted-network "
                               f"(trusted_network=True)")
        time.sleep(1.0)


def serve(spec: ClusterSpec, task: int, parent_pid: int | None = None, trusted_network: bool = False) -> None:
    """Run one server of the cluster until killed (the body of `tag-tf server`). Prints one READY
    line on stdout once listening; with `parent_pid`, exits when that process is gone (servers
    started by a launcher never outlive it)."""
    import tensorflow as tf

    if not 0 <= task < len(spec.tasks):
        raise ClusterError(f"--task {task}: the cluster has tasks 0..{len(spec.tasks) - 1}")
    check_trusted(spec, trusted_network)
    cluster = tf.train.ClusterSpec({spec.job: list(spec.tasks)})
    server = tf.distribute.Server(cluster, job_name=spec.job, task_index=task, config=spec.server_config(),
                                  start=True)
    from tag_tf.runtime.discovery import describe_here, publish

    publish(server.target, spec.job, task, describe_here(spec.cpus_per_task))
    if parent_pid is not None:
        def watchdog() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(0)
        threading.Thread(target=watchdog, daemon=True).start()
    print(f"tag-tf server: task {task} listening on {spec.tasks[task]}; {TRUST_WARNING}", file=sys.stderr, flush=True)
    print(f"{READY} task {task} on {spec.tasks[task]}", flush=True)
    server.join()


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):   # hold them all open so the n ports are distinct
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class LocalCluster:
    """`num_tasks` `tag-tf server` processes on 127.0.0.1 with `cpus_per_task` CPU devices each.

    A context manager: `spec` (ClusterSpec), `target`, `session_config()`, `device(task, index)`;
    the servers are stopped by PID on exit. Start-up waits for each server's READY line and is
    retried with fresh ports (a port we picked can be taken before the server binds it).
    """

    def __init__(self, num_tasks: int, cpus_per_task: int = 1, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 start_timeout_s: float = 120.0, hide_gpus: bool = True):
        if num_tasks < 1 or cpus_per_task < 1:
            raise ClusterError(f"local cluster: need at least one task and one CPU each, got "
                               f"{num_tasks} x {cpus_per_task}")
        self.num_tasks = num_tasks
        self.cpus_per_task = cpus_per_task
        self.timeout_ms = timeout_ms
        self.start_timeout_s = start_timeout_s
        self.hide_gpus = hide_gpus
        self.spec: ClusterSpec | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[str]] = []
        self._keys = itertools.count(1)
        self._dir = ""

    @property
    def running(self) -> ClusterSpec:
        """The spec of the started servers."""
        assert self.spec is not None, "the local cluster is not started"
        return self.spec

    @property
    def target(self) -> str:
        return self.running.target

    def session_config(self) -> ConfigProto:
        return self.running.session_config()

    def device(self, task: int, index: int = 0) -> str:
        return f"/job:{self.running.job}/replica:0/task:{task}/device:CPU:{index}"

    def next_key(self) -> int:
        """A fresh collective key: servers cache collective parameters per key across sessions."""
        return next(self._keys)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            try:
                self._start_once()
                return
            except ClusterError:
                self.stop()
                if attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop()
                raise

    def _start_once(self) -> None:
        self.spec = ClusterSpec(tuple(f"127.0.0.1:{p}" for p in free_ports(self.num_tasks)), "worker",
                                self.cpus_per_task, self.timeout_ms)
        self._dir = tempfile.mkdtemp(prefix="tag_tf_cluster_")
        path = os.path.join(self._dir, "cluster.json")
        self.spec.save(path)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        if self.hide_gpus:          # host tensors over gRPC; leave GPUs to the client
            env["CUDA_VISIBLE_DEVICES"] = "-1"
        for i in range(self.num_tasks):
            log = open(os.path.join(self._dir, f"task{i}.log"), "w+")  # noqa: SIM115 (stop() closes it)
            self._logs.append(log)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "tag_tf.frontend.cli", "server", "--cluster", path, "--task", str(i),
                 "--parent-pid", str(os.getpid())],
                stdout=subprocess.PIPE, stderr=log, env=env))
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        waiting: dict[IO[bytes], int] = {}
        for i, p in enumerate(self.procs):
            assert p.stdout is not None       # started with stdout=PIPE
            waiting[p.stdout] = i
        sel = selectors.DefaultSelector()
        for f in waiting:
            sel.register(f, selectors.EVENT_READ)
        try:
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"local cluster: task(s) {sorted(waiting.values())} not ready after "
                                       f"{self.start_timeout_s:.0f} s (logs in {self._dir})")
                for key, _ in sel.select(timeout=min(left, 1.0)):
                    stream = cast("IO[bytes]", key.fileobj)      # one of the pipes registered above
                    task = waiting.pop(stream)
                    sel.unregister(stream)
                    line = stream.readline().decode(errors="replace").strip()
                    if not line.startswith(READY):
                        raise ClusterError(f"local cluster: task {task} failed to start: {self._tail(task) or line}")
        finally:
            sel.close()

    def _tail(self, task: int) -> str:
        log = self._logs[task]
        log.flush()
        log.seek(0)
        lines = log.read().strip().splitlines()
        return lines[-1] if lines else "no output"

    def stop(self) -> None:
        stop(self.procs)
        for p in self.procs:
            if p.stdout:
                p.stdout.close()
        for log in self._logs:
            log.close()
        self.procs, self._logs = [], []


@contextlib.contextmanager
def local_cluster(num_tasks: int, cpus_per_task: int = 1, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                  start_timeout_s: float = 120.0) -> Iterator[tuple[ClusterSpec, list[subprocess.Popen[bytes]]]]:
    """Start `num_tasks` server processes on 127.0.0.1; yields (spec, processes); stops them by PID."""
    with LocalCluster(num_tasks, cpus_per_task, timeout_ms=timeout_ms, start_timeout_s=start_timeout_s) as c:
        yield c.running, c.procs


def stop(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:          # by PID: the processes we started
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def cpu_topology(num_tasks: int, cpus_per_task: int) -> Topology:
    """A topology of `num_tasks` machines with `cpus_per_task` CPU devices each (local servers)."""
    from tag_tf.topology.load import load_topology

    machines = [{"name": f"task{i}", "gpus": f"{cpus_per_task}x cpu", "intra": "local"} for i in range(num_tasks)]
    spec: dict[str, object] = {"name": f"cpu-{num_tasks}x{cpus_per_task}", "machines": machines}
    if num_tasks > 1:
        spec["inter"] = {"switch": "10Gbps"}
    return load_topology(spec)
