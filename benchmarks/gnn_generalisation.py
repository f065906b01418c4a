"""The GNN prior on unseen topologies (the paper's "Generalizability to Unseen Device Topologies"),
SIMULATED: MCTS with the trained GNN vs pure MCTS (uniform prior), side by side on the same cases.

For each held-out topology random:SEED (SEED from tag_tf.search.gnn_training.HELD_OUT_BASE, never
drawn in training) and a model drawn for it, both priors search with the same iteration cap and
seed (no polish, no HeteroG baseline search: the tree alone is compared). Reported per model: the
mean number of iterations until the tree's best plan beats DP (a search that never does counts as
the cap + 1, and how many never did), and over all cases the share where the GNN's final plan is at
least as fast as the uniform prior's; beside the paper's iterations-to-beat-DP table.

Usage: python benchmarks/gnn_generalisation.py --weights DIR/weights.pt [--topologies 100]
       [--iterations 150] [--models ...] [--tiny] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Paper: mean MCTS iterations to beat DP-NCCL on 100 unseen random topologies.
PAPER_ITERATIONS = {"inceptionv3": {"gnn": 9.5, "uniform": 66.0}, "resnet101": {"gnn": 4.6, "uniform": 73.4},
                    "vgg19": {"gnn": 17.7, "uniform": 56.6}, "transformer": {"gnn": 121.8, "uniform": 145.0},
                    "bert-small": {"gnn": 7.9, "uniform": 97.8}}


def evaluate(weights: str, *, topologies: int = 100, iterations: int = 150, models: tuple[str, ...] | None = None,
             tiny: bool = False, seed: int = 0, say: Callable[[str], None] = print) -> dict:
    """Both priors on `topologies` held-out random topologies (see the module doc); the JSON's content."""
    import numpy as np

    from tag_tf.search.gnn import load_weights
    from tag_tf.search.gnn_training import HELD_OUT_BASE, PAPER_MODELS, zoo_analysis
    from tag_tf.search.mcts import MctsOptions, mcts_search
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.random_gen import random_topology

    _, meta = load_weights(weights)          # refuses a bad file before any search
    models = models or tuple(m for m in PAPER_MODELS if m != "bert-large")
    analyses: dict[str, object] = {}
    rng = np.random.default_rng(seed)
    cases = []
    start = time.perf_counter()
    for k in range(topologies):
        topo_seed = HELD_OUT_BASE + k
        model = models[int(rng.integers(len(models)))]
        topology = random_topology(topo_seed)
        if model not in analyses:
            analyses[model] = zoo_analysis(model, tiny)
        sim = Simulator(analyses[model], topology)
        row = {"topology": f"random:{topo_seed}", "devices": topology.num_devices, "model": model}
        for prior in ("uniform", "gnn"):
            result = mcts_search(sim, topology, MctsOptions(budget_s=120, iterations=iterations, seed=k,
                                                            polish=False, refine=False, heterog=False),
                                 prior=prior, weights=weights if prior == "gnn" else None)
            row[prior] = {"iterations_to_beat_dp": result.iterations_to_beat_dp,
                          "iteration_time_s": result.iteration_time_s if np.isfinite(result.iteration_time_s) else None,
                          "dp_s": result.baselines["dp"] if np.isfinite(result.baselines["dp"]) else None,
                          "seconds": round(result.seconds, 2)}
        cases.append(row)
        say(f"{row['topology']:14s} {model:12s} {row['devices']:3d} devices: iterations to beat DP "
            f"uniform {row['uniform']['iterations_to_beat_dp']}, gnn {row['gnn']['iterations_to_beat_dp']}")
    cap = iterations + 1
    per_model = {}
    for model in models:
        rows = [c for c in cases if c["model"] == model]
        if not rows:
            continue
        stats = {}
        for prior in ("uniform", "gnn"):
            its = [c[prior]["iterations_to_beat_dp"] for c in rows]
            stats[prior] = {"mean_iterations_to_beat_dp": float(np.mean([cap if i is None else i for i in its])),
                            "never_beat_dp": sum(i is None for i in its)}
        stats["cases"] = len(rows)
        stats["paper"] = PAPER_ITERATIONS.get(model)
        per_model[model] = stats
    comparable = [c for c in cases if c["gnn"]["iteration_time_s"] and c["uniform"]["iteration_time_s"]]
    at_least = sum(c["gnn"]["iteration_time_s"] <= c["uniform"]["iteration_time_s"] * (1 + 1e-9) for c in comparable)
    for model, s in per_model.items():
        say(f"{model:12s} mean iterations to beat DP: uniform {s['uniform']['mean_iterations_to_beat_dp']:.1f} "
            f"(never {s['uniform']['never_beat_dp']}), gnn {s['gnn']['mean_iterations_to_beat_dp']:.1f} "
            f"(never {s['gnn']['never_beat_dp']}) over {s['cases']} cases")
    say(f"GNN final plan at least as fast as uniform's on {at_least}/{len(comparable)} cases")
    return {"simulated": True, "weights": os.path.relpath(os.path.abspath(weights), ROOT), "weights_meta": meta,
            "iterations_cap": iterations, "topologies": topologies, "tiny": tiny,
            "per_model": per_model, "gnn_at_least_uniform_share": at_least / len(comparable) if comparable else None,
            "cases": cases, "seconds": round(time.perf_counter() - start, 1),
            "machine": platform.processor() or platform.machine()}


def main() -> None:
    from tag_tf.search.gnn_training import PAPER_MODELS

    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--topologies", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--models", default=",".join(m for m in PAPER_MODELS if m != "bert-large"))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "paper_generalisation.json"),
                    help="the JSON (default: the paper harness's file, which `python -m benchmarks run generalisation` writes too)")
    args = ap.parse_args()
    out = evaluate(args.weights, topologies=args.topologies, iterations=args.iterations,
                   models=tuple(args.models.split(",")), tiny=args.tiny, seed=args.seed,
                   say=lambda line: print(line, flush=True))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
