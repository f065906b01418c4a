"""Who trains on after a task is lost: the survivors' rendezvous of an elastic run.

A membership change needs a new generation of servers (a server whose collectives failed fails every
later one, and cannot be stopped), so the survivors must agree on who is left, where each one's new
server listens, and from which step they go on. They agree through queues on the first server (the
one at its `TF_CONFIG` address, alive as long as its process) of the first surviving task, the
anchor: the chief while it lives, else the next task, which becomes the chief. Every task knows
where those servers are. Every message is sent by the task that has something to say (a session on
its own first server, filtered to the anchor and itself, opened at the start while every task
answers), so nothing ever waits for a task that died.

- every survivor puts a `Report` on the anchor's report queue: its generation, the steps it
  completed, the address of its next server;
- the anchor gathers the reports of every task still reachable (a task that does not report within
  the deadline is lost too), decides (`Decision`: members, their addresses, the step to resume from
  and whose copy of the variables holds it; or why the run stops) and puts it on each member's
  decision queue;
- where the anchor is a step ahead of the survivor holding the state to resume from, that survivor
  sends it its variables (`push_state` / `pull_state`).
"""
from __future__ import annotations

import dataclasses
import io
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from tag_tf.errors import ClusterError, tf_reason

if TYPE_CHECKING:
    from tag_tf.runtime.roles import Role

REPORTS = "tag_tf_elastic_reports"
DECISION = "tag_tf_elastic_decision_{task}"
STATE = "tag_tf_elastic_state"
HELLO = "tag_tf_elastic_hello"             # a task that came back announces itself
RUNNING = "tag_tf_elastic_running"         # non-empty on the anchor of a run in progress
WELCOME = "tag_tf_elastic_welcome_{task}"  # the variables a task that came back starts from
POLL_S = 0.02
RETRY_S = 3.0                 # a call the gRPC channel failed is tried again this long
CHIEF_GRACE_S = 10.0          # how long a survivor waits for an unreachable chief's decision
REPORT_DEADLINE_S = 30.0      # how long the chief waits for a reachable task's report


@dataclasses.dataclass(frozen=True)
class Report:
    task: int                 # the task's index in the first generation (its TF_CONFIG task)
    generation: int           # the generation whose step failed
    steps: int                # training steps this task completed (its variables hold their result)
    address: str              # host:port of this task's next server

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls(**json.loads(text))


@dataclasses.dataclass(frozen=True)
class Decision:
    generation: int                     # the new generation
    members: tuple[int, ...] = ()       # first-generation tasks that go on, chief first
    addresses: tuple[str, ...] = ()     # their next servers, in that order
    resume: int = 0                     # the step every member's variables are restored to
    source: int = 0                     # the member whose copy holds that step
    lost: tuple[int, ...] = ()          # first-generation tasks lost in this change
    stop: str = ""                      # non-empty: the run cannot go on, and why
    topology: dict | None = None        # the first generation's topology (for a task that comes back)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Decision:
        data = json.loads(text)
        for key in ("members", "addresses", "lost"):
            data[key] = tuple(data[key])
        return cls(**data)


def next_address(address: str) -> str:
    """host:port for this task's next server: its own host, a port free now."""
    host = address.rpartition(":")[0]
    s = socket.socket()
    try:
        try:
            s.bind((host, 0))
        except OSError:
            s.bind(("", 0))
        return f"{host}:{s.getsockname()[1]}"
    finally:
        s.close()


def encode_values(values: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{f"v{i}": np.asarray(v) for i, v in enumerate(values.values())},
             names=np.array(list(values), dtype=object))
    return buf.getvalue()


def decode_values(blob: bytes) -> dict[str, np.ndarray]:
    data = np.load(io.BytesIO(blob), allow_pickle=True)
    names = list(data["names"])
    return {str(n): data[f"v{i}"] for i, n in enumerate(names)}


class Membership:
    """This process's end of the rendezvous, over the first generation's servers (`anchor`: the
    Role from TF_CONFIG; `server_target`: this process's first server)."""

    def __init__(self, anchor: Role, server_target: str):
        import tensorflow as tf

        self.anchor = anchor
        spec, chief, me = anchor.spec, anchor.chief, anchor.task
        self.graph = tf.Graph()
        with self.graph.as_default(), tf.device(f"/job:{spec.job}/replica:0/task:{chief}/device:CPU:0"):
            def queue(name: str) -> tf.queue.FIFOQueue:
                return tf.queue.FIFOQueue(1 << 10, [tf.string], shapes=[[]], shared_name=name, name=name)
            self._text = tf.compat.v1.placeholder(tf.string, [])
            reports = queue(REPORTS)
            self._report = reports.enqueue(self._text)
            self._reports = (reports.dequeue(), reports.size())
            self._decide = {t: queue(DECISION.format(task=t)).enqueue(self._text) for t in range(len(spec.tasks))
                            if t != chief}
            mine = queue(DECISION.format(task=me))
            self._decision = (mine.dequeue(), mine.size())
            state = queue(STATE)
            self._push, self._state = state.enqueue(self._text), (state.dequeue(), state.size())
            hello = queue(HELLO)
            self._hello, self._hellos = hello.enqueue(self._text), (hello.dequeue(), hello.size())
            running = queue(RUNNING)
            self._mark, self._running = running.enqueue(self._text), running.size()
            self._welcome = {t: queue(WELCOME.format(task=t)).enqueue(self._text) for t in range(len(spec.tasks))
                             if t != chief}
            mine = queue(WELCOME.format(task=me))
            self._welcomed = (mine.dequeue(), mine.size())
        config = spec.session_config(timeout_ms=10_000, device_filters=[
            f"/job:{spec.job}/task:{t}" for t in dict.fromkeys((chief, me))])
        self.session = tf.compat.v1.Session(server_target, graph=self.graph, config=config)
        self.session._tag_tf_internal = True
        # Created now, while the chief answers: a session's creation waits with no deadline for a
        # task its filters name, and the graph is complete (later runs never extend it).
        self._run("reach the chief", self._reports[1])

    def _run(self, what: str, fetches: object, feed: dict | None = None) -> object:
        """`fetches` on the anchor's queues; a connection that fails is tried again for RETRY_S (gRPC
        may fail a call on a channel it is still connecting) before the anchor is named."""
        import tensorflow as tf

        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                return self.session.run(fetches, feed)
            except tf.errors.UnavailableError as e:
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                error: tf.errors.OpError = e
            except tf.errors.OpError as e:
                error = e
            chief = self.anchor.spec.tasks[self.anchor.chief]
            raise ClusterError(f"elastic: could not {what} (the chief, task {self.anchor.chief} at {chief}): "
                               f"{type(error).__name__}: {tf_reason(error)}") from None

    def _poll(self, take: tuple[object, object], what: str, deadline_s: float) -> bytes:
        """The next element of a queue on the chief (dequeued only once it is there); ClusterError once
        `deadline_s` has passed or the chief has been unreachable for CHIEF_GRACE_S."""
        from tag_tf.runtime.cluster import ClusterSpec

        dequeue, size = take
        deadline = time.monotonic() + deadline_s
        chief = ClusterSpec((self.anchor.spec.tasks[self.anchor.chief],), self.anchor.spec.job)
        lost_since: float | None = None
        while True:
            try:
                if self._run(what, size):
                    return cast(bytes, self._run(what, dequeue))
            except ClusterError:
                if not chief.unreachable(timeout_s=0.5):
                    raise
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > CHIEF_GRACE_S:
                    raise ClusterError(f"elastic: the chief (task {self.anchor.chief}, "
                                       f"{self.anchor.spec.tasks[self.anchor.chief]}) is lost; could not {what}"
                                       ) from None
            if time.monotonic() > deadline:
                raise ClusterError(f"elastic: could not {what} within {deadline_s:.0f} s")
            time.sleep(POLL_S)

    # -- a survivor other than the chief ---------------------------------------------------------
    def report(self, report: Report) -> None:
        self._run("report to the chief", self._report, {self._text: report.to_json()})

    def decision(self, generation: int, deadline_s: float) -> Decision:
        """The chief's decision for `generation` (older ones, left from an earlier change, are skipped)."""
        while True:
            found = Decision.from_json(self._poll(self._decision, "hear the chief's decision", deadline_s).decode())
            if found.generation >= generation:
                return found

    def push_state(self, values: Mapping[str, np.ndarray]) -> None:
        self._run("send the chief the variables", self._push, {self._text: encode_values(values)})

    # -- a task that came back ---------------------------------------------------------------------
    def running(self) -> bool:
        """Whether the anchor holds a run in progress (this task then comes back into it)."""
        return bool(self._run("ask whether a run is in progress", self._running))

    def drain(self) -> None:
        """Drop what the anchor holds for this task (decisions and variables of an earlier life)."""
        for dequeue, size in (self._decision, self._welcomed):
            while self._run("read what the chief left", size):
                self._run("drop what the chief left", dequeue)

    def hello(self, report: Report) -> None:
        self._run("announce this task", self._hello, {self._text: report.to_json()})

    def welcomed(self, deadline_s: float) -> dict[str, np.ndarray]:
        return decode_values(self._poll(self._welcomed, "receive the variables to start from", deadline_s))

    # -- the chief --------------------------------------------------------------------------------
    def mark_running(self) -> None:
        if not self.running():
            self._run("mark the run in progress", self._mark, {self._text: "1"})

    def hellos(self) -> list[Report]:
        """Announcements of tasks that came back, each taken once."""
        out = []
        while self._run("read the announcements", self._hellos[1]):
            out.append(Report.from_json(cast(bytes, self._run("read an announcement", self._hellos[0])).decode()))
        return out

    def welcome(self, task: int, values: Mapping[str, np.ndarray]) -> None:
        self._run(f"send task {task} the variables", self._welcome[task], {self._text: encode_values(values)})

    def gather(self, generation: int, expected: Sequence[int], alive: Callable[[int], bool],
               deadline_s: float = REPORT_DEADLINE_S
               ) -> dict[int, Report]:
        """Reports for `generation` from the tasks `expected`; returns once each has reported or, by
        `alive(task)`, is no longer reachable, or at the deadline."""
        waiting, got = set(expected), dict[int, Report]()
        deadline = time.monotonic() + deadline_s
        while waiting and time.monotonic() < deadline:
            while self._run("read the survivors' reports", self._reports[1]):
                report = Report.from_json(cast(bytes, self._run("read a report", self._reports[0])).decode())
                if report.generation == generation and report.task in waiting:
                    got[report.task] = report
                    waiting.discard(report.task)
            for t in sorted(waiting):
                if not alive(t):
                    waiting.discard(t)
            if waiting:
                time.sleep(POLL_S)
        return got

    def decide(self, decision: Decision, tasks: Sequence[int]) -> None:
        for t in tasks:
            if t != self.anchor.chief:
                self._run(f"tell task {t} the decision", self._decide[t], {self._text: decision.to_json()})

    def pull_state(self, deadline_s: float) -> dict[str, np.ndarray]:
        return decode_values(self._poll(self._state, "receive the variables", deadline_s))


__all__ = ["Decision", "Membership", "Report", "decode_values", "encode_values", "next_address"]
