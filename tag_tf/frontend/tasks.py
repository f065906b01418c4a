"""One script on every task (TF_CONFIG, a ClusterResolver): what each task does besides training.

Every task serves its machine. The chief waits for the others, plans, compiles, loads every copy and
tells the others (`PlanMessage`) whether each drives its own part of every step (between-graph,
`TaskStep`) or the chief drives them all; any other task compiles the chief's plan, or serves until
the chief ends the run and then ends its process (`ClusterTasks`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from tag_tf.errors import ClusterError
from tag_tf.frontend.planning import Plan
from tag_tf.frontend.program import Program, TaskStep, graph_digest
from tag_tf.frontend.target import Target
from tag_tf.runtime import roles
from tag_tf.runtime.plan_message import BETWEEN, CHIEF, LOADED, PlanMessage
from tag_tf.runtime.roles import Role

if TYPE_CHECKING:
    from tensorflow.distribute import Server

log = logging.getLogger("tag_tf.distribute")


class ClusterTasks:
    """This task's side of a TF_CONFIG cluster, for one `tag_tf.distribute` context."""

    def __init__(self, role: Role, elastic: bool = False):
        self.role = role
        self.elastic = elastic                 # steps are atomic (`compiler.atomic`): a lost task can be restored
        self.server: Server | None = None      # this task's TensorFlow server, once joined
        self._pending: list[PlanMessage] = []      # plans the chief sent that no graph has used yet

    # -- joining ---------------------------------------------------------------------------------
    def join(self, target: Target) -> Target:
        """Serve this machine and return the target to compile for. The chief waits for the other
        tasks; any other task waits for the chief's first plan (its topology: every task compiles for
        the same devices) or, when the chief drives every step or ends the run, ends here."""
        server = self.server = roles.join(self.role)
        local = server.target
        if self.role.is_chief:
            # Sessions on this server's own target run with an in-process master (no gRPC hop for
            # feeds and fetches).
            roles.wait_for_tasks(self.role)
            return dataclasses.replace(target, local_server=local)
        message = self._wait_for_plan()
        from tag_tf.frontend.target import cluster_target

        assert message.topology is not None        # a plan message carries its topology (PlanMessage)
        self._pending.append(message)
        roles.serve_at_exit(self.role, self.server)    # the chief may still use this server after our script ends
        return dataclasses.replace(cluster_target(message.topology, self.role.spec, self.role), local_server=local)

    def next_plan(self) -> PlanMessage:
        """On a task other than the chief: the chief's plan for the next graph it compiles."""
        return self._pending.pop(0) if self._pending else self._wait_for_plan()

    def _wait_for_plan(self) -> PlanMessage:
        """The chief's next plan; the process ends here (as a serving task did before) when the chief
        drives every step itself or ends the run."""
        role = self.role
        code, message = roles.wait_for_plan(role, self.server)
        if message is None:
            log.info("tag_tf: task %d: the chief ended the run", role.task)
            raise SystemExit(code)
        idle = message.mode == BETWEEN and role.task not in message.tasks
        if message.mode == BETWEEN and not idle:
            return message
        if idle:
            log.info("tag_tf: task %d has no part in the chief's plan (it runs on task(s) %s): it serves until the "
                     "chief ends the run", role.task, ", ".join(map(str, message.tasks)))
        else:
            log.info("tag_tf: task %d serves; the chief drives every step (%s)", role.task, message.reason)
        if roles.serves_at_exit(role):
            raise SystemExit(0)           # the exit handler serves until the chief ends the run
        if idle:                          # the chief waits for every task's script to end before its own
            with contextlib.suppress(ClusterError):   # the chief is gone: serve_until_done says so
                roles.tell_chief(role, roles.FINISHED_QUEUE)
        raise SystemExit(roles.serve_until_done(role, self.server))

    def chiefs_choice(self, message: PlanMessage, fingerprint: str) -> tuple[Plan, list[str], list[str]]:
        """The chief's plan for graph `fingerprint`, with its first run's fetches and ops."""
        if message.graph != fingerprint:
            raise ClusterError(f"task {self.role.task} trains graph {fingerprint} but the chief trains graph "
                               f"{message.graph}: every task must run the same script and build the same graph")
        assert message.strategy is not None
        return Plan(message.strategy, "chief"), list(message.fetches), list(message.run_ops)

    # -- once a session's values are loaded ------------------------------------------------------
    def follow(self, program: Program, target: Target, user_config: object) -> TaskStep:
        """On a task other than the chief: this task's part of every step of `program` (between-graph).
        The chief has loaded every copy (this task's too) before its message; a later session of the
        same graph waits for the chief to load that session's values."""
        role = self.role
        if program.task_sessions:
            _, message = roles.wait_for_plan(role, self.server)
            if message is None or message.mode != LOADED or message.graph != program.ir.fingerprint:
                raise ClusterError(f"task {role.task}: a new session of graph {program.ir.fingerprint} found the "
                                   f"chief elsewhere ({'ended' if message is None else message.mode}); every "
                                   f"task must open the same sessions in the same order")
        program.task_sessions += 1
        step = task_step(program, role.task, target, user_config, self.elastic)
        roles.tell_chief(role, roles.READY_QUEUE)
        log.info("tag_tf: task %d drives its own part of each step (between-graph)", role.task)
        return step

    def share_plan(self, program: Program, target: Target, user_config: object) -> TaskStep | None:
        """On the chief, once a session's values are loaded: the first time, `decide`; later sessions
        of a between-graph program tell the tasks their copies are loaded. Returns the chief's part
        once every task has built its own (ClusterError naming one that did not)."""
        if program.between is None:
            step = self.decide(program, target, user_config)
        elif program.between:
            step = task_step(program, self.role.task, target, user_config, self.elastic)
            roles.send_plan(self.role, PlanMessage.loaded(program.ir.fingerprint))
        else:
            return None
        if step is not None:
            try:
                roles.wait_for_tokens(self.role, roles.READY_QUEUE, roles.READY_DEADLINE_S,
                                      "build its part of each step", tasks=program.part_tasks)
            except BaseException:
                step.close()
                raise
        return step

    def decide(self, program: Program, target: Target, user_config: object) -> TaskStep | None:
        """On the chief: tell every other task this program's plan, and whether each task drives its own
        part of every step (between-graph; returns the chief's part) or the chief drives them all."""
        reason, step = self._between_graph(program, target, user_config)
        fetches, run_ops = program.first_run
        message = PlanMessage(
            BETWEEN if step is not None else CHIEF, program.ir.fingerprint, program.plan.strategy,
            program.target.topology, tuple(fetches), tuple(run_ops), graph_digest(program.ir, program.compiled),
            program.as_written, tuple(program.part_tasks or ()), reason)
        program.between = step is not None
        if step is None:
            roles.set_chief_drives(self.role)
            log.info("tag_tf: the chief drives every step on every task (%s)", reason)
        else:
            roles.set_between_graph(self.role)
            log.info("tag_tf: every task drives its own part of each step (between-graph)")
        try:
            roles.send_plan(self.role, message)
        except BaseException:
            if step is not None:
                step.close()
            raise
        return step

    def _between_graph(self, program: Program, target: Target, user_config: object
                       ) -> tuple[str, TaskStep | None]:
        """The chief's own part of every step where every task can drive its own, else why not."""
        from tag_tf.compiler.localize import NotLocal

        if program.target.cluster is None:
            return "the plan keeps every op on the chief's machine", None
        if roles.chief_drives(self.role):
            return "an earlier graph of this run was driven by the chief", None
        if os.environ.get("TAG_TF_BETWEEN_GRAPH", "1") == "0":
            return "TAG_TF_BETWEEN_GRAPH=0", None
        try:
            return "", task_step(program, self.role.task, target, user_config, self.elastic)
        except NotLocal as e:
            return str(e), None

    def abandon(self) -> None:
        """A failed task's server goes with it: the chief names it."""
        if not self.role.is_chief:
            roles.abandon_serving(self.role)


def task_step(program: Program, task: int, target: Target, user_config: object, atomic: bool = False) -> TaskStep:
    """Task `task`'s own part of every training step (NotLocal when the plan has edges between
    tasks that only a single driver can run)."""
    from tag_tf.compiler.compile import instance_key_base
    from tag_tf.compiler.localize import NotLocal, localize

    c = program.compiled
    parts = localize(c.graph_def, list(c.fetch_tensors.values()), list(c.run_ops.values()), c.instances,
                     instance_key_base(program.analysis, program.plan.strategy, c.devices))
    if task not in parts:
        raise NotLocal(f"between-graph: the plan leaves task {task} out (it runs on task(s) "
                       f"{', '.join(map(str, sorted(parts)))})")
    program.part_tasks = tuple(sorted(parts))
    if parts[task].riding:
        log.info("tag_tf: %d whole-batch fetch(es) summed over the tasks ride the gradients' all-reduce",
                 len(parts[task].riding))
    return TaskStep(parts[task], lambda graph: target.task_session(graph, task, user_config,
                                                                   as_written=program.as_written), atomic)


__all__ = ["ClusterTasks", "task_step"]
