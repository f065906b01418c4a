"""Tasks that come back into an elastic run (the chief's side, and the returning task's).

A task restarted with its `TF_CONFIG` while a run is in progress (`find_running`: the first other
task answering whose first server is marked running) announces itself (`Membership.hello`) and waits
for the chief's word (`rejoin`). The chief's `Returns` reads announcements in a thread, asks the
simulator whether the run is faster with the task (the same strategy planned for the larger set of
machines against the plan running now) and either tells it the run goes on without it or announces a
membership change: before its next step it puts a word in every member's change queue, which each
member's step reads once its collectives are done (`TaskStep.change_pending`), so every member ends
that same step and then agrees on the next generation as after a loss, the task that came back among
them. That task starts its script from the variables the chief sends it (`Distribution` writes them
into its session after the script's initialisation or restore), so its loop resumes at the run's step.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Protocol

from tag_tf.errors import ClusterError
from tag_tf.runtime.cluster import ClusterSpec
from tag_tf.runtime.membership import Decision, Membership, Report, next_address

if TYPE_CHECKING:
    import numpy as np

    from tag_tf.frontend.program import Runner
    from tag_tf.runtime.roles import Role


class Run(Protocol):
    """What `Returns` reads of the chief's `frontend.elastic.Elastic`."""

    memberships: dict[int, Membership]
    members: tuple[int, ...]
    parts: tuple[int, ...]
    generation: int
    role: Role

    @property
    def me(self) -> int: ...

    def judge(self, runner: Runner, machines: tuple[int, ...]) -> float: ...

log = logging.getLogger("tag_tf.distribute")

POLL_S = 0.5
WAIT_S = 600.0          # how long a task that came back waits for the chief's word


class Returns:
    """On the chief of an elastic run: tasks that came back, and the changes that take them in."""

    def __init__(self, elastic: Run):
        self.elastic = elastic
        self._lock = threading.Lock()
        self._joining: dict[int, Report] = {}
        self._announced = False
        self._runner: Runner | None = None
        self._sender: tuple[object, object, list[object]] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="tag_tf elastic returns", daemon=True)
        self._thread.start()

    def watch(self, runner: Runner) -> None:
        """A new generation's runner: announce changes before its steps, to its members."""
        self._runner = runner
        runner.before_step = self._announce
        self._sender = _change_sender(self.elastic.role)

    def stop(self) -> None:
        self._stopped.set()

    def take(self) -> dict[int, Report]:
        """The tasks to take in at this change (the chief's `_agree`)."""
        with self._lock:
            joining, self._joining, self._announced = self._joining, {}, False
        return joining

    def _announce(self, runner: Runner) -> None:
        with self._lock:
            if not self._joining or self._announced or self._sender is None:
                return
            names = ", ".join(map(str, sorted(self._joining)))
        session, text, enqueues = self._sender
        session.run(enqueues, {text: names})           # type: ignore[attr-defined]  # fails: a loss, recovered
        with self._lock:
            self._announced = True
        log.info("tag_tf: elastic: task(s) %s come back after step %d", names, runner.completed + 1)

    def _listen(self) -> None:
        membership = self.elastic.memberships[self.elastic.me]
        while not self._stopped.wait(POLL_S):
            try:
                hellos = membership.hellos()
                for report in hellos:
                    if report.task not in self.elastic.members:
                        self._consider(report, membership)
            except Exception:                   # noqa: BLE001 (listening goes on; the run is not this thread's)
                log.debug("tag_tf: elastic: reading announcements failed", exc_info=True)

    def _consider(self, report: Report, membership: Membership) -> None:
        e, runner = self.elastic, self._runner
        if runner is None:
            return
        machines = (*e.parts, report.task)
        now, larger = e.judge(runner, e.parts), e.judge(runner, machines)
        if math.isnan(larger) or not (math.isnan(now) or larger < now):
            membership.decide(Decision(e.generation + 1, stop=(
                f"elastic: the run goes on without task {report.task}: {larger * 1e3:.1f} ms per step simulated with "
                f"it, {now * 1e3:.1f} ms without")), [report.task])
            log.info("tag_tf: elastic: task %d came back; the run goes on without it (%.1f ms per step simulated "
                     "with it, %.1f ms without)", report.task, larger * 1e3, now * 1e3)
            return
        log.info("tag_tf: elastic: task %d came back: %.1f ms per step simulated with it, %.1f ms without; it joins "
                 "at the next step", report.task, larger * 1e3, now * 1e3)
        with self._lock:
            self._joining[report.task] = report


def _change_sender(role: Role) -> tuple[object, object, list[object]]:
    """A session on this generation's chief that puts a word in every member's change queue (opened
    now, while every member answers)."""
    import tensorflow as tf

    from tag_tf.compiler.atomic import CHANGE_QUEUE

    graph = tf.Graph()
    spec = role.spec
    with graph.as_default():
        text = tf.compat.v1.placeholder(tf.string, [])
        enqueues, sizes = [], []
        for t in range(len(spec.tasks)):
            with tf.device(f"/job:{spec.job}/replica:0/task:{t}/device:CPU:0"):
                queue = tf.queue.FIFOQueue(16, [tf.string], shapes=[[]], shared_name=CHANGE_QUEUE,
                                           name=f"change_{t}")
                enqueues.append(queue.enqueue(text))
                sizes.append(queue.size())
    config = spec.session_config(timeout_ms=10_000, device_filters=[f"/job:{spec.job}/task:{t}"
                                                                     for t in range(len(spec.tasks))])
    session = tf.compat.v1.Session(spec.target_of(role.task), graph=graph, config=config)
    session._tag_tf_internal = True
    session.run(sizes)              # created now (see above)
    return session, text, enqueues


def find_running(role: Role, server_target: str) -> tuple[int, Membership] | None:
    """A run in progress that this task (just started, with its TF_CONFIG) comes back into: the first
    other task answering whose first server is marked running, unless this task's own plan queue
    holds the chief's first plan (then it is a task of the run's first start, late to look)."""
    from tag_tf.runtime import roles

    for t in range(len(role.spec.tasks)):
        if t == role.task or ClusterSpec((role.spec.tasks[t],), role.spec.job).unreachable(timeout_s=0.5):
            continue
        try:
            membership = Membership(roles.Role(role.spec, role.task, t), server_target)
            if not membership.running():
                continue
        except ClusterError as e:       # a task still starting (or going): not the anchor of a run
            log.debug("tag_tf: elastic: task %d does not say whether a run is in progress: %s", t, e)
            continue
        return None if roles.plan_waiting(role, server_target) else (t, membership)
    return None


def rejoin(role: Role, anchor: int, membership: Membership) -> tuple[Decision, dict[str, np.ndarray]]:
    """This task, come back: announce it to the run's chief (task `anchor`) and wait for its word;
    the decision that takes it in and the variables to start from. SystemExit(0) where the run goes
    on without it or ends first."""
    me = role.task
    membership.drain()          # words left for this task's earlier life
    membership.hello(Report(me, -1, 0, next_address(role.spec.tasks[me])))
    log.warning("tag_tf: elastic: task %d comes back into the run in progress (its chief: task %d, %s)", me, anchor,
                role.spec.tasks[anchor])
    try:
        decision = membership.decision(0, WAIT_S)
    except ClusterError as e:
        log.warning("tag_tf: elastic: task %d: the run ended before it could come back (%s)", me, e)
        raise SystemExit(0) from None
    if decision.stop:
        log.warning("tag_tf: %s", decision.stop)
        raise SystemExit(0)
    return decision, membership.welcomed(WAIT_S)


__all__ = ["Returns", "find_running", "rejoin"]
