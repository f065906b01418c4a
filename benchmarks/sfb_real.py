"""Sufficient factor broadcasting, MEASURED on this machine: DP vs DP+SFB on two server processes.

For the tiny mlp and transformer at batch 4, on two `tag-tf server`-style processes on 127.0.0.1
(one CPU device each, a client process driving):

  dp                DP-NCCL: one CollectiveReduce per gradient
  dp+sfb            the planner's choice: every gradient's SCIP cut, kept where the plan simulates faster
  dp+sfb-all        every cut SCIP proposes, applied without the simulator's check

each is first checked for exactness against the single-device graph (same initial values and
batches), then timed: `--rounds` rounds, the strategies interleaved within a round, `--steps`
timed steps after `--warmup` per run; the median over all timed steps is reported with min/max
and the simulator's prediction for the same cluster.

Usage: python benchmarks/sfb_real.py [--quick]      (writes benchmarks/results/sfb_real.json)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def strategies(analysis, topology):
    from tag_tf.search.registry import baseline
    from tag_tf.search.sfb import SfbSolver, apply_sfb
    from tag_tf.sim.simulator import Simulator

    sim = Simulator(analysis, topology)
    dp = baseline("dp", sim.num_groups, topology)
    planned = apply_sfb(sim, dp)
    solver = SfbSolver(sim)           # only names the cuts: apply_sfb solved every gradient already
    every = dp.with_sfb_cuts([solver.cut_of(s) for s in planned.solutions if s.ops])
    plans = {"dp": dp, "dp+sfb": planned.strategy, "dp+sfb-all": every}
    predicted = {k: sim.simulate(v).iteration_time_s for k, v in plans.items()}
    return plans, predicted, planned.to_dict()


def measure_model(name: str, args: argparse.Namespace) -> dict:
    import numpy as np

    from tag_tf.analysis import analyze
    from tag_tf.compiler import DeviceMap, compile_strategy
    from tag_tf.context import PassContext
    from tag_tf.frontend.loading import model_ir
    from tag_tf.models import build_model
    from tag_tf.profile.weights import reference_weights
    from tag_tf.runtime.cluster import cpu_topology, local_cluster
    from tag_tf.runtime.equivalence import check_equivalence, run_compiled, run_original

    build = lambda batch: build_model(name, tiny=True, batch_size=batch, dropout=0.0)  # noqa: E731
    model = build(args.batch)
    analysis = analyze(PassContext(), model_ir(model), rebuild=lambda b: model_ir(build(b)), batch_size=args.batch,
                       weight_fn=reference_weights)
    topology = cpu_topology(2, 1)
    plans, predicted, solver = strategies(analysis, topology)
    rng = np.random.default_rng(0)
    total = args.warmup + args.steps
    data = [model.feed(rng) for _ in range(max(total, args.check_steps))]
    feeds = lambda step: data[step]  # noqa: E731
    devices = DeviceMap.for_topology(topology)
    compiled = {k: compile_strategy(PassContext(), analysis, s, devices, check=True) for k, s in plans.items()}
    times: dict[str, list[float]] = {k: [] for k in plans}
    exact = {}
    with local_cluster(2, 1) as (spec, _):
        original = run_original(analysis, feeds, args.check_steps)
        for k, c in compiled.items():
            result = check_equivalence(analysis, c, feeds, args.check_steps, target=spec.target,
                                       config=spec.session_config(), original=original)
            exact[k] = {"ok": result.ok, "max_rel_diff": result.max_rel_diff, "tolerance": result.tolerance}
        for _ in range(args.rounds):
            for k, c in compiled.items():
                seconds: list[float] = []
                run_compiled(analysis, c, original.initial, feeds, total, target=spec.target,
                             config=spec.session_config(), step_seconds=seconds)
                times[k].extend(seconds[args.warmup:])
    rows = {}
    for k in plans:
        t = times[k]
        rows[k] = {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "max_ms": max(t) * 1e3,
                   "timed_steps": len(t), "simulated_ms": predicted[k] * 1e3, "exact": exact[k],
                   "duplicated_gradients": len(plans[k].sfb), "duplicated_ops": len(plans[k].duplicated_ops),
                   "collectives": compiled[k].stats["allreduce"], "gathers": compiled[k].stats["concat"]}
    return {"rows": rows, "planner": {k: v for k, v in solver.items() if k != "cuts"}}


STRATEGY_WORDS = {"dp": "data parallel, one all-reduce per gradient",
                  "dp+sfb": "the planner's SFB cuts on DP (SCIP's cut per gradient, kept where the plan simulates "
                            "faster)",
                  "dp+sfb-all": "every cut SCIP proposes, without the simulator's check"}


def render(data: dict) -> str:
    """RESULTS.md's SFB section (everything after its heading) from sfb_real.json alone."""
    from benchmarks.markdown import measured_when

    lines = ["Sufficient factor broadcasting (SFB): instead of all-reducing a replicated weight's gradient, every "
             "device gathers the small inputs it is computed from (the sufficient factors, such as a dense layer's "
             "activations and errors) and rebuilds the whole gradient itself, trading communication for duplicated "
             "compute.", "",
             f"{'MEASURED' if data.get('measured', True) else 'Not measured'}: tiny models at batch {data['batch']} on "
             f"{data['processes']} server processes on 127.0.0.1 (one CPU device each, a client process driving) on "
             f"{data.get('machine', 'cpu')} ({data.get('cores', '?')} cores, no GPU); {measured_when(data)}. Each "
             "strategy was first checked against the single-device graph (same initial values and batches; "
             "\"same as one device\": the trained variables' largest relative difference is within tolerance), "
             f"then timed in {data['rounds']} round{'s' * (data['rounds'] != 1)}, strategies interleaved, "
             f"{data['steps']} timed steps after {data['warmup']} warm-up steps each; step times in ms. "
             "\"simulated\": the simulator's prediction for this cluster (SIMULATED). Strategies: "
             + "; ".join(f"`{k}` {v}" for k, v in STRATEGY_WORDS.items()) + ".", "",
             "| model | strategy | median ms | min–max ms | vs DP | simulated ms | same as one device (max rel. diff) "
             "| gradients rebuilt | ops duplicated | all-reduces | gathers |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, m in data["models"].items():
        rows = m["rows"]
        dp = rows.get("dp", {}).get("median_ms")
        for key, r in rows.items():
            ex = r["exact"]
            vs = f"{dp / r['median_ms']:.2f}x" if dp and key != "dp" else "-"
            lines.append(f"| {model} | {key} | {r['median_ms']:.2f} | "
                         f"{r['min_ms']:.2f}–{r['max_ms']:.2f} | {vs} | {r['simulated_ms']:.2f} | "
                         f"{'yes' if ex['ok'] else 'NO'} ({ex['max_rel_diff']:.1e}) | {r['duplicated_gradients']} | "
                         f"{r['duplicated_ops']} | {r['collectives']} | {r['gathers']} |")
    same = [model for model, m in data["models"].items()
            if m["planner"]["kept"] == m["planner"]["proposed"] and {"dp+sfb", "dp+sfb-all"} <= set(m["rows"])
            and all(m["rows"]["dp+sfb"][k] == m["rows"]["dp+sfb-all"][k]
                    for k in ("duplicated_gradients", "duplicated_ops", "collectives", "gathers"))]
    lines += ["", "vs DP: DP's median step over the strategy's (above 1: faster than DP)."
              + (f" For {' and '.join(same)} the planner kept every proposed cut, so `dp+sfb` and `dp+sfb-all` applied "
                 "the same cuts (their compiled counts match): the difference between their timings is run-to-run "
                 "noise." if same else "")
              + " The planner, per model (SCIP on every gradient, then the simulator's check):", "",
              "| model | gradients | cuts proposed | kept | SCIP ms per gradient (mean / max) | planning s | "
              "simulated step ms before → after |", "|---|---|---|---|---|---|---|"]
    for model, m in data["models"].items():
        p = m["planner"]
        solve = p.get("solve_ms_per_gradient") or {}
        lines.append(f"| {model} | {p['gradients']} | {p['proposed']} | {p['kept']} | "
                     f"{solve.get('mean', float('nan')):.1f} / {solve.get('max', float('nan')):.1f} | "
                     f"{p['total_s']:.2f} | {p['before_s'] * 1e3:.2f} → {p['after_s'] * 1e3:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round of 2 warm-up + 5 timed steps (a smoke test)")
    ap.add_argument("--out", help="where to write the JSON (default benchmarks/results/sfb_real[_quick].json)")
    args = ap.parse_args()
    if args.quick:
        args.warmup, args.steps, args.rounds = 2, 5, 1
    start = time.perf_counter()
    models = {}
    for name in args.models.split(","):
        models[name] = measure_model(name, args)
        for k, row in models[name]["rows"].items():
            print(f"{name:12s} {k:11s} {row['median_ms']:7.2f} ms (min {row['min_ms']:.2f}, max {row['max_ms']:.2f}); "
                  f"simulated {row['simulated_ms']:.2f} ms; exact {row['exact']['ok']} "
                  f"({row['exact']['max_rel_diff']:.2g}); {row['duplicated_gradients']} gradients duplicated, "
                  f"{row['collectives']} collectives", flush=True)
    out = {"measured": True, "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "processes": 2, "batch": args.batch, "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
           "seconds": round(time.perf_counter() - start, 1), "models": models}
    from benchmarks.markdown import stamp

    out = stamp(out)     # the date and code, which the RESULTS.md section states (render)
    path = args.out or os.path.join(ROOT, "benchmarks", "results", "sfb_real_quick.json" if args.quick else "sfb_real.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
