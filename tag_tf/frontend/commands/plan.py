"""`tag-tf plan`: the planner's strategy for a model on a topology (simulated), as a strategy JSON."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING, Any, cast

from tag_tf.errors import StrategyError
from tag_tf.frontend.loading import (
    add_cost_args,
    add_model_args,
    analysis_for,
    apply_cost_args,
    load,
    model_kwargs,
    stored_costs,
)
from tag_tf.search.priors import PRIORS

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.frontend.loading import Loaded
    from tag_tf.frontend.planning import Planned, Search
    from tag_tf.localmachine.model import LocalSimulator
    from tag_tf.profile.stored import StoredCosts
    from tag_tf.search.mcts import MctsResult
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.spec import Topology


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan a strategy for a model on a topology (simulated)")
    add_model_args(p)
    p.add_argument("--topology", required=True, help="preset (testbed, cloud, local:N, random:SEED, mixed:N) or file")
    p.add_argument("--budget-s", "--budget", dest="budget", type=float, default=30.0,
                   help="planning budget in seconds, the search and SFB after it together (default 30)")
    p.add_argument("--patience-s", dest="patience", type=float,
                   help="MCTS: end the tree search once the best plan has not improved for this many seconds "
                        "(or for as long as it took to find it); default: search the whole budget")
    p.add_argument("--iterations", type=int, help="MCTS: stop after this many iterations (default: budget only)")
    p.add_argument("--search", choices=("mcts", "local"), default="mcts",
                   help="the strategy creator: MCTS (default) or the greedy local search")
    p.add_argument("--prior", choices=PRIORS,
                   help="MCTS prior: gnn (the trained GNN shipped with tag_tf, or --weights) or uniform (pure MCTS); "
                        "default: uniform, as distribute's auto (benchmarks/gnn_wallclock.py: at equal wall-clock the "
                        "GNN found no faster plan)")
    p.add_argument("--weights", help="GNN weights file for --prior gnn (default: $TAG_TF_GNN_WEIGHTS, else the "
                                     "shipped weights; `tag-tf train-gnn` writes one)")
    p.add_argument("--seed", type=int, default=0, help="MCTS seed (ties, GNN initialisation)")
    p.add_argument("--sfb", action=argparse.BooleanOptionalAction, default=True,
                   help="sufficient factor broadcasting after the search: per replicated gradient, an SCIP "
                        "MILP picks ops to duplicate instead of synchronising it; kept only where the plan "
                        "simulates faster (default: on)")
    p.add_argument("--groups", type=int, default=60)
    p.add_argument("--out", help="write the strategy JSON here (usable with simulate/verify/distribute)")
    p.add_argument("--calibration", default="default",
                   help="simulator physics: 'default' (the shipped fit for testbed/cloud, datasheet elsewhere), "
                        "'nominal' (datasheet), a calibration JSON from `tag-tf calibrate`, or 'local': this "
                        "machine's CPUs as measured (local:N or cpu-PxN topologies, --model only; the local machine "
                        "model, measured once into the profile DB under --local-runtime)")
    p.add_argument("--local-runtime", choices=("tfdefault", "t1s2-eigen"),
                   help="with --calibration local: how the runs it plans for use TensorFlow: 'tfdefault' "
                        "(TensorFlow's own threads, oneDNN and Grappler: what a program gets; default) or "
                        "'t1s2-eigen' (one thread per op, oneDNN and Grappler off: the simulator-accuracy "
                        "benchmark's runtime)")
    p.add_argument("--between-graph", action="store_true",
                   help="with --calibration local on cpu-PxN: the processes run as TF_CONFIG tasks, each driving "
                        "its own part of every step (default: one client drives them all)")
    add_cost_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tag_tf.context import Options, PassContext
    from tag_tf.frontend.planning import PlanCache, PlanRequest, plan_for
    from tag_tf.topology.load import load_topology

    local = _local_runtime(args)
    apply_cost_args(args)
    topology = load_topology(args.topology)
    prior = "gnn" if args.weights and args.prior is None else args.prior
    request = PlanRequest(budget_s=args.budget, patience_s=args.patience, iterations=args.iterations,
                          method=args.search, prior=prior, weights=args.weights, seed=args.seed, sfb=args.sfb,
                          progress=not args.json, calibration=args.calibration)      # checked before any work
    ctx = PassContext(Options(num_groups=args.groups))
    loaded = load(args)
    analysis = analysis_for(loaded, args, ctx)
    sim, costs = _simulator(args, local, loaded, analysis, topology)
    planned = plan_for(analysis, topology, dataclasses.replace(request, costs=costs), sim=sim)
    cached = None
    if not local and args.search == "mcts" and prior is None and args.iterations is None:
        # The same plan `distribute(strategy="auto")` makes: a plan made ahead of time with this command
        # is the one training uses, unless the entry there already simulates at least as fast.
        cache = PlanCache(ctx.options.cache_root())
        path = cache.path_for(analysis, topology, "auto", calibration=args.calibration, costs=costs, sfb=args.sfb)
        cached = path if cache.offer(path, planned.strategy, planned.iteration_time_s, sim) else None
    if args.out:
        planned.strategy.save(args.out)
    out = _report(args, local, loaded.source, analysis, topology, sim, costs, planned, cached)
    if args.json:
        json.dump(out, sys.stdout)
        print()
    else:
        _print(out, args, sim)
    return 0


def _local_runtime(args: argparse.Namespace) -> bool:
    """Whether plans are judged by the local machine model (--calibration local); its runtime set up."""
    from tag_tf.frontend.planning import LOCAL_CALIBRATION
    from tag_tf.localmachine.runtime import RUNTIMES, configure_runtime

    if args.calibration != LOCAL_CALIBRATION:
        if args.local_runtime or args.between_graph:
            raise StrategyError(f"--local-runtime and --between-graph describe the local machine model: they need "
                                f"--calibration {LOCAL_CALIBRATION}")
        return False
    if not args.model:
        raise StrategyError(f"--calibration {LOCAL_CALIBRATION}: needs --model (the local profile rebuilds "
                            "the model at several batch sizes)")
    args.local_runtime = args.local_runtime or "tfdefault"
    configure_runtime(RUNTIMES[args.local_runtime])   # before TensorFlow is imported: what the model describes
    return True


def _simulator(args: argparse.Namespace, local: bool, loaded: Loaded, analysis: Analysis, topology: Topology
               ) -> tuple[Simulator, StoredCosts | None]:
    """The simulator plans are judged with, and the profile database's costs it uses."""
    from tag_tf.frontend.planning import local_machine_simulator, local_setup, simulator

    if not local:
        costs = stored_costs(loaded, analysis, topology, args)
        return simulator(analysis, topology, args.calibration, costs), costs
    if local_setup(topology).processes == 1 and args.between_graph:
        raise StrategyError(f"--between-graph: topology {args.topology!r} is one process; between-graph tasks "
                            f"need cpu-PxN with P >= 2")
    return local_machine_simulator(analysis, topology, args.model, model_kwargs(args), args.profile_db,
                                   use_db=not args.no_profiles, runtime=args.local_runtime,
                                   between_graph=args.between_graph), None


def _search_info(args: argparse.Namespace, search: Search) -> dict[str, object]:
    result = search.result
    info: dict[str, object]
    if args.search == "mcts":
        mcts = cast("MctsResult", result)
        info = {"search": "mcts", "prior": mcts.prior, "seed": args.seed, "iterations": mcts.iterations,
                "iterations_to_beat_dp": mcts.iterations_to_beat_dp, "time_to_beat_dp_s": mcts.time_to_beat_dp_s,
                "fell_back_to_baseline": mcts.fell_back, "converged": mcts.converged}
    else:
        info = {"search": "local", "iterations": None, "iterations_to_beat_dp": None, "time_to_beat_dp_s": None,
                "fell_back_to_baseline": result.best_baseline is not None
                and result.iteration_time_s >= result.baselines[result.best_baseline]}
    if search.sfb is not None:
        # A baseline with SFB may have beaten the plan with SFB: then that baseline is the plan.
        info["fell_back_to_baseline"] = bool(info["fell_back_to_baseline"] or getattr(result, "fell_back", False)
                                             or result.strategy.name.endswith("+sfb"))
    return info


def _report(args: argparse.Namespace, local: bool, source: str, analysis: Analysis, topology: Topology,
            sim: Simulator, costs: StoredCosts | None, planned: Planned, cached: str | None) -> dict[str, Any]:
    """`plan --json`: every field once, under the names the README lists."""
    from tag_tf.frontend.planning import LOCAL_CALIBRATION
    from tag_tf.search.local_search import describe
    from tag_tf.search.sfb import duplicated_op_types

    search, strategy, seconds = planned.search, planned.strategy, planned.iteration_time_s
    assert search is not None, "tag-tf plan plans 'auto' by a search"
    baselines = search.result.baselines
    sfb: dict[str, object] = {"enabled": False}
    if search.sfb is not None:
        sfb = {"enabled": True, **search.sfb.to_dict(),
               "duplicated_op_types": duplicated_op_types(analysis.for_strategy(strategy), strategy)}
    best = search.result.best_baseline
    return {"model": source, "topology": topology.name,
            "calibration": LOCAL_CALIBRATION if local else sim.calibration_name, "simulated": True,
            **({"local_runtime": args.local_runtime,
                "between_graph": cast("LocalSimulator", sim).machine.setup.between_graph} if local else {}),
            "iteration_time_s": seconds, "baselines": {k: _seconds(v) for k, v in baselines.items()},
            "best_baseline": best, "lower_bound_s": sim.lower_bound_s(), "split_floor_s": sim.split_floor_s(),
            "speedup_vs_dp": _ratio(baselines.get("dp"), seconds),
            "speedup_vs_best_baseline": None if best is None else _ratio(baselines[best], seconds),
            "speedup_vs_best_subset": _ratio(baselines.get("best-subset"), seconds),
            **_search_info(args, search), "planning_time_s": round(search.seconds, 3),
            "simulations": search.simulations, "oom": False,
            "cost_sources": dict(sim.costs.source), "math_modes": dict(sim.costs.modes),
            "profiles": dict(costs.files) if costs else {}, "sfb": sfb, "plan_cache": cached,
            "strategy": strategy.to_dict(),
            "groups": describe(strategy, topology, analysis.for_strategy(strategy).grouping.groups)}


def _print(out: dict[str, Any], args: argparse.Namespace, sim: Simulator) -> None:
    best = out["best_baseline"]
    speedup = "no baseline runs here" if best is None else f"{out['speedup_vs_best_baseline']:.2f}x over {best}"
    print(f"{out['model']} on {out['topology']}: {out['iteration_time_s'] * 1e3:.2f} ms per iteration "
          f"(simulated), {speedup}; compute lower bound {out['lower_bound_s'] * 1e3:.2f} ms, "
          f"{out['split_floor_s'] * 1e3:.2f} ms for plans that split the batch "
          f"({out['simulations']} strategies in {out['planning_time_s']:.1f} s, {out['search']} search)")
    for name, t in out["baselines"].items():
        print(f"  {name:<11} {_ms(math.inf if t is None else t)}")
    sfb = out["sfb"]
    if sfb["enabled"]:
        pieces = f", {sfb['in_pieces']} of them synchronised in pieces" if sfb.get("in_pieces") else ""
        print(f"  SFB: {sfb['kept']} of {sfb['gradients']} gradient synchronisations replaced by duplicated ops{pieces} "
              f"({sfb['before_s'] * 1e3:.2f} -> {sfb['after_s'] * 1e3:.2f} ms simulated; SCIP "
              f"{sfb['solve_ms_per_gradient']['mean']:.1f} ms per gradient)")
    if args.out:
        print(f"strategy written to {args.out}")
    if out["plan_cache"]:
        print(f"plan cached for distribute(strategy='auto'): {out['plan_cache']}")


def _ratio(base: float | None, seconds: float) -> float | None:
    """How many times faster than `base` (None where either does not run)."""
    if base is None or not math.isfinite(base) or not math.isfinite(seconds) or seconds <= 0:
        return None
    return base / seconds


def _seconds(t: float) -> float | None:
    """A simulated time for JSON: None where the strategy does not run (out of memory, too few samples)."""
    return t if math.isfinite(t) else None


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if math.isfinite(t) else "does not run"
