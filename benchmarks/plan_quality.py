"""Plan quality on the paper's models and clusters, SIMULATED (no GPUs here).

For every zoo model at its paper batch size and each heterogeneous preset (`testbed`, `cloud`), the
simulator predicts one training iteration under every baseline — DP-NCCL and DP-NCCL-P (one
collective per gradient, the paper's), Horovod and Horovod-P (fused 64 MB buckets), HeteroG (its
decision space searched by our simulator) — and the planner's "auto" plan (`--budget` seconds; its
first share goes to the HeteroG search, whose result it may start from), with op times from the
analytical GPU cost model (datasheet constants) and transfers from the topology's bandwidths.
Also: the compute lower bound (the whole batch spread over the devices by speed, communication
free), HeteroG searched alone for the whole budget (a check that auto does not win only because
HeteroG got less time), the search's effort, and what the plan does.

Usage: python benchmarks/plan_quality.py [--budget 20] [--models vgg19,resnet101] [--topologies testbed]
Writes benchmarks/results/plan_quality.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.markdown import measured_when, stamp  # noqa: E402
from tag_tf.analysis import analyze  # noqa: E402
from tag_tf.context import PassContext  # noqa: E402
from tag_tf.errors import StrategyError  # noqa: E402
from tag_tf.frontend.loading import model_ir  # noqa: E402
from tag_tf.models import MODEL_NAMES, build_model  # noqa: E402
from tag_tf.profile.weights import reference_weights  # noqa: E402
from tag_tf.search.local_search import local_search  # noqa: E402
from tag_tf.search.registry import make_baseline  # noqa: E402
from tag_tf.sim.simulator import Simulator  # noqa: E402
from tag_tf.topology.load import load_topology  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _finite(x: float) -> float | None:
    """None for a strategy that does not run (DP with fewer samples than devices, out of memory)."""
    return float(x) if np.isfinite(x) else None


def _ms(t: float | None) -> str:
    return "does not run" if t is None else f"{t * 1e3:9.2f} ms"


def _simulated(sim, strategy) -> float | None:
    try:
        report = sim.simulate(strategy)
    except StrategyError:           # fewer samples than replicas
        return None
    return None if report.oom else report.iteration_time_s


def plan_summary(strategy, topology) -> dict[str, int]:
    """Groups per (option, device set by GPU type), e.g. 'allreduce on 4x V100-32GB': 3."""
    counts: collections.Counter = collections.Counter()
    for plan in strategy.groups:
        types = collections.Counter(topology.devices[d].type for d in plan.devices)
        where = ", ".join(f"{n}x {t}" for t, n in sorted(types.items()))
        counts[f"{plan.option.value} on {where}"] += 1
    return dict(counts.most_common())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODEL_NAMES))
    ap.add_argument("--topologies", default="testbed,cloud")
    ap.add_argument("--budget", type=float, default=20.0, help="search seconds per (model, topology)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "plan_quality.json"))
    args = ap.parse_args()

    started = time.time()
    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        model = build_model(name)
        analysis = analyze(PassContext(), model_ir(model),
                           rebuild=lambda b, name=name: model_ir(build_model(name, batch_size=b)),
                           weight_fn=reference_weights)
        analyze_s = time.perf_counter() - t0
        for topo_name in args.topologies.split(","):
            topology = load_topology(topo_name)
            t0 = time.perf_counter()
            sim = Simulator(analysis, topology)
            prepare_s = time.perf_counter() - t0
            result = local_search(sim, topology, budget_s=args.budget)
            alone_s = _simulated(sim, make_baseline("heterog", sim.num_groups, topology, lambda sim=sim: sim, args.budget))
            auto = result.iteration_time_s
            row = {
                "model": name, "topology": topo_name, "batch": analysis.batch_size,
                "groups": sim.num_groups, "simulated": True,
                "baselines_s": {k: _finite(v) for k, v in result.baselines.items()},
                "heterog_full_budget_s": alone_s,
                "best_baseline": result.best_baseline,
                "auto_s": _finite(auto), "lower_bound_s": sim.lower_bound_s(),
                "auto_over_lower_bound": _finite(auto / sim.lower_bound_s()),
                "speedup_over_best_baseline": result.speedup_over_best_baseline,
                "speedup_over_dp": result.speedup_over_dp,
                "auto_fusion_bytes": result.strategy.fusion_bytes,
                "simulations": result.evaluations, "search_s": round(result.seconds, 2),
                "groups_changed": result.improved_groups, "analyze_s": round(analyze_s, 1),
                "prepare_s": round(prepare_s, 2), "plan": plan_summary(result.strategy, topology),
            }
            rows.append(row)
            base = "  ".join(f"{k} {_ms(v)}" for k, v in row["baselines_s"].items())
            best = "  n/a" if row["speedup_over_best_baseline"] is None else f"{row['speedup_over_best_baseline']:5.2f}"
            print(f"{name:<12} {topo_name:<8} {base}  auto {_ms(row['auto_s'])}  LB {_ms(row['lower_bound_s'])}  "
                  f"{best}x over {row['best_baseline']} ({row['simulations']} simulations, {row['search_s']} s)"
                  f"  [simulated]", flush=True)
    result = stamp({
        "benchmark": "plan_quality",
        "what": "SIMULATED iteration time of every baseline (dp, dp-p: per-tensor all-reduce; horovod, "
                "horovod-p: fused buckets; heterog: searched; best-subset: horovod-p on the best subset of the "
                "fastest machines), the auto plan and the compute lower bound per model and heterogeneous "
                "preset; GPU op times from the analytical cost model with the preset's shipped calibration (the "
                "calibration section)",
        "budget_s": args.budget,
        "rows": rows,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "elapsed_s": round(time.time() - started, 1),
    })
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out} ({result['elapsed_s']} s)")
    return 0


def render(data: dict) -> str:
    """RESULTS.md's plan-quality section (benchmarks/report.py)."""
    baselines = list(dict.fromkeys(k for r in data["rows"] for k in r["baselines_s"]))

    def ms(t: float | None) -> str:
        return "—" if t is None else f"{t * 1e3:.1f}"
    lines = [f"{data['what']}; `auto` with a {data['budget_s']:g} s budget; {measured_when(data)}. No GPU ran any of "
             "this. The current planner against every baseline (best-subset included) is in the paper's evaluation "
             "section below; this table is what `plan_quality.py` last wrote.", "",
             "| model | preset | " + " | ".join(baselines) + " | **auto** | lower bound | best baseline | "
             "auto vs best baseline | heterog alone, full budget |",
             "|---|---|" + "---|" * (len(baselines) + 5)]
    for r in data["rows"]:
        speedup = r.get("speedup_over_best_baseline")
        lines.append(f"| {r['model']} | {r['topology']} | " + " | ".join(ms(r['baselines_s'].get(k)) for k in baselines)
                     + f" | **{ms(r['auto_s'])}** | {ms(r['lower_bound_s'])} | {r.get('best_baseline') or 'none runs'} | "
                     f"{'n/a' if speedup is None else f'{speedup:.2f}x'} | {ms(r.get('heterog_full_budget_s'))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
