"""A captured training graph to a compiled `Program`: capture, analysis, the plan (planned here, or
the chief's), compilation and, with `verify`, the equivalence check (`compile_program`)."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.errors import ClusterError, CompileError, TagError, VerificationError
from tag_tf.frontend.options import DistributeOptions
from tag_tf.frontend.planning import PLANNED, Plan, request_key, resolve_strategy, stored_costs_for
from tag_tf.frontend.program import Program, capture, graph_digest
from tag_tf.frontend.session_patch import bypass
from tag_tf.frontend.session_values import synthetic_batch

if TYPE_CHECKING:
    import tensorflow as tf

    from tag_tf.analysis import Analysis
    from tag_tf.compiler import Compiled
    from tag_tf.context import PassContext
    from tag_tf.frontend.target import Target
    from tag_tf.frontend.tasks import ClusterTasks
    from tag_tf.ir.graph import Graph
    from tag_tf.runtime.plan_message import PlanMessage

log = logging.getLogger("tag_tf.distribute")

VERIFY_STEPS = 2
VERIFY_TOLERANCE = 1e-4


class NothingToSplit(TagError):
    """A training graph whose best plan is one device whatever the cluster (no batch input)."""


def compile_program(graph: tf.Graph, roots: Sequence[str], feeds: Mapping[str, np.ndarray], fetches: Sequence[str],
                    targets: Sequence[str], *, options: DistributeOptions, target: Target,
                    tasks: ClusterTasks | None) -> Program:
    """The program of `graph`'s first training run (`roots`: the train ops it compiles; `feeds`,
    `fetches`, `targets`: that run's, by name). On the chief or alone the plan is resolved here
    (`options.strategy`: cache, planner or given); on another task it is the chief's (`tasks`)."""
    from tag_tf.compiler import check_compilable, compile_strategy

    start = time.perf_counter()
    # The planning budget counts from here: capture and analysis use part of it, the search the rest.
    deadline = Deadline.never() if options.budget_s is None else Deadline.after(options.budget_s)
    gd, meta, train_op, learned = capture(graph, roots, feeds)
    ir = _ir_with_batch(gd, meta, train_op, target)
    ctx, analysis = _analysed(ir, feeds, options)
    check_compilable(analysis.graph)   # before planning: a refusal leaves no cached plan
    check_sized(analysis)
    target.check()                     # an unreachable cluster fails here, naming the task
    message = tasks.next_plan() if tasks is not None and not tasks.role.is_chief else None
    if tasks is not None and message is not None:
        plan, fetch_list, root_list = tasks.chiefs_choice(message, ir.fingerprint)
        as_written = message.as_written
    else:
        plan, as_written = _planned(ctx, analysis, options, target, deadline)
        fetch_list, root_list = list(fetches), list(roots)
    fetch_list = [f for f in fetch_list if f.rpartition(":")[0] in ir]
    root_list = [r for r in dict.fromkeys([*root_list, *targets]) if r in ir]     # the first run's ops, all compiled
    alone = target.alone_on_chief({d for g in plan.strategy.groups for d in g.devices})
    if alone is not None:
        log.info("tag_tf: the plan keeps every op on the chief's machine: it runs in this process's own "
                 "session (no round trip through the server per step)")
        target = alone
    compiled = compile_strategy(ctx, analysis, plan.strategy, target.devices, fetches=fetch_list, run_ops=root_list,
                                check=True)    # postconditions run, not only documented: DAG, fetches' shapes
    _check_same_graph(message, ir, compiled, tasks)
    if options.verify and message is None:       # the chief verifies for every task
        verify(analysis, compiled, feeds, target)
    program = Program(ir, analysis, compiled, plan, target)
    program.learned_shapes = learned
    program.as_written = as_written
    program.first_run = (fetch_list, root_list)
    kind = "training" if ir.training_updates() else "inference"
    log.info("tag_tf: %s graph %s (%d ops, root %r) on %d device(s) of %r with plan %s; "
             "compiled in %.2f s", kind, ir.fingerprint, len(ir), ir.meta.train_op, target.topology.num_devices,
             target.topology.name, plan.describe(), time.perf_counter() - start)
    return program


def _ir_with_batch(gd: object, meta: object, train_op: str | None, target: Target) -> Graph:
    """The captured graph's IR; NothingToSplit (alone) or CompileError (a cluster) without a batch input."""
    from tag_tf.ir import from_graph_def

    ir = from_graph_def(gd, meta, train_op=train_op)
    if ir.meta.feeds:
        return ir
    reason = ("it has no batch input (no placeholder of rank >= 1 or iterator output feeds its training; "
              "scalar feeds are not batches): there is nothing to split over devices")
    role = target.role
    if role is None or len(role.spec.tasks) < 2:
        raise NothingToSplit(reason)
    raise CompileError(f"cannot train graph {ir.fingerprint} on {len(role.spec.tasks)} tasks: {reason}")


def _analysed(ir: Graph, feeds: Mapping[str, np.ndarray], options: DistributeOptions
              ) -> tuple[PassContext, Analysis]:
    from tag_tf.analysis import analyze
    from tag_tf.context import Options, PassContext
    from tag_tf.profile.weights import reference_weights

    ctx = PassContext(Options(cache_dir=options.cache_dir, exact_batch_stats=options.exact_batch_stats))
    batch = None
    if ir.meta.batch_size is None:     # dynamic batch: plan at the size actually fed
        sizes = [np.shape(feeds[f])[0] for f in ir.meta.feeds if f in feeds and np.ndim(feeds[f])]
        batch = int(sizes[0]) if sizes else None
    return ctx, analyze(ctx, ir, batch_size=batch, weight_fn=reference_weights)


def _planned(ctx: PassContext, analysis: Analysis, options: DistributeOptions, target: Target,
             deadline: Deadline) -> tuple[Plan, bool]:
    """The plan of `options.strategy` (by `deadline`: what capture and analysis left of
    the budget), and whether the profile database says to run it as written.

    The database is read for every request: planning judges plans with its op times, and whatever
    the plan, its runtime fit says how the program runs (a given strategy file ran with TensorFlow's
    rewrites where they made the transformer's steps 2.6x slower: 370 ms against 180 ms)."""
    costs = stored_costs_for(analysis, target.topology, os.path.join(ctx.options.cache_root(), "profiles"))
    budget = max(0.0, deadline.left()) if deadline.bounded else None
    plan = resolve_strategy(analysis, target.topology, options.strategy, cache_dir=ctx.options.cache_root(),
                            budget_s=budget, calibration=options.calibration,
                            costs=costs if request_key(options.strategy) in PLANNED else None, sfb=options.sfb,
                            drive_s=drive_cost(target, analysis))
    as_written = False
    if costs.runtimes:
        as_written = costs.as_written
        for dt, fit in sorted(costs.runtimes.items()):
            log.info("tag_tf: measured on %s: %s", dt, fit.describe())
    return plan, as_written


def _check_same_graph(message: PlanMessage | None, ir: Graph, compiled: Compiled, tasks: ClusterTasks | None) -> None:
    if message is not None and tasks is not None and graph_digest(ir, compiled) != message.digest:
        raise ClusterError(f"task {tasks.role.task} compiled another graph than the chief from the same plan (graph "
                           f"{ir.fingerprint}): every task must build the same graph and feed batches of the same size")


def verify(analysis: Analysis, compiled: Compiled, feeds: Mapping[str, np.ndarray], target: Target) -> None:
    """`verify=True`: VerificationError unless the compiled graph trains like the original for
    VERIFY_STEPS steps on the first fed batch (synthetic values for the inputs it did not feed)."""
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
        worst = max(result.per_variable, key=lambda v: result.per_variable[v]) if result.per_variable else "?"
        raise VerificationError(f"verify: the distributed graph does not train like the original: "
                                f"max_rel_diff {result.max_rel_diff:.3g} > {result.tolerance:.3g} after "
                                f"{VERIFY_STEPS} steps (worst variable {worst!r}); not training with it")
    log.info("tag_tf: verified: max_rel_diff %.3g after %d steps", result.max_rel_diff, VERIFY_STEPS)


def judged(analysis: Analysis, target: Target, options: DistributeOptions, budget_s: float) -> float:
    """The simulated seconds per step of the plan `options.strategy` resolves to on `target`, as
    `compile_program` would plan it (the plan cache, the profile database's costs, the client's part
    of a step): an elastic run's verdict on a larger set of machines (nan where it cannot be planned)."""
    import math

    from tag_tf.context import Options
    from tag_tf.frontend.planning import client_for, simulator

    root = Options(cache_dir=options.cache_dir).cache_root()
    costs = stored_costs_for(analysis, target.topology, os.path.join(root, "profiles"))
    drive = drive_cost(target, analysis)
    try:
        plan = resolve_strategy(analysis, target.topology, options.strategy, cache_dir=root, budget_s=budget_s,
                                calibration=options.calibration,
                                costs=costs if request_key(options.strategy) in PLANNED else None, sfb=options.sfb,
                                drive_s=drive)
    except TagError as e:
        log.debug("tag_tf: elastic: no plan for %s: %s", target.topology.name, e)
        return math.nan
    sim = simulator(analysis, target.topology, options.calibration, costs)
    client = client_for(analysis, target.topology, drive)
    return float((sim.with_client(client) if client is not None else sim).simulate(plan.strategy).iteration_time_s)


def drive_cost(target: Target, analysis: Analysis) -> float:
    """What a plan needing one driver pays per step and per other task (Target.drive_s), where this
    graph's whole-replica plans could run between-graph; 0 where no plan of it can (every plan pays)."""
    from tag_tf.compiler.localize import ONE_DRIVER_OPS

    if target.drive_s <= 0 or any(op.type in ONE_DRIVER_OPS for op in analysis.graph):
        return 0.0
    return float(target.drive_s)


def check_sized(analysis: Analysis) -> None:
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


__all__ = ["NothingToSplit", "VERIFY_STEPS", "VERIFY_TOLERANCE", "check_sized", "compile_program", "drive_cost",
           "verify"]
