"""`tag-tf plan`: the planner's strategy for a model on a topology (simulated), as a strategy JSON."""
from __future__ import annotations

import argparse
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
    from tag_tf.frontend.planning import PlanCache
    from tag_tf.localmachine.model import LocalSimulator
    from tag_tf.search.mcts import MctsResult
    from tag_tf.sim.simulator import Simulator


def register(sub) -> None:
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


def run(args) -> int:
    from tag_tf.context import Options, PassContext
    from tag_tf.frontend.planning import (
        LOCAL_CALIBRATION,
        PlanCache,
        local_machine_simulator,
        local_setup,
        search,
        simulator,
        stamped,
    )
    from tag_tf.localmachine.runtime import RUNTIMES, configure_runtime
    from tag_tf.search.local_search import NOTHING_FITS, describe
    from tag_tf.search.mcts import MctsOptions
    from tag_tf.search.sfb import duplicated_op_types
    from tag_tf.topology.load import load_topology

    local = args.calibration == LOCAL_CALIBRATION
    if local:
        if not args.model:
            raise StrategyError(f"--calibration {LOCAL_CALIBRATION}: needs --model (the local profile rebuilds "
                                "the model at several batch sizes)")
        args.local_runtime = args.local_runtime or "tfdefault"
        configure_runtime(RUNTIMES[args.local_runtime])   # before TensorFlow is imported: what the model describes
    elif args.local_runtime or args.between_graph:
        raise StrategyError(f"--local-runtime and --between-graph describe the local machine model: they need "
                            f"--calibration {LOCAL_CALIBRATION}")
    apply_cost_args(args)
    topology = load_topology(args.topology)
    if local and local_setup(topology).processes == 1 and args.between_graph:
        raise StrategyError(f"--between-graph: topology {args.topology!r} is one process; between-graph tasks "
                            f"need cpu-PxN with P >= 2")
    ctx = PassContext(Options(num_groups=args.groups))
    loaded = load(args)
    analysis = analysis_for(loaded, args, ctx)
    sim: Simulator
    if local:
        costs = None
        sim = local_machine_simulator(analysis, topology, args.model, model_kwargs(args), args.profile_db,
                                      use_db=not args.no_profiles, runtime=args.local_runtime,
                                      between_graph=args.between_graph)
    else:
        costs = stored_costs(loaded, analysis, topology, args)
        sim = simulator(analysis, topology, args.calibration, costs)
    if args.iterations is not None and args.iterations < 1:
        raise StrategyError(f"--iterations must be at least 1, got {args.iterations}")
    if args.budget < 0:
        raise StrategyError(f"--budget-s must not be negative, got {args.budget}")
    if args.patience is not None and not args.patience > 0:
        raise StrategyError(f"--patience-s must be positive, got {args.patience}")
    if args.search == "mcts" and args.weights and args.prior == "uniform":
        raise StrategyError("--weights is for the GNN prior, not --prior uniform")
    prior = "gnn" if args.weights and args.prior is None else args.prior
    found = search(sim, topology, method=args.search, prior=prior, weights=args.weights, sfb=args.sfb,
                   options=MctsOptions(budget_s=args.budget, iterations=args.iterations, seed=args.seed,
                                       progress=not args.json, patience_s=args.patience))
    result, simulations, seconds = found.result, found.simulations, found.seconds
    search_info: dict[str, Any]
    if args.search == "mcts":
        mcts = cast("MctsResult", result)
        search_info = {"search": "mcts", "prior": mcts.prior, "seed": args.seed, "iterations": mcts.iterations,
                       "iterations_to_beat_dp": mcts.iterations_to_beat_dp,
                       "time_to_beat_dp_s": mcts.time_to_beat_dp_s,
                       "fell_back_to_baseline": mcts.fell_back, "converged": mcts.converged}
    else:
        search_info = {"search": "local", "iterations": None, "iterations_to_beat_dp": None, "time_to_beat_dp_s": None,
                       "fell_back_to_baseline": result.best_baseline is not None
                       and result.iteration_time_s >= result.baselines[result.best_baseline]}
    if not result.found:
        raise StrategyError(f"no plan found for {loaded.source} on {topology.name}: {NOTHING_FITS} "
                            f"(batch {analysis.batch_size})")
    sfb: dict[str, Any] = {"enabled": False}
    if found.sfb is not None:
        sfb = {"enabled": True, **found.sfb.to_dict(),
               "duplicated_op_types": duplicated_op_types(analysis.for_strategy(result.strategy), result.strategy)}
        # A baseline with SFB may have beaten the plan with SFB: then that baseline is the plan.
        search_info["fell_back_to_baseline"] = bool(search_info["fell_back_to_baseline"]
                                                    or getattr(result, "fell_back", False)
                                                    or result.strategy.name.endswith("+sfb"))
    cached = None
    if not local and args.search == "mcts" and prior is None and args.iterations is None:
        # The same search `distribute(strategy="auto")` runs: a plan made ahead of time with this command
        # is the one training uses, unless the entry there already simulates at least as fast (a longer
        # search may have made it; the key holds no budget or seed).
        cache = PlanCache(ctx.options.cache_root())
        path = cache.path_for(analysis, topology, "auto", calibration=args.calibration, costs=costs, sfb=args.sfb)
        if _faster_than_cached(sim, cache, path, result.iteration_time_s):
            cache.store(path, stamped(result.strategy, analysis, topology), "auto")
            cached = path
    if args.out:
        result.strategy.save(args.out)
    out = {"model": loaded.source, "topology": topology.name,
           "calibration": LOCAL_CALIBRATION if local else sim.calibration_name, "simulated": True,
           **({"local_runtime": args.local_runtime,
               "between_graph": cast("LocalSimulator", sim).machine.setup.between_graph} if local else {}),
           "iteration_time_s": result.iteration_time_s,
           "baselines_s": {k: _seconds(v) for k, v in result.baselines.items()},
           "speedup_over_dp": result.speedup_over_dp, "best_baseline": result.best_baseline,
           "speedup_over_best_baseline": result.speedup_over_best_baseline,
           "lower_bound_s": sim.lower_bound_s(),
           "baselines": {k: _seconds(v) for k, v in result.baselines.items()},
           "speedup_vs_dp": result.speedup_over_dp, "speedup_vs_best_baseline": result.speedup_over_best_baseline,
           "speedup_vs_best_subset": result.speedup_over("best-subset"),
           **search_info, "planning_time_s": round(seconds, 3), "simulations": simulations, "oom": False,
           "cost_sources": dict(sim.costs.source), "math_modes": dict(sim.costs.modes), "profiles": dict(costs.files) if costs else {},
           "evaluations": simulations, "search_s": round(seconds, 2),
           "sfb": sfb, "plan_cache": cached, "strategy": result.strategy.to_dict(),
           "groups": describe(result.strategy, topology, analysis.for_strategy(result.strategy).grouping.groups)}
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    best = result.best_baseline
    speedup = "no baseline runs here" if best is None else f"{result.speedup_over_best_baseline:.2f}x over {best}"
    print(f"{loaded.source} on {topology.name}: {result.iteration_time_s * 1e3:.2f} ms per iteration "
          f"(simulated), {speedup}; compute lower bound {sim.lower_bound_s() * 1e3:.2f} ms "
          f"({simulations} strategies in {seconds:.1f} s, {search_info['search']} search)")
    for name, t in result.baselines.items():
        print(f"  {name:<11} {_ms(t)}")
    if sfb["enabled"]:
        print(f"  SFB: {sfb['kept']} of {sfb['gradients']} gradient synchronisations replaced by duplicated ops "
              f"({sfb['before_s'] * 1e3:.2f} -> {sfb['after_s'] * 1e3:.2f} ms simulated; SCIP "
              f"{sfb['solve_ms_per_gradient']['mean']:.1f} ms per gradient)")
    if args.out:
        print(f"strategy written to {args.out}")
    if cached:
        print(f"plan cached for distribute(strategy='auto'): {cached}")
    return 0


def _faster_than_cached(sim: Simulator, cache: PlanCache, path: str, seconds: float) -> bool:
    """Whether a plan of `seconds` beats the cache entry at `path` (simulated); True without one."""
    old = cache.load(path)
    if old is None:
        return True
    try:
        report = sim.simulate(old)
    except StrategyError:                     # stale for these groups: replace it
        return True
    return report.oom or seconds < report.iteration_time_s


def _seconds(t: float) -> float | None:
    """A simulated time for JSON: None where the strategy does not run (out of memory, too few samples)."""
    return t if math.isfinite(t) else None


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if math.isfinite(t) else "does not run"
