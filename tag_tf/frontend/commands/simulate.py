"""`tag-tf simulate`: predict one training iteration of a strategy on a topology (simulated)."""
from __future__ import annotations

import json
import sys

from tag_tf.frontend.loading import (
    FUSION_HELP,
    add_cost_args,
    add_model_args,
    analysis_for,
    apply_cost_args,
    load,
    stored_costs,
    strategy_from_spec,
    strategy_help,
    with_fusion,
)


def register(sub) -> None:
    p = sub.add_parser("simulate", help="predict iteration time and memory of a strategy (simulated)")
    add_model_args(p)
    p.add_argument("--topology", required=True, help="preset (testbed, cloud, local:N, random:SEED, mixed:N) or file")
    p.add_argument("--strategy", default="dp", help=strategy_help())
    p.add_argument("--fusion", help=FUSION_HELP)
    p.add_argument("--groups", type=int, default=60)
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the simulated iteration here")
    p.add_argument("--gantt", help="write a Gantt chart PNG of the simulated iteration here")
    p.add_argument("--calibration", default="default",
                   help="simulator physics: 'default' (the shipped fit for testbed/cloud, datasheet elsewhere), "
                        "'nominal' (datasheet), or a calibration JSON from `tag-tf calibrate`")
    add_cost_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from tag_tf.context import Options, PassContext
    from tag_tf.frontend.planning import simulator
    from tag_tf.topology.load import load_topology

    apply_cost_args(args)
    topology = load_topology(args.topology)
    ctx = PassContext(Options(num_groups=args.groups))
    loaded = load(args)
    analysis = analysis_for(loaded, args, ctx)
    with ctx.timer("simulate/prepare"):
        costs = stored_costs(loaded, analysis, topology, args)
        sim = simulator(analysis, topology, args.calibration, costs)
    strategy = strategy_from_spec(args.strategy, analysis, topology, sim=sim)
    strategy = with_fusion(strategy, args.fusion, analysis, topology, sim=sim)
    detail = bool(args.trace or args.gantt)
    report = sim.simulate(strategy, detail=detail)
    if detail:
        graph, result = sim.task_graph(report)
        if args.trace:
            from tag_tf.sim.trace import write_chrome_trace
            write_chrome_trace(args.trace, graph, result)
        if args.gantt:
            from tag_tf.sim.gantt import plot_gantt
            plot_gantt(graph, result, args.gantt,
                       title=f"{loaded.source} on {topology.name}, {args.strategy} (simulated)")
    out = {"model": loaded.source, "topology": topology.name, "calibration": sim.calibration_name, "strategy": args.strategy, "simulated": True,
           **report.to_dict(), "lower_bound_s": sim.lower_bound_s(), "split_floor_s": sim.split_floor_s(), "fusion_bytes": strategy.fusion_bytes,
           "sync_after_backward": strategy.sync_after_backward, "sfb": [c.to_dict() for c in strategy.sfb],
           "cost_sources": dict(sim.costs.source), "math_modes": dict(sim.costs.modes), "profiles": dict(costs.files) if costs else {}, "timers": ctx.timing_report()}
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"{loaded.source} on {topology.name} ({topology.num_devices} devices), strategy {args.strategy}: "
          f"{report.iteration_time_s * 1e3:.2f} ms per iteration (simulated in {report.sim_ms:.1f} ms); "
          f"compute lower bound {sim.lower_bound_s() * 1e3:.2f} ms")
    peak = ", ".join(f"{p / 2**30:.2f}" for p in report.peak_memory_bytes)
    print(f"peak memory per device (GiB): {peak}" + ("  OOM on devices " + str(list(report.oom_devices)) if report.oom else ""))
    print("op times: " + "; ".join(f"{k}: {v}" for k, v in sim.costs.source.items()))
    if strategy.sfb:
        print(f"sufficient factor broadcasting: {len(strategy.sfb)} gradients rebuilt on every device "
              f"({len(strategy.duplicated_ops)} duplicated ops) instead of synchronised")
    return 0
