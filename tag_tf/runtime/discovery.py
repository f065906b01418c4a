"""What each server of a running cluster offers, reported by the server itself.

Every tag_tf server (`tag-tf server`, and each task under `TF_CONFIG` or a ClusterResolver)
publishes what its process sees once it listens: host name, CPU devices and cores, and each GPU's
CUDA name and memory, as a JSON string in a resource variable on its own CPU (shared by name across
sessions, like the end-of-run queue); the chief's `gather` reads them all. The topology built from
them, with measured links, is `measure.links`.
"""
from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from tag_tf.context import EMULATED_HOST_ENV
from tag_tf.errors import ClusterError
from tag_tf.runtime.sessions import session_config

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

VARIABLE = "tag_tf_devices"


class Cluster(Protocol):
    """What `gather` reads a cluster through: a `runtime.cluster.ClusterSpec` (which imports this
    module to publish, hence the protocol)."""

    @property
    def tasks(self) -> tuple[str, ...]: ...

    @property
    def job(self) -> str: ...

    @property
    def target(self) -> str: ...

    def session_config(self, *, timeout_ms: int | None = None, device_filters: Sequence[str] = ()) -> ConfigProto: ...


def describe_here(cpus_per_task: int) -> dict:
    """What this process's server offers: host, CPU devices and cores (those it may run on, and the
    cgroups that limit them: a changed quota or cpuset is another host), GPUs (CUDA name, memory)."""
    import tensorflow as tf

    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        try:
            details = tf.config.experimental.get_device_details(device)
        except Exception:       # details are best-effort; the device is still there
            details = {}
        gpus.append({"name": details.get("device_name", ""), "memory_bytes": details.get("memory_limit")})
    return {"host": os.environ.get(EMULATED_HOST_ENV) or socket.gethostname(), "cpu_devices": int(cpus_per_task),
            "cpu_cores": os.cpu_count() or 1, "cpu_affinity": len(os.sched_getaffinity(0)),
            "cgroups": _cgroups(), "gpus": gpus}


def _cgroups() -> str:
    """This process's cpu and cpuset cgroups, as /proc/self/cgroup names them ("" where unknown)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        return ""
    return ";".join(f"{parts[1]}={parts[2]}" for parts in lines
                    if len(parts) == 3 and {"cpu", "cpuset"} & set(parts[1].split(",")))


def _handle(device: str) -> tf.Tensor:
    import tensorflow as tf

    with tf.device(device):
        return tf.raw_ops.VarHandleOp(dtype=tf.string, shape=[], shared_name=VARIABLE, container="")


def publish(target: str, job: str, task: int, description: dict, timeout_ms: int = 30_000) -> None:
    """Store `description` on this task's own CPU, where the chief's `gather` reads it."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        assign = tf.raw_ops.AssignVariableOp(resource=_handle(_cpu(job, task)),
                                             value=tf.constant(json.dumps(description, sort_keys=True)))
    config = session_config(None, timeout_ms=timeout_ms, soft_placement=False,
                            device_filters=[f"/job:{job}/task:{task}"])
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
        sess.run(assign)


def gather(spec: Cluster, timeout_ms: int = 30_000, settle_s: float = 3.0) -> list[dict | None]:
    """Each task's published description (None for a task that published none). A task whose port
    is open may still be publishing (launchers start every task at once): it gets `settle_s`."""
    return [_read_description(spec, task, timeout_ms, settle_s) for task in range(len(spec.tasks))]


def _read_description(spec: Cluster, task: int, timeout_ms: int, settle_s: float) -> dict | None:
    import tensorflow as tf

    config = spec.session_config(timeout_ms=timeout_ms,
                                 device_filters=sorted({f"/job:{spec.job}/task:0", f"/job:{spec.job}/task:{task}"}))
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(_cpu(spec.job, task)):
            read = tf.raw_ops.ReadVariableOp(resource=_handle(_cpu(spec.job, task)), dtype=tf.string)
    deadline = time.monotonic() + settle_s
    with tf.compat.v1.Session(spec.target, graph=graph, config=config) as sess:
        while True:
            try:
                return json.loads(sess.run(read))
            except (tf.errors.FailedPreconditionError, tf.errors.NotFoundError):     # nothing written there
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.2)
            except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as e:
                raise ClusterError(f"cluster: task {task} ({spec.tasks[task]}) did not answer while its devices "
                                   f"were read ({type(e).__name__})") from None


def _cpu(job: str, task: int) -> str:
    return f"/job:{job}/replica:0/task:{task}/device:CPU:0"
