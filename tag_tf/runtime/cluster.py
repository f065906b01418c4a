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
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator, Sequence

from tag_tf.errors import ClusterError

DEFAULT_TIMEOUT_MS = 60_000


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

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "tasks": list(self.tasks), "cpus_per_task": self.cpus_per_task,
                "timeout_ms": self.timeout_ms}

    @classmethod
    def load(cls, path: str) -> "ClusterSpec":
        import yaml

        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ClusterError(f"{path}: cannot read cluster file ({e.strerror})") from None
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
        return cls(tuple(data["tasks"]), str(data.get("job", "worker")), cpus,
                   int(data.get("timeout_ms", DEFAULT_TIMEOUT_MS)))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    def server_config(self) -> Any:
        import tensorflow as tf

        config = tf.compat.v1.ConfigProto(device_count={"CPU": self.cpus_per_task},
                                          operation_timeout_in_ms=self.timeout_ms, allow_soft_placement=True)
        config.experimental.collective_group_leader = self.leader
        return config

    def session_config(self) -> Any:
        return self.server_config()

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
        return ClusterError(f"cluster: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


def serve(spec: ClusterSpec, task: int) -> None:
    """Run one server of the cluster until killed (the body of `tag-tf server`)."""
    import tensorflow as tf

    if not 0 <= task < len(spec.tasks):
        raise ClusterError(f"--task {task}: the cluster has tasks 0..{len(spec.tasks) - 1}")
    cluster = tf.train.ClusterSpec({spec.job: list(spec.tasks)})
    server = tf.distribute.Server(cluster, job_name=spec.job, task_index=task, config=spec.server_config(),
                                  start=True)
    print(f"tag-tf server: task {task} listening on {spec.tasks[task]}", flush=True)
    server.join()


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@contextlib.contextmanager
def local_cluster(num_tasks: int, cpus_per_task: int = 1, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                  start_timeout_s: float = 60.0) -> Iterator[tuple[ClusterSpec, list[subprocess.Popen]]]:
    """Start `num_tasks` server processes on 127.0.0.1 (`tag-tf server`); stop them by PID on exit."""
    spec = ClusterSpec(tuple(f"127.0.0.1:{p}" for p in free_ports(num_tasks)), "worker", cpus_per_task, timeout_ms)
    tmp = tempfile.mkdtemp(prefix="tag_tf_cluster_")
    path = os.path.join(tmp, "cluster.json")
    spec.save(path)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs: list[subprocess.Popen] = []
    try:
        for i in range(num_tasks):
            log = open(os.path.join(tmp, f"task{i}.log"), "w")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tag_tf.frontend.cli", "server", "--cluster", path, "--task", str(i)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        deadline = time.monotonic() + start_timeout_s
        while spec.unreachable(timeout_s=0.2):
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    raise ClusterError(f"cluster: task {i} exited at start-up (see {tmp}/task{i}.log)")
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster: servers did not start within {start_timeout_s:.0f} s")
            time.sleep(0.2)
        yield spec, procs
    finally:
        stop(procs)


def stop(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def cpu_topology(num_tasks: int, cpus_per_task: int) -> Any:
    """A topology of `num_tasks` machines with `cpus_per_task` CPU devices each (local servers)."""
    from tag_tf.topology.parse import load_topology

    machines = [{"name": f"task{i}", "gpus": f"{cpus_per_task}x cpu", "intra": "local"} for i in range(num_tasks)]
    spec = {"name": f"cpu-{num_tasks}x{cpus_per_task}", "machines": machines}
    if num_tasks > 1:
        spec["inter"] = {"switch": "10Gbps"}
    return load_topology(spec)
