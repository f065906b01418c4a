"""A tied embedding's gradient synchronised in pieces, SIMULATED: BERT's word embedding is looked up
and tied to the masked-LM output layer, so its gradient sums two partial sums, the output layer's
(dense, computed first in the backward pass) and the lookup's (computed last). Whole, the sum is
synchronised once the lookup's is done: its whole all-reduce comes after the backward pass. In
pieces (`SfbCut.allreduced`, search/sfb.py `split_problems`), the dense summand is all-reduced as
soon as it is computed, overlapping the rest of the backward pass, and the lookup's is rebuilt on
every device from its gathered rows and ids or all-reduced apart (whichever the SFB MILP prices
lower); the sum is taken on every device. Traffic can grow (two summands instead of one sum), so
`apply_sfb` keeps the pieces only where the plan simulates faster.

Each row: a plan (dp, horovod-p, and `auto`'s MCTS plan before SFB, same seed and budget) on a
calibrated preset, its simulated step time with SFB as before (`whole`: the gradient synchronised
as one sum) and with the pieces tried (`pieces`), and whether they were kept.

Usage: python benchmarks/tied_gradient.py [--budget 20] [--models bert-small,bert-large]
           [--presets testbed,cloud,mixed:64] [--markdown benchmarks/RESULTS.md] [--render]
Writes benchmarks/results/tied_gradient.json and the RESULTS.md section between the markers.
"""
from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = ("bert-small", "bert-large")
PRESETS = ("testbed", "cloud", "mixed:64")
PLANS = ("dp", "horovod-p", "auto")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tied_gradient.json")
BEGIN, END = "<!-- tied-gradient:begin -->", "<!-- tied-gradient:end -->"
TITLE = "A tied embedding's gradient in pieces (simulated)"


def run_row(model: str, preset: str, budget: float) -> dict[str, Any]:
    from benchmarks.pipeline import analysis_for_row
    from tag_tf.errors import StrategyError
    from tag_tf.search.mcts import MctsOptions, mcts_search
    from tag_tf.search.registry import baseline
    from tag_tf.search.sfb import apply_sfb
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    analysis = analysis_for_row(model, preset)
    topology = load_topology(preset)
    sim = Simulator(analysis, topology)
    row: dict[str, Any] = {"batch": analysis.batch_size, "plans": {}}
    for name in PLANS:
        if name == "auto":
            plan = mcts_search(sim, topology, MctsOptions(budget_s=budget, seed=0, pipeline=False)).strategy
        else:
            plan = baseline(name, sim.num_groups, topology)
        try:
            whole = apply_sfb(sim, plan, pieces=False)
            pieces = apply_sfb(sim, plan, pieces=True)
        except StrategyError as e:          # e.g. a batch smaller than the plan's replicas
            row["plans"][name] = {"error": str(e)}
            continue
        kept = [c for c in pieces.strategy.sfb if c.allreduced]
        row["plans"][name] = {
            "devices": len({d for g in plan.groups for d in g.devices}),
            "before_ms": whole.before_s * 1e3, "whole_ms": whole.after_s * 1e3, "pieces_ms": pieces.after_s * 1e3,
            "speedup": whole.after_s / pieces.after_s, "tried": pieces.pieces_tried > 0, "kept": bool(kept),
            "rebuilt_from_rows": any(len(c.ops) > 1 for c in kept),
            "allreduced": [t for c in kept for t in c.allreduced]}
    return row


def verdicts(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cells = {f"{k}/{p}": c for k, r in rows.items() for p, c in r["plans"].items() if "error" not in c}
    return {"kept": sorted(k for k, c in cells.items() if c["kept"]),
            "never_slower": all(c["pieces_ms"] <= c["whole_ms"] * (1 + 1e-9) for c in cells.values()),
            "best_speedup": max((c["speedup"] for c in cells.values()), default=None)}


def render(data: dict[str, Any]) -> str:
    v = data["verdicts"]
    lines = [f"SIMULATED ({data['date']}, code {data['commit']}; `auto`: MCTS, {data['budget_s']:g} s, seed 0, "
             "without pipelining). BERT's word-embedding gradient (lookup + tied output layer) synchronised as one "
             "sum after the backward pass (`whole`) or in pieces, the dense summand all-reduced as soon as it is "
             "computed (`pieces`, kept only where the plan simulates faster). Both with SFB as the planner applies "
             "it.", "",
             "| preset / model | batch | plan | before SFB, ms | whole, ms | pieces, ms | speed-up | kept |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in data["rows"].items():
        for name, c in r["plans"].items():
            if "error" in c:
                lines.append(f"| {key} | {r['batch']} | {name} | - | - | - | - | cannot run: {c['error']} |")
                continue
            how = (("yes, lookup rebuilt from its rows" if c["rebuilt_from_rows"] else "yes, both all-reduced apart")
                   if c["kept"] else "no, simulated slower" if c.get("tried") else "not tried")
            used = c.get("devices")
            name = name if used is None else f"{name} ({'one device' if used == 1 else f'{used} devices'})"
            lines.append(f"| {key} | {r['batch']} | {name} | {c['before_ms']:.1f} | {c['whole_ms']:.1f} | "
                         f"{c['pieces_ms']:.1f} | {c['speedup']:.3f}x | {how} |")
    best = v["best_speedup"]
    ran = sum("error" not in c for r in data["rows"].values() for c in r["plans"].values())
    lines += ["", f"Kept on {len(v['kept'])} of {ran} plans that ran"
              + (f" (best {best:.3f}x)" if best else "") + "; never slower: "
              + ("yes" if v["never_slower"] else "NO") + ". Not tried: SFB already rebuilds the whole tied gradient "
              "from its factors, or its summands are not in one allreduce group of the plan. Simulated slower: the "
              "pieces' traffic (two all-reduces, or the lookup's rows gathered to every device) costs more than the "
              "overlap gives."]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.markdown import simulated_study

    simulated_study(__doc__, models=MODELS, presets=PRESETS, out=OUT, title=TITLE, markers=(BEGIN, END),
                    run_row=run_row, verdicts=verdicts,
                    line=lambda row: ", ".join(f"{p} {c['whole_ms']:.1f} -> {c['pieces_ms']:.1f} ms"
                                               for p, c in row["plans"].items() if "error" not in c))


if __name__ == "__main__":
    main()
