"""`tag_tf.distribute`: existing TF1-style training code trains distributed with one added line.

    with tag_tf.distribute():               # or @tag_tf.distribute(strategy="dp") on a function
        ...build the graph, tf.compat.v1.Session / MonitoredTrainingSession / Saver as before...

How it works. While a context is active, `BaseSession._do_run` (the step of `Session.run` that gets
the flattened fetches, targets and validated feeds, after TensorFlow has parsed the user's fetch
structure), `BaseSession.make_callable` and `BaseSession.close` are patched; on the last exit the
originals are put back. MonitoredSession, hooks, Saver and Estimator all end in a raw `Session.run`,
so they go through the patch too. Per session:

- Runs before the first training run (initialisers, restores) run on the user's own session. Runs
  that initialise iterators or lookup tables are remembered, to be replayed.
- The first *training run* (its fetches reach an optimizer update op, Apply*/ResourceApply*, or an op
  of the TRAIN_OP collection) captures the graph, analyses it, resolves the plan (cache, planner or
  the given strategy), compiles it and imports it into a session on the planned devices. There the
  remembered iterator/table initialisations are replayed, then every variable's current value is
  copied from the user's session into all its copies, and from then on every run of that session
  executes the compiled graph: fetches map to tensors holding the original (whole-batch) values, ops to ops
  running all their instances, feeds keep their names. TensorFlow rebuilds the user's fetch
  structure from the values, so nested lists/dicts/namedtuples, strings and ops behave as usual.
- In a graph with queue runners, the first run that enqueues or dequeues counts as the start of
  training (the queue must be filled in the session that trains), compiled with the graph's train op.
- Every train op of the graph is compiled with the first training run's (a GAN's second optimizer,
  the apply run of accumulated gradients), so later runs of any of them run compiled.
- A run the compiled program cannot take (ops created after training started, a batch smaller than
  the replicas) runs on the user's session, on one device, after the trained values are copied
  there; what it writes to variables is copied back into every compiled copy (`_run_on_one_device`).
- Graphs that never train (evaluation, prediction) are never touched.
- On exit, sessions still open get their variables' trained values back, then compiled sessions close.
- One script on every task (`TF_CONFIG`, a ClusterResolver): the chief plans, compiles, loads every
  copy and sends the plan to the other tasks, which compile the same graph. Where the plan's edges
  between tasks can be cut (`compiler.localize`), each task's training runs drive its own part of
  the step (`TaskStep`: between-graph, meeting the others in collectives); otherwise the chief drives
  every task's part and the others serve (`$TAG_TF_BETWEEN_GRAPH=0` insists on that).

Errors are one line, of a `tag_tf.errors` type, naming the thing: `GraphError` (no train op: a fetched
TRAIN_OP-collection op that runs no optimizer update), `CompileError` (a feed the plan cannot provide, a
graph whose batch cannot be split consistently), `ClusterError` (unreachable task),
`TopologyError` (a topology that does not match the devices present), `VerificationError`.

Modules: `options` (the typed options), `target` (where compiled graphs run), `program` (the captured
graph, the compiled program, its runner), `compiling` (capture, analysis, plan and compile),
`tasks` (one script on every task), `replay` (state between the user's and the compiled session),
`session_values` (variables in and out of sessions, synthetic batches), `session_patch` (the patch
itself); this one holds the context, `Distribution`, and routes each intercepted run.
"""
from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

from tag_tf.errors import TagError
from tag_tf.frontend.compiling import NothingToSplit, compile_program
from tag_tf.frontend.elastic import Elastic
from tag_tf.frontend.options import (
    CalibrationRequest,
    ClusterRequest,
    DistributeOptions,
    StrategyRequest,
    TopologyRequest,
)
from tag_tf.frontend.planning import Plan
from tag_tf.frontend.program import GraphInfo, Program, Runner
from tag_tf.frontend.replay import (
    OriginalRun,
    SessionState,
    UserRun,
    readable_restore,
    remember,
    run_on_one_device,
    skip_save,
    sync_back,
)
from tag_tf.frontend.session_patch import bypass, install, uninstall
from tag_tf.frontend.session_values import read_variables
from tag_tf.frontend.target import Target, resolve_target
from tag_tf.frontend.tasks import ClusterTasks

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

    from tag_tf.runtime.roles import Role

log = logging.getLogger("tag_tf.distribute")

F = TypeVar("F", bound=Callable[..., object])


def distribute(strategy: StrategyRequest | F = "auto", topology: TopologyRequest = None,
               cluster: ClusterRequest = None, cache_dir: str | None = None, budget_s: float | None = None,
               verify: bool = False, exact_batch_stats: bool = False, fallback: str = "error",
               inference: bool = False, calibration: CalibrationRequest = "default",
               trusted_network: bool = False, sfb: bool = True, elastic: bool | None = None,
               min_tasks: int | None = None) -> Distribution | F:
    """Train the TF1 code run inside this context (or decorated function) distributed.

    strategy: "auto" (the best plan the planner gives), a baseline ("dp", "dp-p" with batch shares
        proportional to device capacity, "horovod" and "horovod-p" with fused gradient buckets,
        "heterog", "best-subset", "pipeline"; each also as "<name>+sfb", with sufficient factor
        broadcasting), a `tag_tf.strategy.Strategy`, or the path of a strategy JSON file.
    topology: a preset name ("local:4", "testbed", ...), a topology file or dict, or a Topology;
        default: this machine (its GPUs, else 4 virtual CPU devices).
    cluster: a cluster file (or ClusterSpec): run on those `tag-tf server`s, task i = machine i.
    cache_dir: where plans are cached (default: $TAG_TF_CACHE_DIR or ~/.cache/tag_tf); op times
        measured for this graph with `tag-tf profile` in its `profiles/` database are planned with.
    budget_s: planning time budget in seconds, analysis included: the search gets what analysis
        leaves of it (none left: the best baseline). Default: up to 30 s of search, ending early
        once it has converged.
    verify: before training, check for 2 steps that the distributed graph trains like the original
        (first fed batch, or synthetic batches for iterator inputs); raise VerificationError if not.
    exact_batch_stats: BatchNorm replicas use the whole batch's statistics (exact, one extra
        all-reduce per BatchNorm) instead of their own shard's (the data-parallel convention).
    fallback: what a training run that tag_tf cannot distribute does: "error" (default: raise the
        reason, naming the op) or "single" (log one warning with the reason and train on the user's
        own session, undistributed).
    trusted_network: allow cluster addresses outside loopback/private ranges (a TensorFlow server
        runs whatever graph anyone who reaches it sends; say so only for a network that is yours).
    calibration: the simulator physics the planner judges plans with: "default" (the shipped fit
        for the testbed/cloud presets, datasheet elsewhere), "nominal", or a `tag-tf calibrate` file.
    sfb: "auto" plans apply sufficient factor broadcasting (gradients rebuilt on every device from
        their factors where that simulates faster than synchronising them); False: never.
    inference: also distribute graphs that never train: the first run fetching values computed
        from a batch input (predictions) is planned and compiled like a training run, forward only;
        fetched values are those of the single-device graph.
    elastic: under TF_CONFIG (or a resolver), a task lost mid-run does not end it: the others agree on
        who is left, start new servers, re-plan for the machines left, restore every variable from the
        last step completed (held in memory) and run the lost step again with the same batch
        (`tag_tf/frontend/elastic.py`). None (default): on when $TAG_TF_ELASTIC=1.
    min_tasks: with `elastic`, the fewest tasks the run goes on with; below, it stops naming the lost
        tasks (the chief's checkpoints are the way back). None: $TAG_TF_MIN_TASKS, else 1.

    The options are checked here, once (`DistributeOptions`): a bad one raises OptionsError naming it.
    `@tag_tf.distribute` (no arguments) decorates a function with the defaults.
    """
    if callable(strategy) and not isinstance(strategy, str):
        return Distribution()(cast(F, strategy))
    return Distribution(DistributeOptions(
        strategy=strategy, topology=topology, cluster=cluster, cache_dir=cache_dir, budget_s=budget_s,
        verify=verify, exact_batch_stats=exact_batch_stats, fallback=fallback, inference=inference,
        calibration=calibration, trusted_network=trusted_network, sfb=sfb, elastic=elastic, min_tasks=min_tasks))


class Distribution:
    """What `tag_tf.distribute(...)` returns: a context manager and a decorator.

    After use, `plans` lists the plan of every graph it compiled (`Plan.cache_hit` tells whether
    the plan came from the cache) and `programs` the compiled programs."""

    def __init__(self, options: DistributeOptions | None = None):
        self.options = options if options is not None else DistributeOptions()
        self.plans: list[Plan] = []
        self.programs: list[Program] = []
        self.target: Target | None = None
        self._graphs: weakref.WeakKeyDictionary[tf.Graph, tuple[GraphInfo, Program | None]] = (
            weakref.WeakKeyDictionary())
        self._sessions: weakref.WeakKeyDictionary[tf.compat.v1.Session, SessionState] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        # Graphs left undistributed by fallback="single" -> the reason.
        self._fallen_back: weakref.WeakKeyDictionary[tf.Graph, str] = weakref.WeakKeyDictionary()
        self._active = False
        self._log_handler: logging.Handler | None = None
        self._saved_level = logging.NOTSET
        self._tasks: ClusterTasks | None = None     # in a TF_CONFIG cluster: this task's side of it
        self._elastic: Elastic | None = None        # ... with elastic=True: its membership changes
        self._first: Target | None = None           # ... the first generation's target (machine i = task i)
        self._welcome: dict[str, np.ndarray] | None = None   # ... came back: the variables to start from

    # -- context / decorator -----------------------------------------------------------------------
    def __enter__(self) -> Distribution:
        if self._active:
            raise TagError("this tag_tf.distribute(...) context is already active")
        o = self.options
        target = resolve_target(o.topology, o.cluster, o.trusted_network)
        self._start_logging()
        try:
            if target.role is not None:
                self._tasks = ClusterTasks(target.role, elastic=o.elastic_on)
                back = self._come_back(target) if o.elastic_on else None
                target = back or self._tasks.join(target)      # a task the chief tells to serve ends here
            if target.discover:                        # after logging starts: the topology found is reported
                from tag_tf.context import Options

                target = target.discovered(Options(cache_dir=o.cache_dir).cache_root())
            if self._tasks is not None and o.elastic_on and self._elastic is None and self._tasks.server is not None:
                self._elastic = Elastic(self._tasks.role, self._tasks.server.target, o.fewest_tasks,
                                        self._next_generation, self._judge)
                self._elastic.topology = target.topology.to_dict()
                self._first = target
        except BaseException:
            self._stop_logging()
            raise
        self.target = target
        self._active = True
        install(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        uninstall(self)
        self._active = False
        if exc_type is not None and self._tasks is not None:
            self._tasks.abandon()
        if self._elastic is not None:
            self._elastic.close()
        failed: list[str] = []
        try:
            with bypass():
                for sess, state in list(self._sessions.items()):
                    if state.runner is not None:
                        if not getattr(sess, "_closed", True):
                            failed.extend(sync_back(sess, state.runner))
                        state.runner.close()
        finally:
            self._sessions = weakref.WeakKeyDictionary()
            self._stop_logging()
        if failed and exc_type is None:
            # The user's session would silently keep its pre-training values: never that.
            raise TagError(f"could not copy the trained variables back to the user's session on leaving "
                           f"tag_tf.distribute: {failed[0]}")

    def __call__(self, func: F) -> F:
        """As a decorator: every call runs in a fresh context with the same options."""
        @functools.wraps(func)
        def wrapper(*args: object, **kwargs: object) -> object:
            with Distribution(self.options) as d:
                self.plans, self.programs = d.plans, d.programs
                return func(*args, **kwargs)
        return wrapper  # type: ignore[return-value]   # functools.wraps keeps func's signature

    def _start_logging(self) -> None:
        # One line per compiled graph on stderr, unless the application configured logging itself.
        if not logging.getLogger().handlers and not log.handlers and not logging.getLogger("tag_tf").handlers:
            self._log_handler = logging.StreamHandler(sys.stderr)
            self._log_handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(self._log_handler)
            self._saved_level = log.level
            log.setLevel(logging.INFO)

    def _stop_logging(self) -> None:
        if self._log_handler is not None:
            log.removeHandler(self._log_handler)
            log.setLevel(self._saved_level)
            self._log_handler = None

    # -- the intercepted run -----------------------------------------------------------------------
    def owns(self, sess: tf.compat.v1.Session) -> bool:
        state = self._sessions.get(sess)
        return state is not None and state.runner is not None

    def dispatch(self, sess: tf.compat.v1.Session, original: OriginalRun, targets: list[tf.Operation],
                 fetches: list[tf.Tensor], feeds: dict[object, np.ndarray], options: object, run_metadata: object
                 ) -> list[object]:
        """One `_do_run` of a user session: pass it through, or run it on the compiled graph."""
        run = UserRun(sess, original, targets, fetches, feeds, options, run_metadata)
        info = self._info(sess.graph)
        roots = info.training_roots(run.names())
        training = bool(roots)
        state = self._sessions.get(sess)
        if state is None or state.runner is None:
            if not roots and self.options.inference:
                roots = info.inference_roots([op.name for op in targets], [t.op.name for t in fetches])
            passed = self._uncompiled(run, info, roots, training)
            if passed is not None:
                return passed
            state = self._sessions[sess]
        return self._compiled_run(run, info, state, roots, training)

    def _uncompiled(self, run: UserRun, info: GraphInfo, roots: list[str], training: bool) -> list[object] | None:
        """A run of a session without a compiled program: its values where it passes through
        (initialisation, restores, graphs that never train, graphs left undistributed), else None
        once the session's program is compiled and loaded (the run then runs on it)."""
        names = run.names()
        if not roots and not any(n in info.queue for n in names):
            # Remembered even before the graph has an optimizer (an iterator initialised first).
            if any(n in info.state_init for n in names):
                with self._lock:
                    remember(self._state(run.sess).replay, run.by_name())
            if info.updates and info.restore_prefixes and any(n in info.restores for n in names):
                values = run.on_user_session(readable_restore(run.feeds, info.restore_prefixes))
            else:
                values = run.on_user_session()
            if self._welcome is not None:       # a task that came back: the run's values, whatever it restored
                self._write_welcome(run.sess)
            return values
        if run.sess.graph in self._fallen_back:
            return run.on_user_session()
        with self._lock:
            state = self._state(run.sess)
            if state.runner is not None:
                return None
            try:
                program = self._program(run, info, info.every_training_root(run.sess.graph, roots) if training
                                        else roots)
            except TagError as e:
                self._fall_back(run, e)
                return run.on_user_session()
            state.runner = self._migrate(run.sess, program, state)
        return None

    def _fall_back(self, run: UserRun, error: TagError) -> None:
        """Leave the graph undistributed where that is what the user asked for (or there is nothing
        to split); otherwise raise `error`."""
        if isinstance(error, NothingToSplit):
            log.info("tag_tf: training graph on one device (the session's own): %s", error)
        elif self.options.fallback != "single" or (self._tasks is not None and not self._tasks.role.is_chief):
            raise error           # a task training alone would be the silent copy TF_CONFIG users fear
        else:
            log.warning("tag_tf: not distributing this graph, training it on one device (fallback='single'): %s",
                        error)
        self._fallen_back[run.sess.graph] = str(error)

    def _compiled_run(self, run: UserRun, info: GraphInfo, state: SessionState, roots: list[str], training: bool
                      ) -> list[object]:
        runner = state.runner
        assert runner is not None and self.target is not None
        program = runner.program
        if (runner.step is not None and self._tasks is not None and not self._tasks.role.is_chief
                and any(n in info.saves for n in run.names())):
            skipped = skip_save(run.fetches, run.feeds)
            if skipped is not None:
                return skipped
        t, f, fd = run.by_name()
        reason = program.one_device_reason(t, f, fd, training)
        if reason is not None:
            return run_on_one_device(run, state, self.target.role, reason, training)
        if roots and program.ir.training_updates() and not program.covers(roots):
            raise TagError(f"fetching {roots[0]!r} runs training updates (optimizer ops or writes of "
                           f"gradient-derived values) outside the train ops tag_tf compiled "
                           f"({program.ir.meta.train_op!r}); create every train op before the first training run")
        state.synced = False
        return runner.run(t, f, fd, run.options, run.run_metadata, training=training)

    def _state(self, sess: tf.compat.v1.Session) -> SessionState:
        state = self._sessions.get(sess)
        if state is None:
            state = self._sessions[sess] = SessionState()
        return state

    def _info(self, graph: tf.Graph) -> GraphInfo:
        entry = self._graphs.get(graph)
        if entry is not None and entry[0].version == graph.version:
            return entry[0]
        info = GraphInfo.of(graph)
        with self._lock:
            entry = self._graphs.get(graph)      # a program may have been stored meanwhile
            self._graphs[graph] = (info, entry[1] if entry else None)
        return info

    def session_closed(self, sess: tf.compat.v1.Session) -> None:
        with self._lock:
            state = self._sessions.pop(sess, None)
        if state is not None and state.runner is not None:
            state.runner.close()

    # -- compile and load --------------------------------------------------------------------------
    def _program(self, run: UserRun, info: GraphInfo, roots: list[str]) -> Program:
        """The program of the run's graph (compiled on its first training run, shared by its sessions)."""
        graph = run.sess.graph
        entry = self._graphs.get(graph)
        if entry is not None and entry[1] is not None:
            return entry[1]
        assert self.target is not None
        targets, fetches, feeds = run.by_name()
        program = compile_program(graph, roots, feeds, fetches, targets, options=self.options, target=self.target,
                                  tasks=self._tasks)
        self._graphs[graph] = (info, program)
        self.plans.append(program.plan)
        self.programs.append(program)
        return program

    def _migrate(self, sess: tf.compat.v1.Session, program: Program, state: SessionState) -> Runner:
        """Start a compiled session for `sess`: replay iterator/table initialisations, then copy every
        initialised variable's value from the user's session into all its copies. In a cluster, the
        chief then tells the other tasks whether each drives its own part of every step."""
        assert self.target is not None
        user_config = getattr(sess, "_config", None)
        runner = Runner(program, program.target.session(program.graph, user_config, as_written=program.as_written))
        tasks = self._tasks
        if tasks is not None and not tasks.role.is_chief:
            state.replay.clear()             # the chief's values are loaded into this task's copies
            runner.step = tasks.follow(program, self.target, user_config)
            self._watch(runner)
            return runner
        with bypass():
            for targets, fetches, feeds in state.replay:
                runner.run(targets, fetches, feeds)
            state.replay.clear()
            values = read_variables(sess, program.ir)
            program.io.load(runner.session, values)
        missing = sorted(set(program.ir.variables) - set(values))
        if missing:
            log.info("tag_tf: variables not initialised yet, left for their initialiser: %s", ", ".join(missing))
        if tasks is not None and len(tasks.role.spec.tasks) > 1:
            runner.step = tasks.share_plan(program, self.target, user_config)
            self._watch(runner)
        return runner

    # -- elastic runs ------------------------------------------------------------------------------
    def _watch(self, runner: Runner) -> None:
        """With elastic=True, a between-graph runner's lost task starts a new generation (`Elastic`)."""
        self._welcome = None
        if self._elastic is not None and runner.step is not None:
            runner.recover = self._elastic.recover
            self._elastic.started(runner)

    def _come_back(self, target: Target) -> Target | None:
        """Under TF_CONFIG with elastic on: where a run is in progress, come back into it (this task
        was lost and started again); the next generation's target, or None at the run's first start."""
        from tag_tf.frontend.returns import find_running, rejoin
        from tag_tf.frontend.target import cluster_target
        from tag_tf.runtime import roles
        from tag_tf.topology.parse import topology_from_dict

        role = target.role
        assert role is not None
        if roles.joined(role):       # a later context of this process: the run it is in, not a return
            return None
        server = roles.join(role)
        found = find_running(role, server.target)
        if found is None:
            return None
        decision, self._welcome = rejoin(role, *found)
        roles.supersede(role)
        self._elastic = Elastic(role, server.target, self.options.fewest_tasks, self._next_generation, self._judge,
                                joined=decision)
        self._elastic.topology = decision.topology
        if decision.topology is not None:
            self._first = cluster_target(topology_from_dict(decision.topology), role.spec, role)
        self._tasks = ClusterTasks(self._elastic.role, elastic=True)
        return self._tasks.join(target)      # the next generation's: waits for the chief's plan

    def _write_welcome(self, sess: tf.compat.v1.Session) -> None:
        """The run's values (`_welcome`) into the user's session, through each variable's initializer
        (no op added to a graph that may be finalized)."""
        import tensorflow as tf

        assert self._welcome is not None
        targets, feeds = [], {}
        for v in sess.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            value = self._welcome.get(v.op.name)
            if value is not None:
                targets.append(v.initializer)
                feeds[v.initializer.inputs[1]] = value
        if targets:
            with bypass():
                sess.run(targets, feeds)

    def _judge(self, runner: Runner, machines: tuple[int, ...]) -> float:
        """Simulated seconds per step of this run's strategy planned for first-generation `machines`
        as a re-plan would plan it (nan where it cannot be planned)."""
        import dataclasses
        import math

        from tag_tf.frontend.compiling import judged
        from tag_tf.frontend.elastic import PLAN_BUDGET_S
        from tag_tf.frontend.target import cluster_target
        from tag_tf.topology.spec import restrict

        first = self._first
        if first is None or first.cluster is None:
            return math.nan
        spec = dataclasses.replace(first.cluster, tasks=tuple(first.cluster.tasks[m] for m in machines))
        target = dataclasses.replace(cluster_target(restrict(first.topology, machines), spec), drive_s=first.drive_s)
        return judged(runner.program.analysis, target, self.options, PLAN_BUDGET_S)

    def _next_generation(self, runner: Runner, role: Role, values: dict[str, np.ndarray] | None,
                         machines: tuple[int, ...]) -> tuple[str, float, dict[str, float]]:
        """`runner` on a new generation of servers (`role`): this task's next server, the chief's plan
        for the first generation's `machines` compiled, the chief's `values` loaded into every copy.
        Returns the plan, its predicted seconds per step and each phase's seconds."""
        import dataclasses
        import math
        import time

        from tag_tf.frontend.compiling import judged
        from tag_tf.frontend.elastic import PLAN_BUDGET_S
        from tag_tf.frontend.target import cluster_target
        from tag_tf.topology.spec import restrict

        assert self._first is not None
        phases: dict[str, float] = {}
        start = time.perf_counter()
        first = self._first
        target = dataclasses.replace(cluster_target(restrict(first.topology, machines), role.spec, role),
                                     drive_s=first.drive_s)
        tasks = ClusterTasks(role, elastic=True)
        target = tasks.join(target)         # the chief waits for the others' servers; they, for its plan
        self._tasks, self.target = tasks, target
        phases["servers"] = time.perf_counter() - start
        graph, user_config = self._graph_of(runner)
        fetches, roots = runner.program.first_run
        feeds = runner.current[2] if runner.current is not None else {}
        budget = PLAN_BUDGET_S if self.options.budget_s is None else min(self.options.budget_s, PLAN_BUDGET_S)
        options = dataclasses.replace(self.options, verify=False, budget_s=budget)
        t = time.perf_counter()
        program = compile_program(graph, roots, feeds, fetches, [], options=options, target=target, tasks=tasks)
        phases["plan+compile"] = time.perf_counter() - t
        t = time.perf_counter()
        target.check()      # a member lost since: named now (a session waits with no deadline for a dead task)
        session = program.target.session(program.graph, user_config, as_written=program.as_written)
        if role.is_chief:
            assert values is not None
            program.io.load(session, values)
            step = tasks.share_plan(program, target, user_config)
        else:
            step = tasks.follow(program, target, user_config)
        runner.replace(program, session, step)
        self._watch(runner)
        phases["restore"] = time.perf_counter() - t
        info = self._graphs[graph][0]
        self._graphs[graph] = (info, program)
        self.plans.append(program.plan)
        self.programs.append(program)
        predicted = judged(program.analysis, target, options, budget) if role.is_chief else math.nan  # cached plan
        return program.plan.describe(), predicted, phases

    def _graph_of(self, runner: Runner) -> tuple[tf.Graph, object]:
        """The user's graph that `runner` runs, and its session's ConfigProto."""
        for sess, state in list(self._sessions.items()):
            if state.runner is runner:
                return sess.graph, getattr(sess, "_config", None)
        raise TagError("elastic: the session of a failed step is gone")


__all__ = ["Distribution", "distribute"]
