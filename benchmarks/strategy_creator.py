"""The strategy creator (MCTS) against the greedy local search, side by side in one run.

For each paper model on the calibrated `testbed` and `cloud` presets: the fixed baselines, the
compute lower bound, `--search local` and `--search mcts` (with each of `--priors`, the first of
which the targets judge: by default the shipped GNN's, what `auto` runs) at the same budget,
simulations per second, and how soon MCTS beat DP.
Everything is SIMULATED (no GPU ran any of it) on this machine's 2 CPU cores.

Usage: python benchmarks/strategy_creator.py [--budget 30] [--models vgg19,...] [--presets testbed,cloud]
       [--priors gnn,uniform]
Writes benchmarks/results/strategy_creator.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tag_tf.frontend.commands.calibrate import CaseBuilder      # noqa: E402
from tag_tf.search.local_search import local_search            # noqa: E402
from tag_tf.search.mcts import MctsOptions, mcts_search        # noqa: E402
from tag_tf.search.priors import DEFAULT_PRIOR, PRIORS          # noqa: E402
from tag_tf.sim.simulator import Simulator                     # noqa: E402
from tag_tf.topology.load import load_topology                # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small", "bert-large")


def _s(t: float) -> float | None:
    return t if math.isfinite(t) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--presets", default="testbed,cloud")
    ap.add_argument("--priors", default=DEFAULT_PRIOR,
                    help=f"MCTS priors to run, comma-separated from {', '.join(PRIORS)}; the first is judged")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "strategy_creator.json"))
    args = ap.parse_args()
    priors = args.priors.split(",")
    if not priors or any(p not in PRIORS for p in priors):
        ap.error(f"--priors: expected names from {', '.join(PRIORS)}, got {args.priors!r}")
    first = priors[0]
    builder = CaseBuilder({}, 60)
    rows = {}
    for preset in args.presets.split(","):
        topo = load_topology(preset)
        for model in args.models.split(","):
            sim = Simulator(builder.analysis(model, None), topo)
            row = {"calibration": sim.calibration_name, "lower_bound_s": sim.lower_bound_s(),
                   "groups": sim.num_groups, "group_balance": float(sim.analysis.grouping.balance)}
            local = local_search(sim, topo, budget_s=args.budget)
            row["baselines_s"] = {k: _s(v) for k, v in local.baselines.items()}
            row["local"] = {"iteration_time_s": _s(local.iteration_time_s), "simulations": local.evaluations,
                            "seconds": local.seconds, "sims_per_s": local.evaluations / max(local.seconds, 1e-9)}
            for prior in priors:
                r = mcts_search(sim, topo, MctsOptions(budget_s=args.budget, seed=0), prior=prior)
                row[f"mcts_{prior}"] = {
                    "iteration_time_s": _s(r.iteration_time_s), "simulations": r.simulations, "iterations": r.iterations,
                    "seconds": r.seconds, "sims_per_s": r.simulations / max(r.seconds, 1e-9),
                    "iterations_to_beat_dp": r.iterations_to_beat_dp, "time_to_beat_dp_s": r.time_to_beat_dp_s,
                    "fell_back": r.fell_back, "groups_after_refinement": len(r.strategy.groups)}
            row["mcts"] = row[f"mcts_{first}"]
            m, l_ = row["mcts"]["iteration_time_s"], row["local"]["iteration_time_s"]
            row["mcts_over_local"] = (l_ / m) if m and l_ else None
            best_base = min((v for v in row["baselines_s"].values() if v is not None), default=None)
            row["mcts_vs_bound"] = (m / row["lower_bound_s"]) if m else None
            row["mcts_over_best_baseline"] = (best_base / m) if m and best_base else None
            rows[f"{preset}/{model}"] = row
            print(f"{preset}/{model}: local {_ms(l_)}, mcts {_ms(m)} ({row['mcts_over_local'] or 0:.2f}x local), "
                  f"bound {row['lower_bound_s'] * 1e3:.1f} ms, best baseline {_ms(best_base)}, "
                  f"DP beaten at iteration {row['mcts']['iterations_to_beat_dp']} "
                  f"({row['mcts']['time_to_beat_dp_s'] or 0:.2f} s)", flush=True)
    faster = sorted(k for k, r in rows.items() if (r["mcts_over_local"] or 0) >= 1.10)
    bound = {k: r["mcts_vs_bound"] for k, r in rows.items()
             if k in ("testbed/vgg19", "testbed/transformer", "testbed/bert-small")}
    targets = {"mcts_10pct_faster_than_local": faster,
               "mcts_10pct_faster_than_local_models": len({k.split("/")[1] for k in faster}),
               "testbed_within_2x_of_bound": {k: bool(v is not None and v <= 2.0) for k, v in bound.items()},
               "beats_dp_within_10s": {k: bool((r["mcts"]["time_to_beat_dp_s"] or math.inf) <= 10.0)
                                       for k, r in rows.items() if r["baselines_s"].get("dp") is not None}}
    out = {"simulated": True, "machine": platform.processor() or platform.machine(), "budget_s": args.budget,
           "priors": priors, "rows": rows, "targets": targets}
    print(json.dumps(targets, indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(f"-> {args.out}")


def _ms(t: float | None) -> str:
    return "n/a" if t is None else f"{t * 1e3:.1f} ms"


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"{time.perf_counter() - t0:.0f} s")
