"""Which strategy a graph trains with: resolving the user's request, the planner, and the plan cache.

A request is "auto" (the best plan the planner can give), a baseline ("dp", "dp-p", "horovod",
"horovod-p", "heterog", each also with sufficient factor broadcasting: "dp+sfb", ...), a `Strategy`,
or the path of a strategy JSON file. Planned strategies
(everything but objects and files) are cached on disk, keyed by the graph's
fingerprint, the topology's fingerprint and the request, so the second run of a script does not plan
again. Given strategies (objects, files) are only validated.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Union

from tag_tf.context import CACHE_ENV, default_cache_dir  # noqa: F401  (re-exported: the plan cache's root)
from tag_tf.datafiles import write_atomic
from tag_tf.deadline import Deadline
from tag_tf.errors import StrategyError
from tag_tf.placement.layout import validated_duplicates
from tag_tf.search.registry import Names, baseline_names, fallback_baselines, whole_replica_baselines
from tag_tf.sim.client import Client, fed_bytes, feeds_of
from tag_tf.strategy import SfbCut, Strategy

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.localmachine.model import LocalSimulator
    from tag_tf.localmachine.runtime import LocalSetup
    from tag_tf.profile.db import ProfileDB
    from tag_tf.profile.stored import StoredCosts
    from tag_tf.search.local_search import SearchResult
    from tag_tf.search.mcts import MctsOptions, MctsResult
    from tag_tf.search.sfb import SfbOutcome
    from tag_tf.sim.calibration import CalibrationChoice
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.spec import Topology

log = logging.getLogger("tag_tf.planning")

# What a user may ask `distribute` to train with: a PLANNED name, a strategy JSON file or a Strategy.
StrategyRequest = Union[str, "os.PathLike[str]", Strategy]

# Every list of baselines below follows search.registry.REGISTRY (the one list of them).
BASELINE_REQUESTS = Names(baseline_names)
SFB = "+sfb"                    # a baseline with sufficient factor broadcasting applied (search/sfb.py)
PLANNED = Names(lambda: ("auto", *baseline_names(), *(b + SFB for b in baseline_names())))
CACHE_FORMAT = "tag_tf.plan/2"
# Bumped whenever the planner's choices change for the same inputs: older cached plans then miss.
PLANNER_VERSION = "mcts/8"      # 2: group refinement, per-plan shares, balanced groups; 3: SFB; 4: the trained GNN prior; 5: pure MCTS by default (gnn_wallclock); 6: the GPU kernel model (TF32, waves, Winograd); 7: the client's feed and drive on task-driven clusters; 8: SFB tries gradients in pieces

@dataclasses.dataclass(frozen=True)
class Plan:
    """A resolved strategy and where it came from."""

    strategy: Strategy
    request: str                 # one of PLANNED | "file:<path>" | "strategy:<fingerprint>"
    cache_hit: bool = False      # the strategy was read from the plan cache (no planning)
    cache_path: str | None = None
    seconds: float = 0.0         # time spent planning (0 on a cache hit)

    def describe(self) -> str:
        name = self.strategy.name or "strategy"
        where = "plan cache hit" if self.cache_hit else (
            f"planned in {self.seconds:.2f} s" if self.request in PLANNED else "given")
        used = sorted({d for g in self.strategy.groups for d in g.devices})
        shares = [self.strategy.shares[d] for d in used] if self.strategy.shares is not None else None
        if len(used) == 1:
            where += f"; one device ({used[0]})"
        elif shares is not None and max(shares) > min(shares) * (1 + 1e-6):
            where += "; batch shares " + "/".join(f"{x / sum(shares):.2f}" for x in shares)
        return f"{name} ({where})"


# ---------------------------------------------------------------------------------------------
# Baselines and the "auto" choice
# ---------------------------------------------------------------------------------------------
DEFAULT_BUDGET_S = 30.0
# Without an explicit budget, `auto` ends its tree search once converged (no better plan for this
# long, or for as long as the best took to find): a small graph on 2 devices plans in seconds.
DEFAULT_PATIENCE_S = 3.0
# Of a planning budget, the part held back for sufficient factor broadcasting after the search
# (one MILP per synchronised gradient, for the plan and each baseline); it also gets what an early
# converged search leaves.
SFB_SHARE = 0.2
# Of the search's part, at most this much for solving SFB on data parallelism before the search
# (`sfb_seed`): the cuts the tree judges its plans with.
SFB_SEED_SHARE = 0.1


def tf32_enabled() -> bool:
    """Whether this process's TensorFlow runs float32 matmuls and convolutions in TF32 on GPUs that
    have it (its default; a program turns it off with
    `tf.config.experimental.enable_tensor_float_32_execution(False)`, `--no-tf32` on the CLI)."""
    import tensorflow as tf

    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def simulator(analysis: Analysis, topology: Topology, calibration: CalibrationChoice = "default",
              costs: StoredCosts | None = None) -> Simulator:
    """The simulator plans are judged with: `calibration`'s physics, op times from `costs` (the
    profile database's StoredCosts: measured profiles, calibrated constants) where it has them, GPU
    matmuls and convolutions in the math mode this process's TensorFlow runs them in."""
    from tag_tf.profile.costmodel import CostModel
    from tag_tf.sim.simulator import Simulator

    model = costs.model if costs is not None else CostModel()
    if not tf32_enabled():
        model = model.with_tf32(False)
    if costs is None:
        return Simulator(analysis, topology, calibration=calibration, cost_model=model)
    return Simulator(analysis, topology, calibration=calibration, profile=costs.profiles, cost_model=model)


LOCAL_CALIBRATION = "local"


def local_setup(topology: Topology) -> LocalSetup:
    """The local machine model's setup (`LocalSetup`) that `topology` describes, or StrategyError."""
    from tag_tf.localmachine.runtime import LocalSetup

    counts = {len(m.gpus) for m in topology.machines}
    if any(d.type != "cpu" for d in topology.devices) or len(counts) != 1:
        raise StrategyError(f"calibration {LOCAL_CALIBRATION!r}: topology {topology.name!r} is not this machine's "
                            f"CPU devices (local:N, or cpu-PxN for P local server processes)")
    return LocalSetup(len(topology.machines), counts.pop())


def local_machine_simulator(analysis: Analysis, topology: Topology, model: str, build_kwargs: dict[str, Any],
                            db: ProfileDB | str | os.PathLike[str] | None = None, *,
                            use_db: bool = True, runtime: str = "t1s2-eigen", between_graph: bool = False
                            ) -> LocalSimulator:
    """The local machine model's simulator (`tag_tf.localmachine.model`) of a zoo model on this machine's
    CPUs: `topology` is local:N (one process) or cpu-PxN (P local server processes: driven by one
    client, or `between_graph` as TF_CONFIG tasks). Its op profile and machine measurements come
    from the profile database (measured now and stored the first time); they describe `runtime`
    (a tag of `tag_tf.localmachine.runtime.RUNTIMES`: "t1s2-eigen", the pinned runtime, or
    "tfdefault", TensorFlow's defaults), so the process must have called
    `tag_tf.localmachine.runtime.configure_runtime(that runtime)` before importing TensorFlow.
    `use_db=False`: measured now and stored nowhere (`tag-tf plan --no-profiles`)."""
    from tag_tf.localmachine import model as lm
    from tag_tf.profile.db import ProfileDB

    if runtime not in lm.RUNTIMES:
        raise StrategyError(f"local runtime {runtime!r}: one of {', '.join(lm.RUNTIMES)}")
    setup = local_setup(topology)
    if not use_db:           # measured now, kept nowhere
        db = None
    elif db is None or isinstance(db, (str, os.PathLike)):
        db = ProfileDB(db)
    kwargs = {k: v for k, v in build_kwargs.items() if k != "batch_size"}
    return lm.local_simulator(analysis, setup.num_devices, setup.processes, db=db,
                              model=lm.ZooModel.of(model, **kwargs), runtime=lm.RUNTIMES[runtime],
                              between_graph=between_graph and setup.processes > 1)


def stored_costs_for(analysis: Analysis, topology: Topology, db: ProfileDB | str | os.PathLike[str] | None = None,
                     rebuild: Callable[[int], str] | None = None) -> StoredCosts:
    """What the profile database `db` (default: $TAG_TF_CACHE_DIR/profiles) holds for this graph on
    this topology's device types; `rebuild(b)` is the program's fingerprint at batch size b."""
    from tag_tf.profile.db import ProfileDB
    from tag_tf.profile.stored import stored_costs
    from tag_tf.sim.prepare import device_types

    db = db if db is not None and not isinstance(db, (str, os.PathLike)) else ProfileDB(db)
    fingerprints = {analysis.graph.fingerprint, analysis.graph_b1.fingerprint, analysis.graph_b2.fingerprint}
    return stored_costs(db, device_types(topology), fingerprints, rebuild)


def baseline(name: str, analysis: Analysis, topology: Topology, budget_s: float | None = None,
             calibration: CalibrationChoice = "default", costs: StoredCosts | None = None, sim: Simulator | None = None
             ) -> Strategy:
    """The named baseline (search.registry.REGISTRY) for this analysis on this topology, stamped
    with both; a searched one ("heterog", "best-subset") judged by `sim` where given (the simulator
    a search judged it with), else by `calibration`'s physics and `costs`, within `budget_s`."""
    from tag_tf.search import registry

    if name.endswith(SFB):
        from tag_tf.search.sfb import apply_sfb

        base = baseline(name[: -len(SFB)], analysis, topology, budget_s, calibration, costs, sim)
        outcome = apply_sfb(sim if sim is not None else simulator(analysis, topology, calibration, costs), base)
        log.info("%s: SFB replaces %d of %d gradient synchronisations, %.3g -> %.3g ms (simulated)", name,
                 outcome.kept, len(outcome.solutions), outcome.before_s * 1e3, outcome.after_s * 1e3)
        return dataclasses.replace(outcome.strategy, name=name)
    try:
        strategy = registry.make_baseline(
            name, len(analysis.grouping.groups), topology,
            lambda: sim if sim is not None else simulator(analysis, topology, calibration, costs),
            DEFAULT_BUDGET_S if budget_s is None else budget_s)
    except ValueError as e:
        raise StrategyError(str(e)) from None
    return dataclasses.replace(strategy, graph=analysis.graph.fingerprint, topology=topology.fingerprint)


@dataclasses.dataclass(frozen=True)
class Search:
    """A finished plan search: its result (an MctsResult or a local SearchResult, with SFB applied
    when asked), the SFB outcome, and what the whole search cost."""

    result: MctsResult | SearchResult
    sfb: SfbOutcome | None       # None without SFB
    simulations: int
    seconds: float

    @property
    def found(self) -> bool:
        return bool(self.result.found)


def search(sim: Simulator, topology: Topology, *, method: str = "mcts", options: MctsOptions | None = None,
           prior: str | None = None,
           weights: str | None = None, sfb: bool = True) -> Search:
    """The strategy creator, as `auto` and `tag-tf plan` both run it: MCTS (`options`: MctsOptions;
    `prior`: by default search.priors.default_prior: pure MCTS, or the shipped GNN on request)
    or the greedy local search ("local", for the same budget), then (`sfb`) sufficient factor
    broadcasting where it simulates faster.

    `options.budget_s` bounds the whole: with SFB, the search has SFB_SHARE of it less and SFB
    what the search left; past the budget, SFB keeps what it has solved."""
    from tag_tf.search.mcts import MctsOptions, mcts_search

    options = options if options is not None else MctsOptions()
    deadline = Deadline.after(options.budget_s)
    searched = deadline.share(1.0 - SFB_SHARE) if sfb else deadline
    result: MctsResult | SearchResult        # the fields both have are read below
    seed: tuple[SfbCut, ...] = ()
    if method == "mcts":
        if sfb:      # the cuts SFB finds on data parallelism: the tree judges plans with them as well
            seed = sfb_seed(sim, topology, searched)
        result = mcts_search(sim, topology, options, prior=prior, weights=weights, deadline=searched, sfb_cuts=seed)
        simulations, seconds = result.simulations, result.seconds
    elif method == "local":
        from tag_tf.search.local_search import local_search

        result = local_search(sim, topology, budget_s=options.budget_s, progress=options.progress, deadline=searched)
        simulations, seconds = result.evaluations, result.seconds
    else:
        raise StrategyError(f"search: expected 'mcts' or 'local', got {method!r}")
    outcome = None
    if sfb and result.found:
        from tag_tf.search.sfb import best_with_sfb

        result, outcome = best_with_sfb(sim, topology, result, deadline=deadline, seed=seed)
        simulations += outcome.simulations
        seconds += outcome.total_s
    return Search(result, outcome, simulations, seconds)


def sfb_seed(sim: Simulator, topology: Topology, deadline: Deadline) -> tuple[SfbCut, ...]:
    """The SFB cuts that make data parallelism over every device faster (search/sfb.py), solved in
    SFB_SEED_SHARE of what `deadline` leaves: the search judges its plans with them as well. Measured
    on the emulated link cluster (the wide cnn, its 51 MB dense gradient): a search that met SFB only
    after it ended settled on 1.20 s simulated, where replicating the dense layer over the slow link
    with SFB gives 1.04 s."""
    from tag_tf.search.registry import baseline
    from tag_tf.search.sfb import apply_sfb

    if topology.num_devices < 2:
        return ()
    try:
        return apply_sfb(sim, baseline("dp", sim.num_groups, topology), deadline=deadline.share(SFB_SEED_SHARE)).strategy.sfb
    except StrategyError:        # data parallelism does not run here (a batch smaller than the devices)
        return ()


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What to plan (`plan_for`): a PLANNED name ("auto", a baseline, "<baseline>+sfb") and how.

    budget_s: the planning budget, the search and SFB together (None: DEFAULT_BUDGET_S, ending early
    once converged, DEFAULT_PATIENCE_S); patience_s: end the tree search once the best plan has not
    improved for this long (None: as just said); iterations, method ("mcts" or "local"), prior,
    weights, seed: the search's; sfb: sufficient factor broadcasting after it; progress: a progress
    bar on terminals; calibration and costs: the physics and measured op times plans are judged
    with; drive_s: what a plan that only one client can drive pays per step and per other task
    (`Target.drive_s`, see `between_graph_choice`). A bad field is a StrategyError naming it."""

    name: str = "auto"
    budget_s: float | None = None
    patience_s: float | None = None
    iterations: int | None = None
    method: str = "mcts"
    prior: str | None = None
    weights: str | None = None
    seed: int = 0
    sfb: bool = True
    progress: bool = True
    calibration: CalibrationChoice = "default"
    costs: StoredCosts | None = None
    drive_s: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in PLANNED:
            raise StrategyError(f"strategy {self.name!r}: expected one of {', '.join(PLANNED)}")
        if self.iterations is not None and self.iterations < 1:
            raise StrategyError(f"--iterations must be at least 1, got {self.iterations}")
        if self.budget_s is not None and not self.budget_s >= 0:
            raise StrategyError(f"--budget-s must not be negative, got {self.budget_s}")
        if self.patience_s is not None and not self.patience_s > 0:
            raise StrategyError(f"--patience-s must be positive, got {self.patience_s}")
        if self.method not in ("mcts", "local"):
            raise StrategyError(f"search: expected 'mcts' or 'local', got {self.method!r}")
        if self.method == "mcts" and self.weights and self.prior == "uniform":
            raise StrategyError("--weights is for the GNN prior, not --prior uniform")

    def search_options(self) -> MctsOptions:
        from tag_tf.search.mcts import MctsOptions

        patience = self.patience_s if self.patience_s is not None else (
            DEFAULT_PATIENCE_S if self.budget_s is None else None)
        return MctsOptions(budget_s=DEFAULT_BUDGET_S if self.budget_s is None else self.budget_s,
                           iterations=self.iterations, seed=self.seed, progress=self.progress, patience_s=patience)


@dataclasses.dataclass(frozen=True)
class Planned:
    """A planned strategy, its simulated iteration time ("auto"; nan for a baseline: not simulated
    here), the search that found it ("auto"; None for a baseline) and the planning time."""

    strategy: Strategy
    iteration_time_s: float
    search: Search | None
    seconds: float


def plan_for(analysis: Analysis, topology: Topology, request: PlanRequest | None = None, *,
             sim: Simulator | None = None) -> Planned:
    """The one planning entry point: the plan of `request` (default: "auto") for `analysis` on
    `topology`, judged by `sim` where given (e.g. `local_machine_simulator`), else by the request's
    calibration and costs. `distribute` (through `resolve_strategy`, with the plan cache), the
    Estimator wrapper, `tag-tf plan`, `tag-tf simulate`'s baselines, the demo and the benchmarks that
    measure what `auto` plans (through `choose_auto`) plan here; studies of the search's own parts
    call those parts."""
    request = request if request is not None else PlanRequest()
    start = time.perf_counter()
    if request.name == "auto":
        return _auto(analysis, topology, request, sim, start)
    judge = sim
    client = client_for(analysis, topology, request.drive_s)
    if request.name == "best-subset" and client is not None:    # which hosts to keep depends on feeding them
        judge = (sim or simulator(analysis, topology, request.calibration, request.costs)).with_client(client)
    strategy = baseline(request.name, analysis, topology, request.budget_s, request.calibration, request.costs,
                        sim=judge)
    return Planned(strategy, math.nan, None, time.perf_counter() - start)


def choose_auto(analysis: Analysis, topology: Topology, budget_s: float | None = None,
                calibration: CalibrationChoice = "default", costs: StoredCosts | None = None, sfb: bool = True,
                sim: Simulator | None = None, drive_s: float = 0.0) -> Strategy:
    """The best plan the planner can give for `analysis` on `topology` within `budget_s` seconds
    (`plan_for` with "auto"): the strategy creator's MCTS, polished by the local search's moves,
    then (`sfb`) sufficient factor broadcasting where it simulates faster; never slower (simulated)
    than the best baseline, nor than the plain program on its fastest device."""
    return plan_for(analysis, topology, PlanRequest(budget_s=budget_s, calibration=calibration, costs=costs, sfb=sfb,
                                                    drive_s=drive_s), sim=sim).strategy


def _auto(analysis: Analysis, topology: Topology, request: PlanRequest, sim: Simulator | None, start: float
          ) -> Planned:
    """"auto": the search (`search`), then the plan that every task can drive where driving one
    costs more than it gains (`between_graph_choice`), and never slower than one device."""
    from tag_tf.search.local_search import NOTHING_FITS

    drive_s = request.drive_s
    sim = sim if sim is not None else simulator(analysis, topology, request.calibration, request.costs)
    if sim.client is None and (client := client_for(analysis, topology, drive_s)) is not None:
        sim = sim.with_client(client)      # every plan judged with the feed and drive it costs the client
    shortcut = _alike_cpu_tasks(analysis, topology, sim, drive_s)
    if shortcut is not None:
        return Planned(shortcut[0], shortcut[1], None, time.perf_counter() - start)
    found = search(sim, topology, method=request.method, options=request.search_options(), prior=request.prior,
                   weights=request.weights, sfb=request.sfb)
    result = found.result
    if found.sfb is not None:
        log.info("auto plan: SFB replaces %d of %d gradient synchronisations (%.3g -> %.3g ms simulated)",
                 found.sfb.kept, len(found.sfb.solutions), found.sfb.before_s * 1e3, found.sfb.after_s * 1e3)
    if not result.found:
        raise StrategyError(f"strategy='auto': no plan found; no plan fits {topology.name!r}: {NOTHING_FITS} "
                            f"(batch {analysis.batch_size})")
    log.info("auto plan: %.3g ms per iteration simulated (best baseline %s: %.3g ms), %d simulations in %.1f s",
             result.iteration_time_s * 1e3, result.best_baseline,
             min(result.baselines.values()) * 1e3, found.simulations, found.seconds)
    strategy = between_graph_choice(result.strategy, result.iteration_time_s, result.baselines, analysis, topology,
                                    drive_s, sim)
    seconds = result.iteration_time_s if strategy is result.strategy else sim.simulate(strategy).iteration_time_s
    strategy, seconds = _never_slower_than_one_device(sim, analysis, topology, drive_s, strategy, seconds)
    _warn_one_device(strategy, seconds, result.baselines, topology)
    return Planned(stamped(strategy, analysis, topology), seconds, found, time.perf_counter() - start)


def _alike_cpu_tasks(analysis: Analysis, topology: Topology, sim: Simulator, drive_s: float
                     ) -> tuple[Strategy, float] | None:
    """Tasks that drive themselves on alike CPU hosts: only whole replicas are worth running
    (between_graph_choice), and even shares on every host are what there is to find: no search, the
    fastest that fits. Hosts of measured unequal speeds or links are searched (None)."""
    if not (drive_s > 0 and topology.num_machines > 1 and _cpus_only(topology) and _alike(topology)):
        return None
    plans = {name: baseline(name, analysis, topology, sim=sim) for name in FALLBACK_BASELINES}
    fits = {name: t for name, p in plans.items() if math.isfinite(t := sim.simulate(p).iteration_time_s)}
    if not fits:
        return None
    name = min(fits, key=lambda n: fits[n])
    log.info("auto plan: %s (%.3g ms simulated): every task drives its own part of each step; on CPU "
             "devices only whole replicas are worth that (see between_graph_choice)", name, fits[name] * 1e3)
    return stamped(plans[name], analysis, topology), fits[name]


def _never_slower_than_one_device(sim: Simulator, analysis: Analysis, topology: Topology, drive_s: float,
                                  strategy: Strategy, seconds: float) -> tuple[Strategy, float]:
    """The plain program on its fastest device is a plan users always have: never slower than it.
    On a tie, the first machine's (the chief's, where the feeds are: a plan on another machine only,
    equal in simulation, moves every batch over the network to it)."""
    alone, alone_s = one_device_plan(sim, analysis, topology, drive_s)
    if alone is not None and (alone_s < seconds or (alone_s <= seconds and 0 not in strategy.machines(topology))):
        log.info("auto plan: one device (%.3g ms simulated) beats the plan chosen so far (%.3g ms)", alone_s * 1e3,
                 seconds * 1e3)
        return alone, alone_s
    return strategy, seconds


def _warn_one_device(strategy: Strategy, seconds: float, baselines: Mapping[str, float | None],
                     topology: Topology) -> None:
    devices = {d for g in strategy.groups for d in g.devices}
    if len(devices) != 1 or topology.num_devices == 1:
        return
    (device,) = devices
    known = {n: t for n, t in baselines.items()           # data parallelism over every device
             if n in WHOLE_REPLICA_BASELINES and t is not None and math.isfinite(t)}
    best = min(known, key=lambda n: known[n]) if known else None
    log.warning("tag_tf: auto keeps the model on one device (%s of machine %r): %.3g ms per step simulated%s",
                device, topology.machines[topology.devices[device].machine].name, seconds * 1e3,
                "" if best is None else f", {known[best] / seconds:.2f}x faster than {best} "
                                        f"({known[best] * 1e3:.3g} ms) on all {topology.num_devices} devices")


def one_device_plan(sim: Simulator, analysis: Analysis, topology: Topology, drive_s: float = 0.0
                    ) -> tuple[Strategy | None, float]:
    """The whole model on the device that simulates fastest alone (one per machine and type; the first
    such device on a tie), and its time. A device of another machine than the first (the chief's,
    where the client feeds every batch and reads every fetch) also pays, every step, the batch's
    move to it and one round trip to drive it (`drive_s`): the simulator's client (`sim.client`,
    sim/client.py) where it has one, else charged here."""
    from tag_tf.strategy import Option

    best: tuple[Strategy | None, float] = (None, math.inf)
    seen = set()
    own = Client(fed_bytes(analysis), drive_s, between_graph=False, feeds=feeds_of(analysis))    # where `sim` has no client
    for d in topology.devices:
        kind = (d.machine, d.type)
        if kind in seen:
            continue
        seen.add(kind)
        plan = Strategy.uniform(len(analysis.grouping.groups), (d.id,), Option.ALLREDUCE)
        t = sim.simulate(plan).iteration_time_s
        if sim.client is None:
            t += own.charge(plan, topology, analysis.op_groups)
        if math.isfinite(t) and t < best[1]:
            best = (plan, t)
    return best


# Baselines that replicate every group on every device with AllReduce (Strategy.whole_replicas).
WHOLE_REPLICA_BASELINES = Names(whole_replica_baselines)
# ... and the plans a task-driven cluster falls back to: those, or the same on the fastest machines only
FALLBACK_BASELINES = Names(fallback_baselines)
# On CPU tasks, how much faster than the best fallback a plan that needs one driver must simulate
# (its driving included) to run. Measured (benchmarks/RESULTS.md, TAG for real, and the step-time
# studies): before the simulator charged each host's CPU for its messages and all-reduce bytes, plans
# it preferred by 7-30% ran 1.1-1.8x slower than the fallback (1.4 then). With those charges, the
# plans it preferred by 1.24-1.34x (the wide cnn on the compute and mixed clusters: fast and half
# hosts, SFB on the dense layer) ran 1.18-1.29x faster than the fallback, at most 9% slower than
# predicted (results/hetero_real.json: 745.0 ms against best-subset's 930.6 on compute); the one it
# preferred by 1.65x (the same on the link cluster) ran 1.59x faster, 3% slower than predicted.
# 1.2 keeps twice the under-prediction measured as margin.
CPU_DRIVER_MARGIN = 1.2


def between_graph_choice(strategy: Strategy, seconds: float, baselines: Mapping[str, float | None],
                         analysis: Analysis, topology: Topology, drive_s: float, sim: Simulator | None = None
                         ) -> Strategy:
    """`strategy` (simulated `seconds` per step), or the fastest whole-replica baseline where the plan
    needs one driver and the cost of driving it outweighs what it gains (on CPU tasks: unless the
    plan, driving included, simulates CPU_DRIVER_MARGIN faster). The whole-replica baselines:
    data parallelism over every device (WHOLE_REPLICA_BASELINES) and best-subset, Horovod-P on the
    fastest machines (rebuilt with `sim`, the simulator that timed it, when given).

    The simulator prices a plan as if one client drove every device, as the paper's in-graph runs
    were. Where every task can drive its own part of each step (between-graph execution), a plan
    with any other edge between tasks than a collective still needs one driver, and pays a round
    trip to each other task every step (`drive_s`, measured; on a small model's step it is most of
    the step). Charged here rather than in the simulator: it depends on how the run is launched,
    not on the devices. A `sim` with a client (sim/client.py) has charged it in `seconds` already."""
    spans = len(strategy.machines(topology))
    if drive_s <= 0 or spans < 2 or strategy.whole_replicas:
        return strategy
    charged = seconds if sim is not None and sim.client is not None else seconds + drive_s * (spans - 1)
    known = {name: t for name, t in baselines.items()
             if name in FALLBACK_BASELINES and t is not None and math.isfinite(t)}
    if not known:
        return strategy
    name = min(known, key=lambda n: known[n])
    # On CPU tasks the simulator under-predicts a plan that needs one driver (its messages cost CPU
    # time the quotas of small hosts pay; RESULTS.md, TAG for real): there it must simulate
    # CPU_DRIVER_MARGIN faster than what every task drives itself, elsewhere merely faster.
    margin = CPU_DRIVER_MARGIN if _cpus_only(topology) else 1.0
    if known[name] >= charged * margin:
        log.info("auto plan: needs one driver; kept as it simulates %.2fx faster than %s (%.3g against %.3g ms, "
                 "%.3g ms per step to drive %d other task(s) included; at least %.2fx needed)", known[name] / charged,
                 name, charged * 1e3, known[name] * 1e3, drive_s * 1e3, spans - 1, margin)
        return strategy
    log.info("auto plan: %s instead (%.3g ms simulated; every task drives its own part of each step): the searched "
             "plan needs one driver and simulates %.3g ms with %.3g ms per step to drive %d other task(s), "
             "at least %.2fx faster needed", name, known[name] * 1e3, charged * 1e3, drive_s * 1e3, spans - 1, margin)
    return baseline(name, analysis, topology, sim=sim)


def _cpus_only(topology: Topology) -> bool:
    return all(d.type == "cpu" for d in topology.devices)


def _alike(topology: Topology) -> bool:
    """Every machine of one measured speed, and one switch between them (no bandwidth matrix) on
    ports of one bandwidth (a host behind a slower port, as discovery describes it, is not alike)."""
    return (len({m.speed for m in topology.machines}) == 1 and not isinstance(topology.inter_bandwidth, tuple)
            and len({topology.port_bandwidth(i) for i in range(topology.num_machines)}) == 1)


def stamped(strategy: Strategy, analysis: Analysis, topology: Topology, name: str = "auto") -> Strategy:
    """`strategy` named as the plan of `analysis` on `topology` (what the plan cache stores)."""
    return dataclasses.replace(strategy, name=name, graph=analysis.graph.fingerprint, topology=topology.fingerprint)


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------
def request_key(request: StrategyRequest) -> str:
    """A stable name for a strategy request (part of the cache key and of log lines)."""
    if isinstance(request, Strategy):
        return f"strategy:{request.fingerprint}"
    if isinstance(request, (str, os.PathLike)):
        text = os.fspath(request)
        if text in PLANNED:
            return text
        return f"file:{os.path.abspath(text)}"
    raise StrategyError(f"strategy: expected one of {', '.join(PLANNED)}, a Strategy or a JSON file path, "
                        f"got {type(request).__name__}")


def check_request(request: StrategyRequest) -> None:
    """Raise StrategyError now for a request that can never resolve (unknown name, missing file)."""
    key = request_key(request)
    if not isinstance(request, Strategy) and key.startswith("file:") and not os.path.exists(os.fspath(request)):
        raise StrategyError(f"strategy {os.fspath(request)!r}: not one of {', '.join(PLANNED)} nor an "
                            f"existing strategy JSON file")


def _given(request: StrategyRequest) -> Strategy:
    if isinstance(request, Strategy):
        return request
    check_request(request)
    return Strategy.load(os.fspath(request))


def resolve_strategy(analysis: Analysis, topology: Topology, request: StrategyRequest = "auto", *, cache_dir: str | None = None,
                     budget_s: float | None = None,
                     planner: Callable[[Analysis, Topology, str, float | None], Strategy] | None = None,
                     calibration: CalibrationChoice = "default", costs: StoredCosts | None = None, sfb: bool = True,
                     drive_s: float = 0.0) -> Plan:
    """The strategy to compile `analysis` with on `topology`.

    `planner(analysis, topology, request, budget_s)` plans the PLANNED requests (default: `plan`,
    judging plans with `calibration` and the op times of `costs`, a StoredCosts or None; "auto"
    applies sufficient factor broadcasting unless `sfb` is False; `drive_s`: see `choose_auto`); its
    result is cached under `cache_dir` (default: $TAG_TF_CACHE_DIR or ~/.cache/tag_tf).
    """
    key = request_key(request)
    groups = len(analysis.grouping.groups)
    if key not in PLANNED:
        strategy = _given(request)
        strategy.validate(groups, topology.num_devices, graph=analysis.graph.fingerprint,
                          topology=topology.fingerprint)
        return Plan(strategy, key)
    cache = PlanCache(cache_dir)
    path = cache.path_for(analysis, topology, key, calibration=calibration, costs=costs, sfb=sfb, drive_s=drive_s)
    cached = cache.load(path)
    if cached is not None:
        try:
            cached.validate(groups, topology.num_devices)
            validated_duplicates(analysis.for_strategy(cached), cached)   # refined groups and SFB ops must fit
        except StrategyError as e:   # a stale or hand-edited entry: plan again
            log.warning("ignoring plan cache entry %s: %s", path, e)
        else:
            log.info("plan cache hit: %s", path)
            return Plan(cached, key, cache_hit=True, cache_path=path)
    start = time.perf_counter()
    strategy = (planner or functools.partial(plan, calibration=calibration, costs=costs, sfb=sfb, drive_s=drive_s))(
        analysis, topology, key, budget_s)
    strategy.validate(groups, topology.num_devices)
    seconds = time.perf_counter() - start
    cache.store(path, strategy, key)
    return Plan(strategy, key, cache_hit=False, cache_path=path, seconds=seconds)


def plan(analysis: Analysis, topology: Topology, request: str, budget_s: float | None,
         calibration: CalibrationChoice = "default", costs: StoredCosts | None = None, sfb: bool = True,
         drive_s: float = 0.0) -> Strategy:
    """The strategy of a PLANNED request (`resolve_strategy`'s planner): `plan_for`'s."""
    return plan_for(analysis, topology, PlanRequest(request, budget_s=budget_s, calibration=calibration, costs=costs,
                                                    sfb=sfb, drive_s=drive_s)).strategy


def client_for(analysis: Analysis, topology: Topology, drive_s: float) -> Client | None:
    """The client a task-driven cluster's plans are judged with (`drive_s` > 0: every task can drive
    its own part of a whole-replica plan; sim/client.py), None elsewhere (the simulator alone, as
    in the paper's in-graph runs)."""
    if drive_s <= 0 or topology.num_machines < 2:
        return None
    return Client(fed_bytes(analysis), drive_s, between_graph=True, feeds=feeds_of(analysis))


def _calibration_key(calibration: CalibrationChoice, topology: Topology) -> str:
    """The physics a plan was judged with (a refitted shipped calibration is other physics too)."""
    from tag_tf.sim.calibration import resolve

    calibration = resolve(calibration, topology)
    if calibration is None:
        return "nominal"
    blob = json.dumps(dict(calibration.values), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# The plan cache
# ---------------------------------------------------------------------------------------------


def grouping_digest(analysis: Analysis) -> str:
    """Which op is in which group: a plan is per group, so a plan made for other groups is another plan."""
    pairs = sorted(analysis.grouping.group_of.items())
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()[:16]


class PlanCache:
    """Strategies on disk, one JSON file per (graph, topology, request, grouping, planner version)."""

    def __init__(self, root: str | None = None):
        self.root = os.path.join(root or default_cache_dir(), "plans")

    def path_for(self, analysis: Analysis, topology: Topology, request: str, *, calibration: CalibrationChoice = "default",
                 costs: StoredCosts | None = None, sfb: bool = True, drive_s: float = 0.0) -> str:
        """Where the plan of a PLANNED `request` for `analysis` on `topology` lives: a plan made under
        other physics (calibration values, measured op times) or without SFB is another plan."""
        physics = f"+cal:{_calibration_key(calibration, topology)}"
        if any(d.type != "cpu" for d in topology.devices):
            from tag_tf.profile.kernels import table_digest

            physics += f"+kernels:{table_digest()}" + ("" if tf32_enabled() else "+notf32")
        if costs is not None and not costs.empty:
            physics += f"+costs:{costs.digest}"
        if request == "auto" and not sfb:
            physics += "+nosfb"
        if (request == "auto" or request.startswith("best-subset")) and drive_s > 0:
            # runs each task drives: other plans pay to be driven and fed (sim/client.py)
            physics += f"+drive:{drive_s * 1e6:.0f}us"
        return self.path(analysis.graph.fingerprint, topology.fingerprint, request + physics,
                         len(analysis.grouping.groups), grouping=grouping_digest(analysis))

    def path(self, graph: str, topology: str, request: str, groups: int, grouping: str = "") -> str:
        key = json.dumps({"format": CACHE_FORMAT, "graph": graph, "topology": topology, "request": request,
                          "groups": groups, "grouping": grouping, "planner": PLANNER_VERSION}, sort_keys=True)
        return os.path.join(self.root, hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")

    def load(self, path: str) -> Strategy | None:
        from tag_tf.datafiles import PLAN_FILE_LIMIT, read_text

        if not os.path.exists(path):
            return None
        try:
            data = json.loads(read_text(path, "a cached plan", PLAN_FILE_LIMIT, StrategyError))
            return Strategy.from_dict(data["strategy"], source=path)
        except (OSError, ValueError, KeyError, TypeError, StrategyError) as e:
            log.warning("unreadable plan cache entry %s (%s); planning again", path, e)
            return None

    def offer(self, path: str, strategy: Strategy, seconds: float, sim: Simulator) -> bool:
        """Store `strategy` (simulated `seconds`) at `path` unless the plan there simulates at least as
        fast (a longer search may have made it; the key holds no budget or seed). Whether it was stored."""
        old = self.load(path)
        if old is not None:
            try:
                report = sim.simulate(old)
            except StrategyError:                     # stale for these groups: replace it
                report = None
            if report is not None and not report.oom and report.iteration_time_s <= seconds:
                return False
        self.store(path, strategy, "auto")
        return True

    def store(self, path: str, strategy: Strategy, request: str) -> None:
        """Write atomically (two processes may plan the same graph at once); a read-only or full
        disk only costs the next run a re-plan."""
        try:
            write_atomic(path, json.dumps({"format": CACHE_FORMAT, "planner": PLANNER_VERSION, "request": request,
                                           "strategy": strategy.to_dict()}))
        except OSError as e:
            log.warning("cannot write the plan cache %s (%s)", path, e)


__all__ = ["Plan", "PlanCache", "PlanRequest", "Planned", "Search", "StrategyRequest", "baseline", "between_graph_choice", "check_request", "choose_auto",
           "default_cache_dir", "plan", "plan_for", "request_key", "resolve_strategy", "search", "simulator", "stamped", "stored_costs_for"]
