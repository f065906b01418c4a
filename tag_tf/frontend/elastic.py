"""Elastic between-graph runs: lose a task, re-plan for the tasks left, go on with the same step.

Under `TF_CONFIG` with `elastic=True`, every task drives its own part of each step and every variable
write waits for the step's collectives (`compiler.atomic`), so a step that loses a task leaves each
survivor's variables either before that step or after it; each survivor's `Runner` counts the steps
it completed. When a step fails and some task of the current generation no longer answers:

1. detect: the failed step's error, then the tasks whose servers do not accept connections;
2. agree (`runtime.membership`): every survivor reports to the chief (the first surviving task
   when the chief is lost) the steps it completed and where its next server will listen; it
   decides who goes on (or stops the run, naming the lost tasks, below `min_tasks`), the step to
   resume from (the fewest completed: survivors differ by at most one) and whose copy of the
   variables holds it;
3. servers: each member starts its next server (a server whose collectives failed fails every later
   one and cannot be stopped; the old one is left idle in the process) on a cluster of the members;
4. plan and compile: the chief plans the same graph again for the machines left, from what
   discovery measured (the topology restricted to them) and the plan cache, within
   `PLAN_BUDGET_S`; every member compiles the chief's plan as at the first run;
5. restore: the chief loads the variables of the resume step (its own copy, or the one the source
   sent) into every copy of the new generation;
6. the step that failed runs again with the same batch (a member one step ahead first runs its last
   step again with that step's batch), so training goes on with the same global batch: each task
   still feeds the whole batch and the members take their shards of it.

The chief's loss is one like any other: the rendezvous runs on the first surviving task's first
server, and that task is the next generation's chief (it plans, loads, and writes the checkpoints).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tag_tf.errors import ClusterError
from tag_tf.frontend.returns import Returns
from tag_tf.runtime import roles
from tag_tf.runtime.cluster import ClusterSpec
from tag_tf.runtime.membership import Decision, Membership, Report, next_address

if TYPE_CHECKING:
    import numpy as np

    from tag_tf.frontend.program import Runner
    from tag_tf.runtime.roles import Role

log = logging.getLogger("tag_tf.distribute")

PLAN_BUDGET_S = 5.0            # re-planning for the machines left: the search's budget
DECISION_DEADLINE_S = 120.0    # a survivor waits this long for the chief to reach its own failed step


@dataclasses.dataclass
class Change:
    """One membership change: what was lost, from which step the run went on, and each phase's time."""
    generation: int
    lost: tuple[str, ...]          # the lost tasks' TF_CONFIG addresses
    members: tuple[int, ...]       # first-generation tasks that went on
    resume: int                    # steps completed before the one run again
    phases: dict[str, float] = dataclasses.field(default_factory=dict)    # seconds per phase
    plan: str = ""
    predicted_ms: float = float("nan")
    joined: tuple[str, ...] = ()   # the TF_CONFIG addresses of tasks that came back

    def describe(self) -> str:
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.phases.items())
        predicted = "" if self.predicted_ms != self.predicted_ms else f", predicted {self.predicted_ms:.1f} ms/step"
        what = []
        if self.lost:
            what.append(f"lost task(s) {', '.join(self.lost)} (unreachable)")
        if self.joined:
            what.append(f"task(s) {', '.join(self.joined)} came back")
        return (f"tag_tf: elastic: {'; '.join(what)}; generation {self.generation} "
                f"goes on with {len(self.members)} task(s) from step {self.resume + 1} with plan {self.plan}"
                f"{predicted}; {phases}")


# The simulated seconds per step of the run's strategy on some first-generation machines (nan: unknown).
Judge = Callable[["Runner", tuple[int, ...]], float]

# What the Distribution does for a new generation: (runner, role, values or None, first-generation
# machines) -> (plan description, predicted seconds per step, phase times)
Rebuild = Callable[["Runner", "Role", "dict[str, np.ndarray] | None", tuple[int, ...]],
                   tuple[str, float, dict[str, float]]]


class Elastic:
    """This task's side of an elastic run (one per `distribute` context under TF_CONFIG)."""

    def __init__(self, anchor: Role, server_target: str, min_tasks: int, rebuild: Rebuild, judge: Judge,
                 joined: Decision | None = None):
        self.anchor = anchor                       # the first generation (TF_CONFIG's addresses)
        self.role = anchor                         # the current generation
        self.members: tuple[int, ...] = tuple(range(len(anchor.spec.tasks)))
        self.generation = 0
        self.resume = 0                            # steps completed when this task (re)joined
        if joined is not None:                     # a task that came back, into generation `joined`
            self.members, self.generation, self.resume = joined.members, joined.generation, joined.resume
            self.role = roles.Role(dataclasses.replace(anchor.spec, tasks=joined.addresses),
                                   joined.members.index(anchor.task), 0)
        self.parts = self.members                  # the members that drive steps (the plan may leave some idle)
        self.min_tasks = min_tasks
        self.server_target = server_target
        self.memberships: dict[int, Membership] = {}
        self.rebuild = rebuild
        self.judge = judge                         # simulated seconds per step on first-generation machines
        self.topology: dict | None = None          # the first generation's (`Decision.topology`)
        self.returns: Returns | None = None        # on the chief: tasks that come back
        self._open_memberships()

    def close(self) -> None:
        """The `distribute` context ends: stop listening for tasks that come back."""
        if self.returns is not None:
            self.returns.stop()

    def _open_memberships(self) -> None:
        """The rendezvous runs on the first surviving member's first server (the chief's while it
        lives): one end for each member that can be it for this task (those before it), opened
        while they all answer (a session's creation waits with no deadline for a task it names)."""
        me = self.anchor.task
        for t in self.members[:self.members.index(me) + 1]:
            if t not in self.memberships:
                self.memberships[t] = Membership(roles.Role(self.anchor.spec, me, t), self.server_target)

    def started(self, runner: Runner) -> None:
        """A generation's first runner is built (`Distribution._watch`): count its steps from the
        step this task joined at; on the chief, mark the run in progress and listen for tasks that
        come back."""
        runner.completed = max(runner.completed, self.resume)
        parts = runner.program.part_tasks
        self.parts = self.members if parts is None else tuple(self.members[i] for i in parts)
        self._open_memberships()
        if self.role.is_chief:
            self.memberships[self.me].mark_running()
            if self.returns is None:
                self.returns = Returns(self)
            self.returns.watch(runner)

    @property
    def me(self) -> int:
        return self.anchor.task

    def _address(self, task: int) -> str:
        return self.anchor.spec.tasks[task]

    def _reachable(self, task: int) -> bool:
        here = self.role.spec.tasks[self.members.index(task)]
        return not ClusterSpec((here,), self.role.spec.job).unreachable(timeout_s=0.5)

    def recover(self, runner: Runner, error: Exception | None) -> None:
        """After `runner`'s step failed with `error`: go on with a new generation, or raise (`error`
        itself when no task was lost; ClusterError naming the lost tasks when the run cannot go on).
        With `error` None, at a step boundary the chief announced: tasks that came back join."""
        start = time.perf_counter()
        lost_now = [self.members[i] for i in self.role.spec.unreachable(timeout_s=1.0)]
        if not lost_now and error is not None:
            raise error
        phases = {"detect": time.perf_counter() - start}
        t = time.perf_counter()
        decision, anchor = self._agree(runner, lost_now)
        phases["agree"] = time.perf_counter() - t
        lost = tuple(self._address(m) for m in decision.lost)
        joined = tuple(self._address(m) for m in decision.members if m not in self.members)
        if decision.stop:
            raise ClusterError(decision.stop)
        if self.me not in decision.members:
            raise ClusterError(f"elastic: task {self.me} ({self._address(self.me)}) was left out of the run by the "
                               f"chief (its report came too late)")
        t = time.perf_counter()
        values = self._state(runner, decision, anchor)
        phases["state"] = time.perf_counter() - t
        role = roles.Role(dataclasses.replace(self.role.spec, tasks=decision.addresses),
                          decision.members.index(self.me), 0)
        roles.supersede(self.role)
        ahead = runner.completed - decision.resume
        last = runner.last
        self.role, self.members, self.generation = role, decision.members, decision.generation
        plan, predicted_s, rebuilt = self.rebuild(runner, role, values, decision.members)
        phases.update(rebuilt)
        runner.completed = decision.resume
        if ahead > 0 and last is not None:        # this task completed the step the others lost: again, in step
            t = time.perf_counter()
            runner.run(*last, training=True)
            phases["replay"] = time.perf_counter() - t
        phases["total"] = time.perf_counter() - start
        log.warning("%s", Change(decision.generation, lost, decision.members, decision.resume, phases, plan,
                                 predicted_s * 1e3, joined).describe())

    def _agree(self, runner: Runner, lost_now: list[int]) -> tuple[Decision, int]:
        """The decision of this change and the member that made it (the first one still reachable:
        the chief while it lives, else the next, who becomes the next generation's chief)."""
        gen = self.generation
        mine = Report(self.me, gen, runner.completed, next_address(self._address(self.me)))
        anchor = next(m for m in self.parts if m not in lost_now)
        membership = self.memberships[anchor]
        if anchor != self.me:
            membership.report(mine)
            return membership.decision(gen + 1, DECISION_DEADLINE_S), anchor
        if anchor != self.anchor.chief:
            log.warning("tag_tf: elastic: the chief (task %d, %s) is lost: task %d takes over", self.anchor.chief,
                        self._address(self.anchor.chief), self.me)
        expected = [m for m in self.parts if m not in lost_now and m != self.me]
        reports = membership.gather(gen, expected, self._reachable)
        reports[self.me] = mine
        joining = self.returns.take() if self.returns is not None else {}
        decision = decide(gen + 1, self.parts, reports, self.me, self.min_tasks, self.anchor.spec.tasks, joining)
        if joining:
            decision = dataclasses.replace(decision, topology=self.topology)
        membership.decide(decision, decision.members)
        return decision, anchor

    def _state(self, runner: Runner, decision: Decision, anchor: int) -> dict[str, np.ndarray] | None:
        """On the anchor (the next chief): the variables after `decision.resume` steps (its own, or the
        source's); on the source: sends its own to the anchor; elsewhere None."""
        if decision.source == self.me:
            assert runner.step is not None
            ir = runner.program.ir
            values = runner.step.read_variables(runner.program.io.copies, {v.name: v.kind for v in ir.variables.values()},
                                                {v.name: v.dtype for v in ir.variables.values()})
            if anchor != self.me:
                self.memberships[anchor].push_state(values)
                return None
        elif anchor == self.me:
            values = self.memberships[anchor].pull_state(DECISION_DEADLINE_S)
        else:
            return None
        for m in decision.members:               # tasks that came back start their scripts from these
            if m not in self.members:
                self.memberships[self.me].welcome(m, values)
        return values


def decide(generation: int, members: tuple[int, ...], reports: dict[int, Report], chief: int, min_tasks: int,
           addresses: tuple[str, ...], joining: dict[int, Report] | None = None) -> Decision:
    """The chief's decision for `generation`: the `members` that reported go on (in their order; the
    tasks `joining`, that came back, after them), from the fewest steps any member completed
    (survivors differ by at most one: a step completes nowhere before every task has started it),
    restored from the chief's copy where it holds that step, else from the first member's that does;
    or the run stops when fewer than `min_tasks` are left."""
    joining = {t: r for t, r in (joining or {}).items() if t not in members}
    going = tuple(m for m in members if m in reports) + tuple(sorted(joining))
    lost = tuple(m for m in members if m not in reports)
    if len(going) < min_tasks:
        names = ", ".join(f"task {m} ({addresses[m]})" for m in lost)
        steps = min((r.steps for r in reports.values()), default=0)
        return Decision(generation, going, lost=lost, stop=(
            f"elastic: lost {names}; {len(going)} task(s) left, fewer than min_tasks={min_tasks}: the run stops "
            f"after {steps} completed step(s) (the last checkpoint the program wrote is the way back)"))
    resume = min(r.steps for r in reports.values())
    source = chief if reports[chief].steps == resume else next(m for m in going if reports[m].steps == resume)
    every = {**reports, **joining}
    return Decision(generation, going, tuple(every[m].address for m in going), resume, source, lost)


__all__ = ["Change", "Elastic", "PLAN_BUDGET_S", "decide"]
