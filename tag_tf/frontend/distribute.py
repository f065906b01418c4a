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

Modules: `target` (where compiled graphs run), `program` (the captured graph, the compiled program,
its runner), `session_values` (variables in and out of sessions, synthetic batches), `session_patch`
(the patch itself); this one holds the context, `Distribution`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tag_tf.errors import ClusterError, CompileError, TagError, VerificationError
from tag_tf.frontend.planning import PLANNED, Plan, check_request, request_key, resolve_strategy, stored_costs_for
from tag_tf.frontend.program import GraphInfo, Program, Runner, TaskStep, capture, graph_digest
from tag_tf.frontend.session_patch import bypass, install, uninstall
from tag_tf.frontend.session_values import read_variables, synthetic_batch, write_variables
from tag_tf.frontend.target import Target, resolve_target
from tag_tf.ir import opsets

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.compiler import Compiled
    from tag_tf.runtime.roles import Role

log = logging.getLogger("tag_tf.distribute")

FALLBACKS = ("error", "single")
BETWEEN = "between-graph"
VERIFY_STEPS = 2
VERIFY_TOLERANCE = 1e-4


def distribute(strategy: Any = "auto", topology: Any = None, cluster: Any = None, cache_dir: str | None = None,
               budget_s: float | None = None, verify: bool = False, exact_batch_stats: bool = False,
               fallback: str = "error", inference: bool = False,
               calibration: Any = "default", trusted_network: bool = False, sfb: bool = True
               ) -> Distribution | Callable:
    """Train the TF1 code run inside this context (or decorated function) distributed.

    strategy: "auto" (the best plan the planner gives), a baseline ("dp", "dp-p" with batch shares
        proportional to device capacity, "horovod" and "horovod-p" with fused gradient buckets,
        "heterog"; each also as "<name>+sfb", with sufficient factor broadcasting), a
        `tag_tf.strategy.Strategy`, or the path of a strategy JSON file.
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

    `@tag_tf.distribute` (no arguments) decorates a function with the defaults.
    """
    if callable(strategy) and not isinstance(strategy, (str, os.PathLike)):
        return Distribution()(strategy)
    return Distribution(strategy=strategy, topology=topology, cluster=cluster, cache_dir=cache_dir,
                        budget_s=budget_s, verify=verify, exact_batch_stats=exact_batch_stats,
                        fallback=fallback, inference=inference, calibration=calibration,
                        trusted_network=trusted_network, sfb=sfb)


@dataclasses.dataclass
class SessionState:
    runner: Runner | None = None
    # Iterator/table initialisations run before training: (targets, fetches, feeds) by name.
    replay: list[tuple[list[str], list[str], dict[str, Any]]] = dataclasses.field(default_factory=list)
    # Whether the user's session holds the compiled session's current variable values (runs on one
    # device use the user's session: it gets the trained values first).
    synced: bool = True
    # Reasons already logged for runs on one device.
    one_device_said: set[str] = dataclasses.field(default_factory=set)

class Distribution:
    """What `tag_tf.distribute(...)` returns: a context manager and a decorator.

    After use, `plans` lists the plan of every graph it compiled (`Plan.cache_hit` tells whether
    the plan came from the cache) and `programs` the compiled programs."""

    def __init__(self, *, strategy: Any = "auto", topology: Any = None, cluster: Any = None,
                 cache_dir: str | None = None, budget_s: float | None = None, verify: bool = False,
                 exact_batch_stats: bool = False, fallback: str = "error", inference: bool = False,
                 calibration: Any = "default", trusted_network: bool = False, sfb: bool = True):
        if fallback not in FALLBACKS:
            raise TagError(f"fallback={fallback!r}: expected one of {', '.join(map(repr, FALLBACKS))}")
        self.options = dict(strategy=strategy, topology=topology, cluster=cluster, cache_dir=cache_dir,
                            budget_s=budget_s, verify=verify, exact_batch_stats=exact_batch_stats,
                            fallback=fallback, inference=inference, calibration=calibration,
                            trusted_network=trusted_network, sfb=sfb)
        self.plans: list[Plan] = []
        self.programs: list[Program] = []
        self.target: Target | None = None
        self._graphs: weakref.WeakKeyDictionary[Any, tuple[GraphInfo, Program | None]] = weakref.WeakKeyDictionary()
        self._sessions: weakref.WeakKeyDictionary[Any, SessionState] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        # Graphs left undistributed by fallback="single" -> the reason.
        self._fallen_back: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._active = False
        self._log_handler: logging.Handler | None = None
        self._from_chief: list[dict] = []      # plans the chief sent that no graph has used yet

    # -- context / decorator -----------------------------------------------------------------------
    def __enter__(self) -> Distribution:
        if self._active:
            raise TagError("this tag_tf.distribute(...) context is already active")
        check_request(self.options["strategy"])      # a bad strategy fails here, not mid-training
        self.target = resolve_target(self.options["topology"], self.options["cluster"],
                                     self.options["trusted_network"])
        self._start_logging()
        if self.target.role is not None:
            try:
                self._join_cluster(self.target.role)     # a task the chief tells to serve ends here
            except BaseException:
                self._stop_logging()
                raise
        if self.target.discover:          # after logging starts: the topology found is reported
            from tag_tf.context import Options

            try:
                self.target = self.target.discovered(Options(cache_dir=self.options["cache_dir"]).cache_root())
            except BaseException:
                self._stop_logging()
                raise
        self._active = True
        install(self)
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        uninstall(self)
        self._active = False
        role = self.target.role if self.target is not None else None
        if exc_type is not None and role is not None and not role.is_chief:
            from tag_tf.runtime import roles

            roles.abandon_serving(role)       # a failed task's server goes with it: the chief names it
        failed: list[str] = []
        try:
            with bypass():
                for sess, state in list(self._sessions.items()):
                    if state.runner is not None:
                        if not getattr(sess, "_closed", True):
                            failed.extend(self._sync_back(sess, state.runner))
                        state.runner.close()
        finally:
            self._sessions = weakref.WeakKeyDictionary()
            self._stop_logging()
        if failed and exc_type is None:
            # The user's session would silently keep its pre-training values: never that.
            raise TagError(f"could not copy the trained variables back to the user's session on leaving "
                           f"tag_tf.distribute: {failed[0]}")

    # -- one script on every task (TF_CONFIG, ClusterResolver) -------------------------------------
    def _join_cluster(self, role: Role) -> None:
        """Every task serves its machine; the chief waits for the others and drives the run, any
        other task blocks until the chief ends it, then ends this process (0; 1 if the chief is lost)."""
        from tag_tf.runtime import roles

        self._server = roles.join(role)
        if role.is_chief:
            # Sessions on this server's own target run with an in-process master (no gRPC hop for
            # feeds and fetches).
            self.target = dataclasses.replace(self.target, local_server=self._server.target)
            roles.wait_for_tasks(role)
            return
        message = self._chief_plan(role)
        from tag_tf.frontend.target import cluster_target
        from tag_tf.topology.parse import topology_from_dict

        # The chief's topology: every task compiles for the same devices (no discovery here).
        topology = topology_from_dict(message["topology"], source="the chief's plan")
        self.target = dataclasses.replace(cluster_target(topology, role.spec, role), local_server=self._server.target)
        self._from_chief.append(message)
        roles.serve_at_exit(role, self._server)     # the chief may still use this server after our script ends

    def _chief_plan(self, role: Role) -> dict:
        """On a task other than the chief: the chief's plan for the next graph it compiles; the
        process ends here (as a serving task did before) when the chief drives every step itself or
        ends the run."""
        from tag_tf.runtime import roles

        code, message = roles.wait_for_plan(role, self._server)
        if message is None:
            log.info("tag_tf: task %d: the chief ended the run", role.task)
            raise SystemExit(code)
        idle = message["mode"] == BETWEEN and role.task not in message.get("tasks", [role.task])
        if message["mode"] != BETWEEN or idle:
            if idle:
                log.info("tag_tf: task %d has no part in the chief's plan (it runs on task(s) %s): it serves until the "
                         "chief ends the run", role.task, ", ".join(map(str, message["tasks"])))
            else:
                log.info("tag_tf: task %d serves; the chief drives every step (%s)", role.task, message["reason"])
            if roles.serves_at_exit(role):
                raise SystemExit(0)           # the exit handler serves until the chief ends the run
            if idle:                          # the chief waits for every task's script to end before its own
                with contextlib.suppress(ClusterError):   # the chief is gone: serve_until_done says so
                    roles.tell_chief(role, roles.FINISHED_QUEUE)
            raise SystemExit(roles.serve_until_done(role, self._server))
        return message

    def __call__(self, func: Callable) -> Callable:
        """As a decorator: every call runs in a fresh context with the same options."""
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Distribution(**self.options) as d:
                self.plans, self.programs = d.plans, d.programs
                return func(*args, **kwargs)
        return wrapper

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
    def owns(self, sess: Any) -> bool:
        state = self._sessions.get(sess)
        return state is not None and state.runner is not None

    def dispatch(self, sess: Any, original: Callable, targets: list, fetches: list, feeds: dict,
                 options: Any, run_metadata: Any) -> list[Any]:
        """One `_do_run` of a user session: pass it through, or run it on the compiled graph."""
        info = self._info(sess.graph)
        names = [op.name for op in targets] + [t.op.name for t in fetches]
        roots = info.training_roots(names)
        training = bool(roots)
        state = self._sessions.get(sess)
        if state is None or state.runner is None:
            if not roots and self.options["inference"]:
                roots = info.inference_roots([op.name for op in targets], [t.op.name for t in fetches])
            starts_queue = not roots and any(n in info.queue for n in names)
            if not roots and not starts_queue:
                # Remembered even before the graph has an optimizer (an iterator initialised first).
                if any(n in info.state_init for n in names):
                    with self._lock:
                        _remember(self._state(sess).replay, _by_name(targets, fetches, feeds))
                if info.updates and info.restore_prefixes and any(n in info.restores for n in names):
                    feeds = _readable_restore(feeds, info.restore_prefixes)
                return original(sess, None, targets, fetches, feeds, options, run_metadata)
            if sess.graph in self._fallen_back:
                return original(sess, None, targets, fetches, feeds, options, run_metadata)
            with self._lock:
                state = self._state(sess)
                if state.runner is None:
                    try:
                        program = self._program(sess.graph, info,
                                                info.every_training_root(sess.graph, roots) if training else roots,
                                                _feeds_by_name(feeds),
                                                [t.name for t in fetches], [op.name for op in targets])
                    except _NothingToSplit as e:
                        self._fallen_back[sess.graph] = str(e)
                        log.info("tag_tf: training graph on one device (the session's own): %s", e)
                        return original(sess, None, targets, fetches, feeds, options, run_metadata)
                    except TagError as e:
                        role = self.target.role
                        if self.options["fallback"] != "single" or (role is not None and not role.is_chief):
                            raise         # a task training alone would be the silent copy TF_CONFIG users fear
                        self._fallen_back[sess.graph] = str(e)
                        log.warning("tag_tf: not distributing this graph, training it on one device "
                                    "(fallback='single'): %s", e)
                        return original(sess, None, targets, fetches, feeds, options, run_metadata)
                    state.runner = self._migrate(sess, program, state)
        program = state.runner.program
        if state.runner.step is not None and not self.target.role.is_chief and any(n in info.saves for n in names):
            skipped = _skip_save(fetches, feeds)
            if skipped is not None:
                return skipped
        t, f, fd = _by_name(targets, fetches, feeds)
        reason = program.one_device_reason(t, f, fd, training)
        if reason is not None:
            return self._run_on_one_device(sess, state, original, (targets, fetches, feeds), options,
                                           run_metadata, reason, training)
        if roots and program.ir.training_updates() and not program.covers(roots):
            raise TagError(f"fetching {roots[0]!r} runs training updates (optimizer ops or writes of "
                           f"gradient-derived values) outside the train ops tag_tf compiled "
                           f"({program.ir.meta.train_op!r}); create every train op before the first training run")
        state.synced = False
        return state.runner.run(t, f, fd, options, run_metadata, training=training)

    def _run_on_one_device(self, sess: Any, state: SessionState, original: Callable,
                           run: tuple[list, list, dict], options: Any, run_metadata: Any, reason: str,
                           training: bool) -> list[Any]:
        """A run the compiled program cannot take (`Program.one_device_reason`) runs on the user's own
        session, on one device, with the trained values: they are copied there first; whatever the run
        writes to variables is copied back into every compiled copy. Values are the plain program's."""
        targets, fetches, feeds = run
        role = self.target.role
        if training and role is not None and len(role.spec.tasks) > 1:
            raise CompileError(f"cannot run this training step on one device in a cluster of "
                               f"{len(role.spec.tasks)} tasks: {reason}")
        runner = state.runner
        names = [op.name for op in targets] + [t.op.name for t in fetches]
        upstream = GraphInfo.upstream(sess.graph, names)
        inputs = [op.name for op in upstream if op.name in runner.program.ir and op.type.startswith(_STATEFUL_INPUTS)]
        if inputs:
            raise CompileError(f"cannot run this step on one device ({reason}): it reads input {inputs[0]!r}, whose "
                               f"position lives in the distributed session (a one-device run would read another "
                               f"copy); feed the values instead, or create the input after training")
        if reason not in state.one_device_said:
            state.one_device_said.add(reason)
            log.info("tag_tf: a %s run on one device (the trained values in this session): %s",
                     "training" if training else "non-training", reason)
        with bypass():
            if not state.synced:
                failed = self._sync_back(sess, runner)
                if failed:
                    raise TagError(f"could not copy the trained variables to this session for a run on one "
                                   f"device ({reason}): {failed[0]}")
                state.synced = True
            values = original(sess, None, targets, fetches, feeds, options, run_metadata)
            if any(opsets.is_variable_writer(op.type) or opsets.is_optimizer_update(op.type) for op in upstream):
                runner.program.io.load(runner.session, read_variables(sess, runner.program.ir))
        return values

    def _state(self, sess: Any) -> SessionState:
        state = self._sessions.get(sess)
        if state is None:
            state = self._sessions[sess] = SessionState()
        return state

    def _info(self, graph: Any) -> GraphInfo:
        entry = self._graphs.get(graph)
        if entry is not None and entry[0].version == graph.version:
            return entry[0]
        info = GraphInfo.of(graph)
        with self._lock:
            entry = self._graphs.get(graph)      # a program may have been stored meanwhile
            self._graphs[graph] = (info, entry[1] if entry else None)
        return info

    def session_closed(self, sess: Any) -> None:
        with self._lock:
            state = self._sessions.pop(sess, None)
        if state is not None and state.runner is not None:
            state.runner.close()

    # -- compile -----------------------------------------------------------------------------------
    def _program(self, graph: Any, info: GraphInfo, roots: list[str], feeds: dict[str, Any],
                 fetches: list[str], targets: Sequence[str] = ()) -> Program:
        """The program of `graph` (compiled on its first training run, shared by its sessions)."""
        entry = self._graphs.get(graph)
        if entry is not None and entry[1] is not None:
            return entry[1]
        from tag_tf.analysis import analyze
        from tag_tf.compiler import check_compilable, compile_strategy
        from tag_tf.context import Options, PassContext
        from tag_tf.ir import from_graph_def
        from tag_tf.profile.weights import reference_weights

        start = time.perf_counter()
        gd, meta, train_op, learned = capture(graph, roots, feeds)
        ir = from_graph_def(gd, meta, train_op=train_op)
        if not ir.meta.feeds:
            reason = ("it has no batch input (no placeholder of rank >= 1 or iterator output feeds its training; "
                      "scalar feeds are not batches): there is nothing to split over devices")
            role = self.target.role
            if role is None or len(role.spec.tasks) < 2:
                raise _NothingToSplit(reason)
            raise CompileError(f"cannot train graph {ir.fingerprint} on {len(role.spec.tasks)} tasks: {reason}")
        ctx = PassContext(Options(cache_dir=self.options["cache_dir"],
                                  exact_batch_stats=self.options["exact_batch_stats"]))
        batch = None
        if ir.meta.batch_size is None:     # dynamic batch: plan at the size actually fed
            sizes = [np.shape(feeds[f])[0] for f in ir.meta.feeds if f in feeds and np.ndim(feeds[f])]
            batch = int(sizes[0]) if sizes else None
        analysis = analyze(ctx, ir, batch_size=batch, weight_fn=reference_weights)
        check_compilable(analysis.graph)   # before planning: a refusal leaves no cached plan
        _check_sized(analysis)
        target = self.target
        target.check()                     # an unreachable cluster fails here, naming the task
        role = target.role
        message = None
        as_written = False
        if role is not None and not role.is_chief:
            message = self._from_chief.pop(0) if self._from_chief else self._chief_plan(role)
            plan, fetches, roots = self._chiefs_choice(message, ir.fingerprint)
            as_written = bool(message.get("as_written", False))
        else:
            costs = None
            if request_key(self.options["strategy"]) in PLANNED:     # only planning reads the profile database
                costs = stored_costs_for(analysis, target.topology,
                                         os.path.join(ctx.options.cache_root(), "profiles"))
            plan = resolve_strategy(analysis, target.topology, self.options["strategy"],
                                    cache_dir=ctx.options.cache_root(),
                                    budget_s=self._search_budget(start),
                                    calibration=self.options["calibration"], costs=costs, sfb=self.options["sfb"],
                                    drive_s=drive_cost(target, analysis))
            if costs is not None and costs.runtimes:
                as_written = costs.as_written
                for dt, fit in sorted(costs.runtimes.items()):
                    log.info("tag_tf: measured on %s: %s", dt, fit.describe())
        fetches = [f for f in fetches if f.rpartition(":")[0] in ir]
        roots = [r for r in dict.fromkeys([*roots, *targets]) if r in ir]     # the first run's ops, all compiled
        alone = target.alone_on_chief({d for g in plan.strategy.groups for d in g.devices})
        if alone is not None:
            log.info("tag_tf: the plan keeps every op on the chief's machine: it runs in this process's own "
                     "session (no round trip through the server per step)")
            target = alone
        compiled = compile_strategy(ctx, analysis, plan.strategy, target.devices, fetches=fetches, run_ops=roots,
                                    check=True)    # postconditions run, not only documented: DAG, fetches' shapes
        if message is not None and graph_digest(ir, compiled) != message["digest"]:
            raise ClusterError(f"task {role.task} compiled another graph than the chief from the same plan (graph "
                               f"{ir.fingerprint}): every task must build the same graph and feed batches of "
                               f"the same size")
        if self.options["verify"] and message is None:       # the chief verifies for every task
            self._verify(analysis, compiled, feeds, target)
        program = Program(ir, analysis, compiled, plan, target)
        program.learned_shapes = learned
        program.as_written = as_written
        program.first_run = (fetches, roots)
        self._graphs[graph] = (info, program)
        self.plans.append(plan)
        self.programs.append(program)
        kind = "training" if ir.training_updates() else "inference"
        log.info("tag_tf: %s graph %s (%d ops, root %r) on %d device(s) of %r with plan %s; "
                 "compiled in %.2f s", kind, ir.fingerprint, len(ir), ir.meta.train_op, target.topology.num_devices,
                 target.topology.name, plan.describe(), time.perf_counter() - start)
        return program

    def _search_budget(self, start: float) -> float | None:
        """What a given planning budget leaves for the search once capture and analysis (begun at
        `start`) have had their part (none left: the best baseline); None: the planner's default."""
        budget = self.options["budget_s"]
        return None if budget is None else max(0.0, budget - (time.perf_counter() - start))

    def _verify(self, analysis: Analysis, compiled: Compiled, feeds: dict[str, Any], target: Target) -> None:
        from tag_tf.runtime.equivalence import check_equivalence

        batch = dict(feeds)
        batch.update({name: value for name, value in synthetic_batch(analysis).items() if name not in batch})
        kwargs = {}
        if target.cluster is not None:
            kwargs = dict(target=target.session_target, config=target.config())
        with bypass():
            result = check_equivalence(analysis, compiled, lambda step: batch, VERIFY_STEPS,
                                       tolerance=VERIFY_TOLERANCE, **kwargs)
        if not result.ok:
            worst = max(result.per_variable, key=result.per_variable.get) if result.per_variable else "?"
            raise VerificationError(f"verify: the distributed graph does not train like the original: "
                                    f"max_rel_diff {result.max_rel_diff:.3g} > {result.tolerance:.3g} after "
                                    f"{VERIFY_STEPS} steps (worst variable {worst!r}); not training with it")
        log.info("tag_tf: verified: max_rel_diff %.3g after %d steps", result.max_rel_diff, VERIFY_STEPS)

    # -- moving state between sessions -------------------------------------------------------------
    def _migrate(self, sess: Any, program: Program, state: SessionState) -> Runner:
        """Start a compiled session for `sess`: replay iterator/table initialisations, then copy every
        initialised variable's value from the user's session into all its copies. In a cluster, the
        chief then tells the other tasks whether each drives its own part of every step."""
        user_config = getattr(sess, "_config", None)
        runner = Runner(program, program.target.session(program.graph, user_config, as_written=program.as_written))
        role = self.target.role
        if role is not None and not role.is_chief:
            from tag_tf.runtime import roles

            # The chief has loaded every copy (this task's too) before its message; a later session of
            # the same graph waits for the chief to load that session's values.
            if program.task_sessions:
                code, message = roles.wait_for_plan(role, self._server)
                if message is None or message["mode"] != "loaded" or message["graph"] != program.ir.fingerprint:
                    raise ClusterError(f"task {role.task}: a new session of graph {program.ir.fingerprint} found the "
                                       f"chief elsewhere ({'ended' if message is None else message['mode']}); every "
                                       f"task must open the same sessions in the same order")
            program.task_sessions += 1
            state.replay.clear()
            runner.step = self._task_step(program, role.task, user_config)
            roles.tell_chief(role, roles.READY_QUEUE)
            log.info("tag_tf: task %d drives its own part of each step (between-graph)", role.task)
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
        if role is not None and len(role.spec.tasks) > 1:
            runner.step = self._share_plan(program, role, user_config)
        return runner

    def _share_plan(self, program: Program, role: Role, user_config: Any) -> TaskStep | None:
        """On the chief, once a session's values are loaded: the first time, `_decide`; later sessions
        of a between-graph program tell the tasks their copies are loaded. Returns the chief's part
        once every task has built its own (ClusterError naming one that did not)."""
        from tag_tf.runtime import roles

        if program.between is None:
            step = self._decide(program, role, user_config)
        elif program.between:
            step = self._task_step(program, role.task, user_config)
            roles.send_plan(role, {"mode": "loaded", "graph": program.ir.fingerprint})
        else:
            return None
        if step is not None:
            try:
                roles.wait_for_tokens(role, roles.READY_QUEUE, roles.READY_DEADLINE_S, "build its part of each step",
                                      tasks=program.part_tasks)
            except BaseException:
                step.close()
                raise
        return step

    # -- between-graph execution (one script on every task) ----------------------------------------
    def _decide(self, program: Program, role: Role, user_config: Any) -> TaskStep | None:
        """On the chief: tell every other task this program's plan, and whether each task drives its own
        part of every step (between-graph; returns the chief's part) or the chief drives them all."""
        from tag_tf.compiler.localize import NotLocal
        from tag_tf.runtime import roles

        reason, step = "", None
        if program.target.cluster is None:
            reason = "the plan keeps every op on the chief's machine"
        elif roles.chief_drives(role):
            reason = "an earlier graph of this run was driven by the chief"
        elif os.environ.get("TAG_TF_BETWEEN_GRAPH", "1") == "0":
            reason = "TAG_TF_BETWEEN_GRAPH=0"
        else:
            try:
                step = self._task_step(program, role.task, user_config)
            except NotLocal as e:
                reason = str(e)
        fetches, roots = program.first_run
        message = {"mode": BETWEEN if step is not None else "chief", "reason": reason, "graph": program.ir.fingerprint,
                   "strategy": program.plan.strategy.to_dict(), "topology": program.target.topology.to_dict(),
                   "fetches": fetches, "run_ops": roots, "digest": graph_digest(program.ir, program.compiled),
                   "as_written": program.as_written, "tasks": list(program.part_tasks or ())}
        program.between = step is not None
        if step is None:
            roles.set_chief_drives(role)
            log.info("tag_tf: the chief drives every step on every task (%s)", reason)
        else:
            roles.set_between_graph(role)
            log.info("tag_tf: every task drives its own part of each step (between-graph)")
        try:
            roles.send_plan(role, message)
        except BaseException:
            if step is not None:
                step.close()
            raise
        return step

    def _task_step(self, program: Program, task: int, user_config: Any) -> TaskStep:
        """This task's own part of every training step (NotLocal when the plan has edges between
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
        return TaskStep(parts[task], lambda graph: self.target.task_session(graph, task, user_config,
                                                                            as_written=program.as_written))

    def _chiefs_choice(self, message: dict, fingerprint: str) -> tuple[Plan, list[str], list[str]]:
        """On a task other than the chief: the chief's plan for this graph, with its first run."""
        from tag_tf.strategy import Strategy

        if message["graph"] != fingerprint:
            raise ClusterError(f"task {self.target.role.task} trains graph {fingerprint} but the chief trains graph "
                               f"{message['graph']}: every task must run the same script and build the same graph")
        strategy = Strategy.from_dict(message["strategy"], source="the chief's plan")
        return Plan(strategy, "chief"), list(message["fetches"]), list(message["run_ops"])

    def _sync_back(self, sess: Any, runner: Runner) -> list[str]:
        """Leaving the context with the user's session still open: give it the trained values, so code
        after the context sees them. Uses each variable's initializer with its value fed. Returns the
        failures (the caller closes every session first, then raises)."""
        try:
            values = runner.program.io.read(runner.session)
            write_variables(sess, runner.program.ir, values)
        except Exception as e:
            log.error("tag_tf: could not copy trained variables back to the session: %s", e)
            return [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
        return []


def drive_cost(target: Any, analysis: Any) -> float:
    """What a plan needing one driver pays per step and per other task (Target.drive_s), where this
    graph's whole-replica plans could run between-graph; 0 where no plan of it can (every plan pays)."""
    from tag_tf.compiler.localize import ONE_DRIVER_OPS

    if target.drive_s <= 0 or any(op.type in ONE_DRIVER_OPS for op in analysis.graph):
        return 0.0
    return float(target.drive_s)


# Inputs whose state (a position in the data) lives in the session that runs them.
_STATEFUL_INPUTS = ("IteratorGetNext", "QueueDequeue", "ReaderRead")


def _check_sized(analysis: Analysis) -> None:
    """CompileError, before training, for a graph whose batch cannot be split consistently because a
    sparse or value-sized value of unknown batch size meets the batch (`unsized_batch_meetings`)."""
    from tag_tf.analysis.analyzer import unsized_batch_meetings

    meetings = unsized_batch_meetings(analysis)
    if meetings:
        op, unsized, batch = meetings[-1]       # the first in the forward pass
        raise CompileError(
            f"cannot split this graph's batch consistently: op {op!r} combines {unsized!r}, whose size along the "
            f"batch axis follows sparse values (a feature column's weighted sum, an embedding_lookup_sparse: "
            f"tag_tf computes it whole), with the batch tensor {batch!r}, and its gradient compares their shapes, "
            f"which differ on every replica; add a dense (numeric) column to the same weighted sum, or train this "
            f"graph undistributed (fallback='single')")


class _NothingToSplit(TagError):
    """A training graph whose best plan is one device whatever the cluster (no batch input)."""


def _remember(replay: list, run: tuple[list[str], list[str], dict[str, Any]]) -> None:
    """Add an initialisation run to be replayed; the same run again replaces its earlier record
    (an iterator re-initialised every epoch is replayed once, with its latest feeds)."""
    key = (run[0], run[1])
    replay[:] = [r for r in replay if (r[0], r[1]) != key]
    replay.append(run)


def _by_name(targets: Sequence[Any], fetches: Sequence[Any], feeds: Mapping[Any, Any]
             ) -> tuple[list[str], list[str], dict[str, Any]]:
    return [op.name for op in targets], [t.name for t in fetches], _feeds_by_name(feeds)


def _skip_save(fetches: Sequence[Any], feeds: Mapping[Any, Any]) -> list[Any] | None:
    """On a task other than the chief, a Saver's save run returns the path it was given without
    writing: the chief writes the checkpoint (tasks share one trained state), and two tasks writing
    one path would corrupt it. None when the run is not a plain save (it then runs as asked)."""
    by_name = _feeds_by_name(feeds)
    values = []
    for t in fetches:
        if t.op.type != "Identity" or t.op.inputs[0].name not in by_name:
            return None
        value = by_name[t.op.inputs[0].name]
        value = value.item() if isinstance(value, np.ndarray) else value
        values.append(value.encode() if isinstance(value, str) else value)     # as TensorFlow returns strings
    for value in values:
        # The Saver then writes its checkpoint list beside the checkpoint: where the save would have
        # made the directory, make it (this task's file system may be its own).
        path = value.decode() if isinstance(value, bytes) else str(value)
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    log.info("tag_tf: this task's checkpoint save skipped (the chief writes it)")
    return values


def _readable_restore(feeds: Mapping[Any, Any], prefixes: frozenset[str]) -> Mapping[Any, Any]:
    """A restore's feeds with each fed checkpoint path replaced by the newest readable checkpoint
    (itself, unless it is damaged): a run resumes from a checkpoint that reads back whole or not at all."""
    from tag_tf.runtime.checkpoints import readable_checkpoint

    out = dict(feeds)
    for key, value in feeds.items():
        if (key.deref() if hasattr(key, "deref") else key).name not in prefixes:
            continue
        path = value.item() if isinstance(value, np.ndarray) else value
        path = path.decode() if isinstance(path, bytes) else str(path)
        chosen = readable_checkpoint(path)
        if chosen != path:
            out[key] = np.asarray(chosen, dtype=value.dtype) if isinstance(value, np.ndarray) else chosen
    return out


def _feeds_by_name(feeds: Mapping[Any, Any]) -> dict[str, Any]:
    # TF keys validated feeds by tensor reference (`Tensor.ref()`).
    return {(k.deref() if hasattr(k, "deref") else k).name: v for k, v in feeds.items()}


__all__ = ["Distribution", "distribute"]
