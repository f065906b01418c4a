"""The ecosystem's cluster conventions: `TF_CONFIG` and `ClusterResolver`s, one script on every task.

Kubernetes TFJob operators, managed training services and SLURM start the *same* script on every
task, each told its role (`TF_CONFIG` = {"cluster": {"chief": [...], "worker": [...]}, "task":
{"type": ..., "index": ...}}, or a resolver). tag_tf maps that onto its own cluster: machine i is
the i-th task in the order chief, workers, parameter servers (evaluators take no part), every task
runs a TensorFlow server, and

- the chief (the "chief" task, else worker 0) plans, compiles and drives the run, as with a
  cluster file;
- every other task serves until the chief says the run is over, then its `distribute` ends the
  process with status 0 (as Estimator turns `ps` tasks into servers). A chief that disappears is
  named, and the task exits with status 1 instead of waiting forever.

The end-of-run signal is a queue on each task's own CPU, shared by name across sessions: the
chief enqueues one token on every task when it leaves `distribute`. A second queue carries the
chief's word on each graph it compiles (`send_plan` / `wait_for_plan`): its plan, so that every task
compiles the same graph and drives its own part of each step (between-graph execution), or that the
chief drives every step itself and the task only serves.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from tag_tf.errors import ClusterError, tf_reason
from tag_tf.runtime.cluster import DEFAULT_TIMEOUT_MS, TRUST_WARNING, ClusterSpec
from tag_tf.runtime.discovery import describe_here, publish
from tag_tf.runtime.plan_message import PlanMessage
from tag_tf.runtime.sessions import close_within

if TYPE_CHECKING:
    from tensorflow import Operation, Tensor
    from tensorflow.compat.v1 import Session
    from tensorflow.core.protobuf.config_pb2 import ConfigProto
    from tensorflow.distribute import Server
    from tensorflow.distribute.cluster_resolver import ClusterResolver
    from tensorflow.queue import FIFOQueue

ROLE_ORDER = ("chief", "master", "worker", "ps")     # machine order; "evaluator" takes no part
DONE_QUEUE = "tag_tf_run_done"
PLAN_QUEUE = "tag_tf_plans"
READY_QUEUE = "tag_tf_ready"          # on the chief: a task has built its part of each step
FINISHED_QUEUE = "tag_tf_finished"    # on the chief: a task's script has ended
READY_DEADLINE_S = 600.0              # a task's analysis and compilation after the plan arrives
FINISH_DEADLINE_S = 300.0
CHIEF_GRACE_S = 30.0          # how long a task tolerates an unreachable chief ($TAG_TF_CHIEF_GRACE_S)
POLL_S = 2.0


@dataclasses.dataclass(frozen=True)
class Role:
    spec: ClusterSpec            # the whole cluster, task i = machine i
    task: int                    # this process's machine
    chief: int = 0               # the machine that drives the run

    @property
    def is_chief(self) -> bool:
        return self.task == self.chief


def from_cluster_dict(cluster: Mapping[str, object], task_type: str, task_index: int, *, where: str,
                      cpus_per_task: int = 1, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Role:
    """The Role of task (`task_type`, `task_index`) in a TF cluster dict (ClusterError for an evaluator:
    running the training script there would train a copy of its own)."""
    if not isinstance(cluster, Mapping) or not cluster:
        raise ClusterError(f"{where}: 'cluster' must map job names to lists of host:port")
    unknown = [job for job in cluster if job not in ROLE_ORDER + ("evaluator",)]
    if unknown:
        raise ClusterError(f"{where}: job {unknown[0]!r} is not one of {', '.join(ROLE_ORDER + ('evaluator',))}")
    tasks: list[str] = []
    first: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for job in (*ROLE_ORDER, "evaluator"):
        listed = cluster.get(job) or []
        if isinstance(listed, Mapping):        # sparse form {index: address}
            listed = [listed[k] for k in sorted(listed, key=int)]
        if not isinstance(listed, (list, tuple)):
            raise ClusterError(f"{where}: cluster.{job} must be a list of 'host:port', got {listed!r}")
        addresses: list[str] = []
        for i, address in enumerate(listed):
            if not isinstance(address, str) or ":" not in address:
                raise ClusterError(f"{where}: cluster.{job}[{i}] must be 'host:port', got {address!r}")
            addresses.append(address)
        sizes[job] = len(addresses)
        if job != "evaluator":
            first[job] = len(tasks)
            tasks.extend(addresses)
    if task_type == "evaluator":
        raise ClusterError(f"{where}: this task is an evaluator, which takes no part in training: run evaluation "
                           f"without tag_tf.distribute (or without TF_CONFIG naming it)")
    if task_type not in first or not 0 <= task_index < sizes[task_type]:
        raise ClusterError(f"{where}: task {task_type}:{task_index} is not in the cluster "
                           f"({', '.join(f'{j}: {sizes[j]}' for j in ROLE_ORDER if sizes[j])})")
    if not tasks:
        raise ClusterError(f"{where}: the cluster has no chief or worker tasks")
    spec = ClusterSpec(tuple(tasks), "worker", cpus_per_task, timeout_ms)
    return Role(spec, first[task_type] + task_index, 0)


def from_tf_config(text: str | None = None, *, cpus_per_task: int = 1, timeout_ms: int = DEFAULT_TIMEOUT_MS
                   ) -> Role | None:
    """The Role described by `TF_CONFIG` (or `text`); None when it is unset or names one task only."""
    text = os.environ.get("TF_CONFIG") if text is None else text
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(f"TF_CONFIG is not JSON ({e})") from None
    if not isinstance(data, Mapping):
        raise ClusterError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster, task = data.get("cluster"), data.get("task") or {}
    if not cluster:
        return None
    if not isinstance(task, Mapping) or "type" not in task:
        raise ClusterError("TF_CONFIG: field 'task' must give this process's 'type' (and 'index')")
    index = task.get("index", 0)
    if not isinstance(index, int):
        raise ClusterError(f"TF_CONFIG: task.index must be an integer, got {index!r}")
    if not isinstance(cluster, Mapping):
        raise ClusterError("TF_CONFIG: 'cluster' must map job names to lists of host:port")
    role = from_cluster_dict(cluster, str(task["type"]), index, where="TF_CONFIG", cpus_per_task=cpus_per_task,
                             timeout_ms=timeout_ms)
    if role is not None and len(role.spec.tasks) == 1:
        return None                                    # a cluster of one: nothing to distribute over
    return role


def from_resolver(resolver: ClusterResolver, *, cpus_per_task: int = 1, timeout_ms: int = DEFAULT_TIMEOUT_MS
                  ) -> Role | None:
    """The Role of this process from a `tf.distribute.cluster_resolver.ClusterResolver`."""
    cluster = resolver.cluster_spec().as_dict()
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None:
        raise ClusterError(f"{type(resolver).__name__}: no task type for this process (set task_type/task_id)")
    return from_cluster_dict(cluster, str(task_type), int(task_id or 0), where=type(resolver).__name__,
                             cpus_per_task=cpus_per_task, timeout_ms=timeout_ms)


def is_resolver(obj: object) -> bool:
    return all(hasattr(obj, a) for a in ("cluster_spec", "task_type", "task_id"))


# ---------------------------------------------------------------------------------------------
# Serving and ending a run
# ---------------------------------------------------------------------------------------------
# A TensorFlow server cannot be stopped and holds its port for the life of the process, so a task
# joins its cluster once: later `distribute` contexts in the same process (a decorated function
# called twice, Estimator train then predict) reuse it, and the chief ends the run when its process
# ends. This registry is process state by nature, not configuration.
_JOINED: dict[tuple[tuple[str, ...], int], Server] = {}
# Clusters whose chief has told its tasks to serve (they never listen for another plan).
_CHIEF_DRIVEN: set[tuple[str, ...]] = set()
_SERVING_AT_EXIT: dict[tuple[tuple[str, ...], int], bool] = {}
_BETWEEN_GRAPH: set[tuple[str, ...]] = set()
_TOKEN_SENDERS: dict[tuple[tuple[str, ...], int, str], tuple[Session, Operation]] = {}
_PLAN_SENDERS: dict[tuple[str, ...], tuple[Session, Tensor, dict[int, Operation]]] = {}
# Generations an elastic run has replaced (their servers' collectives failed): their exit duties
# passed to the next generation's role.
_SUPERSEDED: set[tuple[str, ...]] = set()


def chief_drives(role: Role) -> bool:
    return role.spec.tasks in _CHIEF_DRIVEN


def set_chief_drives(role: Role) -> None:
    _CHIEF_DRIVEN.add(role.spec.tasks)


def serve_at_exit(role: Role, server: Server) -> None:
    """A task that runs the script too tells the chief when its script ends and keeps serving until
    the chief ends the run (the chief may still read this task's variables); the process then exits
    with that status. Not after `abandon_serving`: a failed task's server goes with it, so the chief
    names it instead of waiting on it."""
    key = (role.spec.tasks, role.task)
    if key in _SERVING_AT_EXIT:
        return
    _SERVING_AT_EXIT[key] = True

    def serve() -> None:
        if not _SERVING_AT_EXIT.get(key):
            return
        with contextlib.suppress(ClusterError):       # the chief is gone: serve_until_done says so
            tell_chief(role, FINISHED_QUEUE)
        code = serve_until_done(role, server)
        if code:
            sys.stdout.flush()
            os._exit(code)
    atexit.register(serve)


def serves_at_exit(role: Role) -> bool:
    return bool(_SERVING_AT_EXIT.get((role.spec.tasks, role.task)))


def abandon_serving(role: Role) -> None:
    key = (role.spec.tasks, role.task)
    if key in _SERVING_AT_EXIT:
        _SERVING_AT_EXIT[key] = False


def set_between_graph(role: Role) -> None:
    """On the chief: some task drives its own steps; at exit, wait for each to finish its script."""
    _BETWEEN_GRAPH.add(role.spec.tasks)


def join(role: Role) -> Server:
    """This task's server, started on first use; on the chief, `end_run` is registered for exit."""
    key = (role.spec.tasks, role.task)
    if key not in _JOINED:
        _JOINED[key] = start_server(role)
        if role.is_chief:
            atexit.register(_end_at_exit, role)
    return _JOINED[key]


def supersede(old: Role) -> None:
    """An elastic run's next generation replaces `old` (`frontend.elastic`): at exit the chief no longer
    waits for the old generation's scripts (only tells the tasks still serving it that the run is
    over), and this task no longer serves it (the next generation's `join` and `serve_at_exit` take
    both over)."""
    _SUPERSEDED.add(old.spec.tasks)    # at exit the chief only tells the old generation's idle tasks it is over
    abandon_serving(old)


def joined(role: Role) -> bool:
    """Whether this process already serves `role` (a later `distribute` context of the same run)."""
    return (role.spec.tasks, role.task) in _JOINED


def _end_at_exit(role: Role) -> None:
    if role.spec.tasks in _BETWEEN_GRAPH and role.spec.tasks not in _SUPERSEDED:
        # Tasks driving their own steps may still read the chief's variables as their scripts end.
        try:
            wait_for_tokens(role, FINISHED_QUEUE, FINISH_DEADLINE_S, "finish its script")
        except ClusterError as e:
            print(f"tag_tf: {e}", file=sys.stderr, flush=True)
    failed = end_run(role)
    if failed:
        print(f"tag_tf: could not tell task(s) {', '.join(map(str, failed))} that the run is over; they exit "
              f"once this chief is gone", file=sys.stderr, flush=True)
def start_server(role: Role) -> Server:
    """This task's TensorFlow server, in this process (every task of a tag_tf cluster runs one)."""
    import tensorflow as tf

    cluster = tf.train.ClusterSpec({role.spec.job: list(role.spec.tasks)})
    server = tf.distribute.Server(cluster, job_name=role.spec.job, task_index=role.task,
                                  config=role.spec.server_config(), start=True)
    print(f"tag_tf: task {role.task} serving on {role.spec.tasks[role.task]}; {TRUST_WARNING}",
          file=sys.stderr, flush=True)
    publish(server.target, role.spec.job, role.task, describe_here(role.spec.cpus_per_task))
    return server


def wait_for_tasks(role: Role, timeout_s: float = 120.0) -> None:
    """On the chief: wait until every task's server accepts connections (launchers start all tasks
    at once, in no particular order); ClusterError naming the missing ones after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        dead = role.spec.unreachable(timeout_s=1.0)
        if not dead:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"task {i} ({role.spec.tasks[i]})" for i in dead)
            raise ClusterError(f"cluster: {names} not reachable after {timeout_s:.0f} s")
        time.sleep(0.5)


def _done_queue(tf: ModuleType, task: int, job: str) -> FIFOQueue:
    with tf.device(f"/job:{job}/replica:0/task:{task}/device:CPU:0"):
        return tf.queue.FIFOQueue(1 << 10, [tf.int32], shapes=[[]], shared_name=DONE_QUEUE, name=DONE_QUEUE)


def _plan_queue(tf: ModuleType, task: int, job: str) -> FIFOQueue:
    with tf.device(f"/job:{job}/replica:0/task:{task}/device:CPU:0"):
        return tf.queue.FIFOQueue(1 << 10, [tf.string], shapes=[[]], shared_name=PLAN_QUEUE, name=PLAN_QUEUE)


def _own_session_config(role: Role, timeout_ms: int) -> ConfigProto:
    # This task's devices only: a session's master otherwise enlists every task of the cluster, and
    # each timed-out poll would then disturb the chief's steps running there.
    return role.spec.session_config(timeout_ms=timeout_ms,
                                    device_filters=[f"/job:{role.spec.job}/replica:0/task:{role.task}"])


def _wait_for_chief(role: Role, server: Server, plans: bool) -> tuple[int, str | None]:
    """Block until the chief ends the run ((0, None)), sends a plan when `plans` ((0, message)),
    or has been unreachable for CHIEF_GRACE_S ((1, None))."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        done = _done_queue(tf, role.task, role.spec.job)
        done_dequeue, done_size = done.dequeue(), done.size()
        plan_queue = _plan_queue(tf, role.task, role.spec.job)
        plan_dequeue, plan_size = (plan_queue.dequeue(), plan_queue.size()) if plans else (None, None)
    grace = float(os.environ.get("TAG_TF_CHIEF_GRACE_S", CHIEF_GRACE_S))
    lost_since: float | None = None
    with tf.compat.v1.Session(server.target, graph=graph, config=_own_session_config(role, int(POLL_S * 1000))) as sess:
        while True:
            try:
                if plan_dequeue is None:
                    sess.run(done_dequeue)
                    return 0, None
                if sess.run(done_size):
                    return 0, None
                # A dequeue that times out may still have taken an element: only dequeue one that is there.
                if sess.run(plan_size):
                    return 0, sess.run(plan_dequeue).decode()
            except tf.errors.DeadlineExceededError:
                pass
            time.sleep(0.05)
            chief = ClusterSpec((role.spec.tasks[role.chief],), role.spec.job)
            if chief.unreachable(timeout_s=1.0):
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > grace:
                    print(f"tag_tf: task {role.task}: the chief (task {role.chief}, {role.spec.tasks[role.chief]}) "
                          f"has been unreachable for {grace:.0f} s; giving up", file=sys.stderr, flush=True)
                    return 1, None
            else:
                lost_since = None


def serve_until_done(role: Role, server: Server) -> int:
    """Block until the chief ends the run (0), or it has been unreachable for CHIEF_GRACE_S (1)."""
    code, _ = _wait_for_chief(role, server, plans=False)
    if code == 0:
        print(f"tag_tf: task {role.task}: the chief ended the run", file=sys.stderr, flush=True)
    return code


def wait_for_plan(role: Role, server: Server) -> tuple[int, PlanMessage | None]:
    """On a task other than the chief: the chief's next plan message ((0, message)); (0, None) when
    the chief ended the run instead, (1, None) when it was lost."""
    code, text = _wait_for_chief(role, server, plans=True)
    return code, None if text is None else PlanMessage.from_json(text)


def plan_waiting(role: Role, server_target: str) -> bool:
    """Whether this task's plan queue holds a message of the chief (on this task's own server)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        size = _plan_queue(tf, role.task, role.spec.job).size()
    with tf.compat.v1.Session(server_target, graph=graph, config=_own_session_config(role, 10_000)) as sess:
        return bool(sess.run(size))


def send_plan(role: Role, message: PlanMessage) -> None:
    """From the chief: `message` to every other task's plan queue; ClusterError naming a task that
    cannot be reached."""
    import tensorflow as tf

    dead = [t for t in role.spec.unreachable() if t != role.chief]
    if dead:
        raise ClusterError(f"cluster: task {dead[0]} ({role.spec.tasks[dead[0]]}) is not reachable; cannot send it the plan")
    if role.spec.tasks not in _PLAN_SENDERS:
        # One session for the life of the process: closing it waits on the other tasks' masters,
        # which are busy with their own steps by then.
        others = [t for t in range(len(role.spec.tasks)) if t != role.chief]
        graph = tf.Graph()
        with graph.as_default():
            text = tf.compat.v1.placeholder(tf.string, [])
            enqueues = {t: _plan_queue(tf, t, role.spec.job).enqueue(text) for t in others}
        config = role.spec.session_config(timeout_ms=30_000, device_filters=[
            f"/job:{role.spec.job}/task:{t}" for t in [role.chief, *others]])
        _PLAN_SENDERS[role.spec.tasks] = (tf.compat.v1.Session(role.spec.target, graph=graph, config=config), text,
                                          enqueues)
    sess, text, enqueues = _PLAN_SENDERS[role.spec.tasks]
    blob = message.to_json()
    for t, op in enqueues.items():
        try:
            sess.run(op, {text: blob})
        except tf.errors.OpError as e:
            raise ClusterError(f"cluster: could not send the plan to task {t} ({role.spec.tasks[t]}): "
                               f"{type(e).__name__}: {tf_reason(e)}") from None


def _token_queue(tf: ModuleType, task: int, job: str, name: str) -> FIFOQueue:
    with tf.device(f"/job:{job}/replica:0/task:{task}/device:CPU:0"):
        return tf.queue.FIFOQueue(1 << 10, [tf.int32], shapes=[[]], shared_name=name, name=name)


def tell_chief(role: Role, queue: str) -> None:
    """From a task other than the chief: put this task's number on the chief's `queue`."""
    import tensorflow as tf

    key = (role.spec.tasks, role.task, queue)
    if key not in _TOKEN_SENDERS:
        graph = tf.Graph()
        with graph.as_default():
            enqueue = _token_queue(tf, role.chief, role.spec.job, queue).enqueue(role.task)
        config = role.spec.session_config(timeout_ms=10_000, device_filters=[
            f"/job:{role.spec.job}/task:{t}" for t in (role.chief, role.task)])
        _TOKEN_SENDERS[key] = (tf.compat.v1.Session(role.spec.target_of(role.task), graph=graph, config=config),
                               enqueue)
    sess, enqueue = _TOKEN_SENDERS[key]
    try:
        sess.run(enqueue)
    except tf.errors.OpError as e:
        raise ClusterError(f"cluster: task {role.task} could not reach the chief (task {role.chief}, "
                           f"{role.spec.tasks[role.chief]}): {type(e).__name__}") from None


def wait_for_tokens(role: Role, queue: str, deadline_s: float, what: str, tasks: Iterable[int] | None = None) -> None:
    """On the chief: wait until every other task (of `tasks`, default all) has put its number on
    `queue`; ClusterError naming a task that died, or the ones that did not `what` within `deadline_s`."""
    import tensorflow as tf

    waiting = {t for t in (range(len(role.spec.tasks)) if tasks is None else tasks) if t != role.chief}
    graph = tf.Graph()
    with graph.as_default():
        q = _token_queue(tf, role.chief, role.spec.job, queue)
        dequeue, size = q.dequeue(), q.size()
    deadline = time.monotonic() + deadline_s
    with tf.compat.v1.Session(role.spec.target_of(role.chief), graph=graph,
                              config=_own_session_config(role, int(POLL_S * 1000))) as sess:
        while waiting:
            while sess.run(size):
                waiting.discard(int(sess.run(dequeue)))
            if not waiting:
                return
            dead = sorted(set(role.spec.unreachable()) & waiting)
            if dead:
                raise ClusterError(f"cluster: task {dead[0]} ({role.spec.tasks[dead[0]]}) died or became unreachable "
                                   f"before it could {what}")
            if time.monotonic() > deadline:
                names = ", ".join(f"task {t} ({role.spec.tasks[t]})" for t in sorted(waiting))
                raise ClusterError(f"cluster: {names} did not {what} within {deadline_s:.0f} s")
            time.sleep(0.1)


def end_run(role: Role) -> list[int]:
    """From the chief: tell every other task the run is over. Returns the tasks that could not be told."""
    import tensorflow as tf

    graph = tf.Graph()
    dead = set(role.spec.unreachable())
    # A session that lists a dead task never gets created (its master waits for every task of its
    # device filters, with no deadline): tell only the tasks that still listen.
    others = [t for t in range(len(role.spec.tasks)) if t != role.chief and t not in dead]
    with graph.as_default():
        enqueues = {t: _done_queue(tf, t, role.spec.job).enqueue(1) for t in others}
    config = role.spec.session_config(timeout_ms=10_000,
                                      device_filters=[f"/job:{role.spec.job}/task:{t}" for t in [role.chief, *others]])
    failed = sorted(dead - {role.chief})
    sess = tf.compat.v1.Session(role.spec.target, graph=graph, config=config)
    try:
        for t, op in enqueues.items():
            try:
                sess.run(op)
            except tf.errors.OpError:
                failed.append(t)
    finally:
        close_within(sess.close, "the end-of-run session")
    return sorted(failed)


__all__ = ["Role", "abandon_serving", "chief_drives", "end_run", "join", "joined", "serve_at_exit", "serves_at_exit",
           "set_between_graph", "set_chief_drives", "supersede", "tell_chief", "wait_for_tokens", "wait_for_tasks", "from_cluster_dict", "from_resolver", "from_tf_config", "is_resolver",
           "plan_waiting", "send_plan", "serve_until_done", "start_server", "wait_for_plan"]
