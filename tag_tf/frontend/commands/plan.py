"""`tag-tf plan`: the planner's strategy for a model on a topology (simulated), as a strategy JSON."""
from __future__ import annotations

import json
import math
import sys

from tag_tf.errors import StrategyError
from tag_tf.frontend.loading import add_model_args, analysis_for, load


def register(sub) -> None:
    p = sub.add_parser("plan", help="plan a strategy for a model on a topology (simulated)")
    add_model_args(p)
    p.add_argument("--topology", required=True, help="preset (testbed, cloud, local:N, random:SEED) or file")
    p.add_argument("--budget", type=float, default=30.0, help="search budget in seconds (default 30)")
    p.add_argument("--groups", type=int, default=60)
    p.add_argument("--out", help="write the strategy JSON here (usable with simulate/verify/distribute)")
    p.add_argument("--calibration", default="default",
                   help="simulator physics: 'default' (the shipped fit for testbed/cloud, datasheet elsewhere), "
                        "'nominal' (datasheet), or a calibration JSON from `tag-tf calibrate`")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from tag_tf.context import Options, PassContext
    from tag_tf.search.local_search import NOTHING_FITS, describe, local_search
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.parse import load_topology

    topology = load_topology(args.topology)
    ctx = PassContext(Options(num_groups=args.groups))
    loaded = load(args)
    analysis = analysis_for(loaded, args, ctx)
    sim = Simulator(analysis, topology, calibration=args.calibration)
    result = local_search(sim, topology, budget_s=args.budget, progress=not args.json)
    if not result.found:
        raise StrategyError(f"no plan found for {loaded.source} on {topology.name}: {NOTHING_FITS} "
                            f"(batch {analysis.batch_size})")
    if args.out:
        result.strategy.save(args.out)
    out = {"model": loaded.source, "topology": topology.name, "calibration": sim.calibration_name, "simulated": True,
           "iteration_time_s": result.iteration_time_s,
           "baselines_s": {k: _seconds(v) for k, v in result.baselines.items()},
           "speedup_over_dp": result.speedup_over_dp, "best_baseline": result.best_baseline,
           "speedup_over_best_baseline": result.speedup_over_best_baseline,
           "lower_bound_s": sim.lower_bound_s(),
           "evaluations": result.evaluations, "search_s": round(result.seconds, 2),
           "strategy": result.strategy.to_dict(),
           "groups": describe(result.strategy, topology, analysis.grouping.groups)}
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    best = result.best_baseline
    speedup = "no baseline runs here" if best is None else f"{result.speedup_over_best_baseline:.2f}x over {best}"
    print(f"{loaded.source} on {topology.name}: {result.iteration_time_s * 1e3:.2f} ms per iteration "
          f"(simulated), {speedup}; compute lower bound {sim.lower_bound_s() * 1e3:.2f} ms "
          f"({result.evaluations} strategies in {result.seconds:.1f} s)")
    for name, t in result.baselines.items():
        print(f"  {name:<10} {_ms(t)}")
    if args.out:
        print(f"strategy written to {args.out}")
    return 0


def _seconds(t: float) -> float | None:
    """A simulated time for JSON: None where the strategy does not run (out of memory, too few samples)."""
    return t if math.isfinite(t) else None


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if math.isfinite(t) else "does not run"
