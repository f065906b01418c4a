"""The GNN prior judged at equal wall-clock, SIMULATED: the strategy creator's MCTS guided by the shipped
GNN against pure MCTS (the uniform prior), each given the same seconds, on topologies the GNN never saw.

Fewer iterations to a good plan is not the question a user asks; the plan in hand after N seconds
is. Each case runs the planner as `auto` does (tree, polish, HeteroG's space as a baseline), once per
prior and budget, with the same seed, and the clock includes everything the prior costs (loading the
network, building the graph features, one inference per new tree vertex). Cases:

- held-out random topologies (`tag_tf.search.gnn_training.HELD_OUT_BASE` + k: 2-6 machines of V100,
  1080 Ti and P100, the kind the GNN was trained on), a paper model drawn for each;
- large clusters the GNN never saw the like of: 8, 16 and 32 machines of eight GPUs (H100, A100 and
  V100 in turn, NVLink inside, 100-200 Gbps between, drawn per pair), 64 to 256 GPUs, with a paper
  model at a global batch of four samples per GPU.

Reported per case and budget: the final plan's simulated step time under each prior, and their ratio
(GNN over uniform: below 1, the GNN's plan is faster). `python benchmarks/gnn_wallclock.py
[--budgets 5,15,60] [--small 4] [--large 64,128,256] [--out FILE]`. The default prior `auto` uses
(`tag_tf.search.priors.DEFAULT_PRIOR`) follows this benchmark's verdict.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LARGE_TYPES = ("H100", "A100-40GB", "V100-32GB")
LARGE_MODELS = ("resnet101", "transformer", "bert-small")
SMALL_MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small")
SAMPLES_PER_GPU = 4
PRIORS = ("uniform", "gnn")


def large_topology(gpus: int, seed: int) -> dict:
    """`gpus` / 8 machines of eight GPUs, the types in turn, NVLink inside, 100-200 Gbps between."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = gpus // 8
    names = [f"m{i}" for i in range(n)]
    matrix: dict[str, dict[str, str]] = {}
    for i in range(n):
        for j in range(i + 1, n):
            matrix.setdefault(names[i], {})[names[j]] = f"{float(rng.uniform(100, 200)):.0f}Gbps"
    return {"name": f"large-{gpus}", "machines": [{"name": names[i], "gpus": f"8x {LARGE_TYPES[i % len(LARGE_TYPES)]}",
                                                  "intra": "nvlink"} for i in range(n)],
            "inter": {"matrix": matrix, "latency": "10us"}}


def plan_once(analysis, topology, prior: str, budget_s: float, seed: int) -> dict:
    """One planner run as `auto` runs it; the wall clock around everything the prior costs."""
    from tag_tf.search.mcts import MctsOptions, mcts_search
    from tag_tf.sim.simulator import Simulator

    sim = Simulator(analysis, topology)
    start = time.perf_counter()
    result = mcts_search(sim, topology, MctsOptions(budget_s=budget_s, seed=seed), prior=prior)
    wall = time.perf_counter() - start
    t = result.iteration_time_s
    return {"iteration_time_s": t if math.isfinite(t) else None, "wall_s": round(wall, 2),
            "simulations": result.simulations, "iterations": result.iterations, "prior": result.prior,
            "fell_back": result.fell_back}


def run(budgets: list[float], small: int, large: list[int], say=print) -> dict:
    import numpy as np

    from tag_tf.search.gnn_training import HELD_OUT_BASE, zoo_analysis
    from tag_tf.topology.load import load_topology
    from tag_tf.topology.random_gen import random_topology

    rng = np.random.default_rng(0)
    cases = []
    for k in range(small):
        seed = HELD_OUT_BASE + 50 + k          # held out of training; not the first ones gnn_generalisation uses
        cases.append(("small", f"random:{seed}", lambda s=seed: random_topology(s),
                      SMALL_MODELS[int(rng.integers(len(SMALL_MODELS)))], None))
    for i, gpus in enumerate(large):
        cases.append(("large", f"large-{gpus}", lambda g=gpus: load_topology(large_topology(g, g)),
                      LARGE_MODELS[i % len(LARGE_MODELS)], SAMPLES_PER_GPU * gpus))
    rows = []
    analyses: dict = {}
    start = time.perf_counter()
    for kind, name, make, model, batch in cases:
        topology = make()
        key = (model, batch)
        if key not in analyses:
            analyses[key] = zoo_analysis(model, batch_size=batch)
        for budget in budgets:
            row = {"kind": kind, "topology": name, "devices": topology.num_devices, "model": model,
                   "batch": analyses[key].batch_size, "budget_s": budget}
            for prior in PRIORS:
                row[prior] = plan_once(analyses[key], topology, prior, budget, seed=0)
            g, u = row["gnn"]["iteration_time_s"], row["uniform"]["iteration_time_s"]
            row["gnn_over_uniform"] = g / u if g and u else None
            rows.append(row)
            say(f"{name:14s} {model:12s} {row['devices']:4d} GPUs  {budget:5.0f} s: uniform "
                f"{_ms(u)} ms ({row['uniform']['wall_s']} s), gnn {_ms(g)} ms ({row['gnn']['wall_s']} s)"
                + (f"  gnn/uniform {row['gnn_over_uniform']:.3f}" if row["gnn_over_uniform"] else ""))
    return {"simulated": True, "budgets_s": budgets, "rows": rows, "summary": summarize(rows),
            "seconds": round(time.perf_counter() - start, 1)}


def _ms(t: float | None) -> str:
    return "n/a" if t is None else f"{t * 1e3:.1f}"


def summarize(rows: list[dict]) -> dict:
    """Per budget and kind (small/large/all): geometric mean of GNN over uniform, and how many cases
    each prior's plan was faster (ties within 0.1%); the verdict: the prior that is at least as good
    at every budget over all cases."""
    out: dict = {}
    for budget in sorted({r["budget_s"] for r in rows}):
        for kind in ("small", "large", "all"):
            sel = [r for r in rows if r["budget_s"] == budget and (kind == "all" or r["kind"] == kind)
                   and r["gnn_over_uniform"]]
            if not sel:
                continue
            ratios = [r["gnn_over_uniform"] for r in sel]
            out[f"{budget:g}s/{kind}"] = {
                "cases": len(sel), "geomean_gnn_over_uniform": math.exp(statistics.mean(math.log(x) for x in ratios)),
                "gnn_faster": sum(x < 1 - 1e-3 for x in ratios), "uniform_faster": sum(x > 1 + 1e-3 for x in ratios),
                "ties": sum(abs(x - 1) <= 1e-3 for x in ratios)}
    alls = [v for k, v in out.items() if k.endswith("/all")]
    gnn_wins = bool(alls) and all(v["geomean_gnn_over_uniform"] < 1 - 1e-3 for v in alls)
    out["verdict"] = "gnn" if gnn_wins else "uniform"
    return out


def render(data: dict) -> str:
    """RESULTS.md's section (benchmarks/report.py)."""
    from benchmarks.markdown import measured_when

    lines = [f"SIMULATED; every search on this machine's CPU, {measured_when(data)}, {data['seconds']:.0f} s in all. "
             "Both priors plan as `auto` does (tree, polish, HeteroG's space) with the same budget and seed; the wall "
             "clock includes loading the network and every inference.", "",
             "| topology | GPUs | model | budget s | uniform ms | GNN ms | GNN / uniform | uniform sims | GNN sims |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        ratio = f"{r['gnn_over_uniform']:.3f}" if r["gnn_over_uniform"] else "n/a"
        lines.append(f"| {r['topology']} | {r['devices']} | {r['model']} | {r['budget_s']:g} | "
                     f"{_ms(r['uniform']['iteration_time_s'])} | {_ms(r['gnn']['iteration_time_s'])} | {ratio} | "
                     f"{r['uniform'].get('simulations')} | {r['gnn'].get('simulations')} |")
    lines += ["", "| budget / clusters | cases | geometric mean GNN / uniform | GNN faster | uniform faster | ties |",
              "|---|---|---|---|---|---|"]
    keyed = [k for k in data["summary"] if k != "verdict"]
    for key in sorted(keyed, key=lambda k: (float(k.split("s/")[0]), k)):
        v = data["summary"][key]
        lines.append(f"| {key} | {v['cases']} | {v['geomean_gnn_over_uniform']:.3f} | {v['gnn_faster']} | "
                     f"{v['uniform_faster']} | {v['ties']} |")
    sims = {kind: [r["gnn"]["simulations"] / r["uniform"]["simulations"] for r in data["rows"] if r["kind"] == kind
                   and r["gnn"].get("simulations") and r["uniform"].get("simulations")] for kind in ("small", "large")}
    lines += ["", "Simulations the GNN-guided search made in the same seconds, over pure MCTS's (median over cases and "
              "budgets): " + "; ".join(f"{kind} clusters {statistics.median(v):.2f}x" for kind, v in sims.items() if v)
              + "."]
    lines += ["", f"Verdict: `{data['summary']['verdict']}` — the prior `auto` uses by default on GPU clusters "
              "(`tag_tf.search.priors.DEFAULT_PRIOR`; the GNN only where its plans were faster at every budget)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.markdown import stamp

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="5,15,60", help="seconds per planner run, comma-separated")
    ap.add_argument("--small", type=int, default=4, help="held-out random topologies")
    ap.add_argument("--large", default="64,128,256", help="GPU counts of the large clusters (multiples of 8)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gnn_wallclock.json"))
    args = ap.parse_args()
    large = [int(x) for x in args.large.split(",") if x]
    if any(g % 8 or g < 16 for g in large):
        raise SystemExit("--large: GPU counts must be multiples of 8, at least 16")
    data = stamp(run([float(b) for b in args.budgets.split(",")], args.small, large,
                     say=lambda line: print(line, flush=True)))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    print(f"verdict: {data['summary']['verdict']}  ({args.out})")


if __name__ == "__main__":
    main()
