"""Elastic between-graph runs: lose a task, re-plan for the tasks left, go on with the same step.

Under `TF_CONFIG` with `elastic=True`, every task drives its own part of each step and every variable
write waits for the step's collectives (`compiler.atomic`), so a step that loses a task leaves each
survivor's variables either before that step or after it; each survivor's `Runner` counts the steps
it completed. When a step fails and some task of the current generation no longer answers:

1. detect: the failed step's error, then the tasks whose servers do not accept connections;
2. agree (`runtime.membership`): every survivor reports to the chief the steps it completed and
   where its next server will listen; the chief decides who goes on (or stops the run, naming the
   lost tasks, below `min_tasks`), the step to resume from (the fewest completed: survivors differ
   by at most one) and whose copy of the variables holds it;
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

The chief's own loss is not recovered yet: the other tasks stop, naming it (`Membership`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tag_tf.errors import ClusterError
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

    def describe(self) -> str:
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.phases.items())
        predicted = "" if self.predicted_ms != self.predicted_ms else f", predicted {self.predicted_ms:.1f} ms/step"
        return (f"tag_tf: elastic: lost task(s) {', '.join(self.lost)} (unreachable); generation {self.generation} "
                f"goes on with {len(self.members)} task(s) from step {self.resume + 1} with plan {self.plan}"
                f"{predicted}; {phases}")


# What the Distribution does for a new generation: (runner, role, values or None, first-generation
# machines) -> (plan description, predicted seconds per step, phase times)
Rebuild = Callable[["Runner", "Role", "dict[str, np.ndarray] | None", tuple[int, ...]],
                   tuple[str, float, dict[str, float]]]


class Elastic:
    """This task's side of an elastic run (one per `distribute` context under TF_CONFIG)."""

    def __init__(self, anchor: Role, server_target: str, min_tasks: int, rebuild: Rebuild):
        self.anchor = anchor                       # the first generation (TF_CONFIG's addresses)
        self.role = anchor                         # the current generation
        self.members: tuple[int, ...] = tuple(range(len(anchor.spec.tasks)))
        self.generation = 0
        self.min_tasks = min_tasks
        self.membership = Membership(anchor, server_target)
        self.rebuild = rebuild
        self.changes: list[Change] = []

    @property
    def me(self) -> int:
        return self.anchor.task

    def _address(self, task: int) -> str:
        return self.anchor.spec.tasks[task]

    def _reachable(self, task: int) -> bool:
        here = self.role.spec.tasks[self.members.index(task)]
        return not ClusterSpec((here,), self.role.spec.job).unreachable(timeout_s=0.5)

    def recover(self, runner: Runner, error: Exception) -> None:
        """After `runner`'s step failed with `error`: go on with a new generation, or raise (`error`
        itself when no task was lost; ClusterError naming the lost tasks when the run cannot go on)."""
        start = time.perf_counter()
        lost_now = [self.members[i] for i in self.role.spec.unreachable(timeout_s=1.0)]
        if not lost_now:
            raise error
        phases = {"detect": time.perf_counter() - start}
        t = time.perf_counter()
        decision = self._agree(runner, lost_now)
        phases["agree"] = time.perf_counter() - t
        lost = tuple(self._address(m) for m in decision.lost)
        if decision.stop:
            raise ClusterError(decision.stop)
        if self.me not in decision.members:
            raise ClusterError(f"elastic: task {self.me} ({self._address(self.me)}) was left out of the run by the "
                               f"chief (its report came too late)")
        t = time.perf_counter()
        values = self._state(runner, decision)
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
        change = Change(decision.generation, lost, decision.members, decision.resume, phases, plan,
                        predicted_s * 1e3)
        self.changes.append(change)
        log.warning("%s", change.describe())

    def _agree(self, runner: Runner, lost_now: list[int]) -> Decision:
        gen = self.generation
        mine = Report(self.me, gen, runner.completed, next_address(self._address(self.me)))
        if not self.role.is_chief:
            if self.role.chief in [self.members.index(m) for m in lost_now]:
                raise ClusterError(f"elastic: the chief (task {self.anchor.chief}, {self._address(self.anchor.chief)}) "
                                   f"was lost after step {runner.completed}; the run cannot go on without it (the "
                                   f"last checkpoint it wrote is the way back)")
            self.membership.report(mine)
            return self.membership.decision(gen + 1, DECISION_DEADLINE_S)
        expected = [m for m in self.members if m not in lost_now and m != self.me]
        reports = self.membership.gather(gen, expected, self._reachable)
        reports[self.me] = mine
        decision = decide(gen + 1, self.members, reports, self.me, self.min_tasks, self.anchor.spec.tasks)
        self.membership.decide(decision, decision.members)
        return decision

    def _state(self, runner: Runner, decision: Decision) -> dict[str, np.ndarray] | None:
        """On the chief: the variables after `decision.resume` steps (its own, or the source's); on
        the source: sends its own to the chief; elsewhere None."""
        if decision.source == self.me:
            assert runner.step is not None
            ir = runner.program.ir
            values = runner.step.read_variables(runner.program.io.copies, {v.name: v.kind for v in ir.variables.values()},
                                                {v.name: v.dtype for v in ir.variables.values()})
            if self.role.is_chief:
                return values
            self.membership.push_state(values)
            return None
        if self.role.is_chief:
            return self.membership.pull_state(DECISION_DEADLINE_S)
        return None





def decide(generation: int, members: tuple[int, ...], reports: dict[int, Report], chief: int, min_tasks: int,
           addresses: tuple[str, ...]) -> Decision:
    """The chief's decision for `generation`: the `members` that reported go on (in their order), from
    the fewest steps any of them completed (survivors differ by at most one: a step completes nowhere
    before every task has started it), restored from the chief's copy where it holds that step, else
    from the first member's that does; or the run stops when fewer than `min_tasks` are left."""
    going = tuple(m for m in members if m in reports)
    lost = tuple(m for m in members if m not in reports)
    if len(going) < min_tasks:
        names = ", ".join(f"task {m} ({addresses[m]})" for m in lost)
        steps = min((r.steps for r in reports.values()), default=0)
        return Decision(generation, going, lost=lost, stop=(
            f"elastic: lost {names}; {len(going)} task(s) left, fewer than min_tasks={min_tasks}: the run stops "
            f"after {steps} completed step(s) (the last checkpoint the program wrote is the way back)"))
    resume = min(r.steps for r in reports.values())
    source = chief if reports[chief].steps == resume else next(m for m in going if reports[m].steps == resume)
    return Decision(generation, going, tuple(reports[m].address for m in going), resume, source, lost)


def predicted_s(program: object) -> float:
    """The simulated seconds per step of `program`'s plan on its topology (nan where it cannot be
    simulated)."""
    from tag_tf.frontend.planning import simulator

    try:
        sim = simulator(program.analysis, program.target.topology)       # type: ignore[attr-defined]
        return float(sim.simulate(program.plan.strategy).iteration_time_s)   # type: ignore[attr-defined]
    except Exception:                     # noqa: BLE001 (a figure for the log line; the run goes on)
        log.debug("tag_tf: elastic: the new plan could not be simulated", exc_info=True)
        return float("nan")
__all__ = ["Change", "Elastic", "PLAN_BUDGET_S", "decide", "predicted_s"]
