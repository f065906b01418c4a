"""The strategy creator (MCTS) against the greedy local search, side by side in one run.

For each paper model on the calibrated `testbed` and `cloud` presets: the fixed baselines, the
compute lower bound, `--search local` and `--search mcts` (with each of `--priors`, the first of
which the targets judge: by default the shipped GNN's, what `auto` runs) at the same budget,
simulations per second, and how soon MCTS beat DP.
Everything is SIMULATED (no GPU ran any of it) on this machine's 2 CPU cores.

Usage: python benchmarks/strategy_creator.py [--budget 30] [--models vgg19,...] [--presets testbed,cloud]
       [--priors gnn,uniform]
Writes benchmarks/results/strategy_creator.json; `render` makes RESULTS.md's section from it.
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

from benchmarks.markdown import measured_when, stamp  # noqa: E402
from tag_tf.frontend.commands.calibrate import CaseBuilder  # noqa: E402
from tag_tf.search.local_search import local_search  # noqa: E402
from tag_tf.search.mcts import MctsOptions, mcts_search  # noqa: E402
from tag_tf.search.priors import DEFAULT_PRIOR, PRIORS  # noqa: E402
from tag_tf.sim.simulator import Simulator  # noqa: E402
from tag_tf.topology.load import load_topology  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small", "bert-large")
# The targets of #11, recorded in the JSON (`target`) so that the section states them from the run.
TARGET = {"beat_dp_s": 10.0, "mcts_over_local": 1.10, "mcts_over_local_models": 3, "testbed_vs_bound": 2.0}


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
    faster = sorted(k for k, r in rows.items() if (r["mcts_over_local"] or 0) >= TARGET["mcts_over_local"])
    bound = {k: r["mcts_vs_bound"] for k, r in rows.items()
             if k in ("testbed/vgg19", "testbed/transformer", "testbed/bert-small")}
    targets = {"mcts_10pct_faster_than_local": faster,
               "mcts_10pct_faster_than_local_models": len({k.split("/")[1] for k in faster}),
               "testbed_within_2x_of_bound": {k: bool(v is not None and v <= TARGET["testbed_vs_bound"])
                                              for k, v in bound.items()},
               "beats_dp_within_10s": {k: bool((r["mcts"]["time_to_beat_dp_s"] or math.inf) <= TARGET["beat_dp_s"])
                                       for k, r in rows.items() if r["baselines_s"].get("dp") is not None}}
    out = {"simulated": True, "machine": platform.processor() or platform.machine(), "budget_s": args.budget,
           "priors": priors, "rows": rows, "targets": targets, "target": TARGET}
    out = stamp(out)
    print(json.dumps(targets, indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(f"-> {args.out}")


def _ms(t: float | None) -> str:
    return "n/a" if t is None else f"{t * 1e3:.1f} ms"


def _span(values, fmt: str) -> str:
    """"3.0-4.2" (or "3.0" when the ends agree) of `values` formatted with `fmt`."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _best_baseline(row: dict) -> tuple[str, float] | None:
    fits = [(k, v) for k, v in row["baselines_s"].items() if v is not None]
    return min(fits, key=lambda kv: kv[1]) if fits else None


def render(data: dict) -> str:
    """RESULTS.md's strategy-creator section (everything after its heading) from strategy_creator.json."""
    rows, targets, target = data["rows"], data.get("targets", {}), data.get("target")
    budget = f"{data['budget_s']:g} s"
    presets = list(dict.fromkeys(k.split("/")[0] for k in rows))
    prior = (data.get("priors") or ["uniform"])[0]

    def ms(t: float | None) -> str:
        return "n/a" if t is None else f"{t * 1e3:.1f}"

    def x(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}x"

    guided = ("guided by the shipped GNN (`tag_tf/search/weights/gnn.pt`, #12; the root's actions swept once in its "
              "order, then the prior mixed half and half with the uniform one)" if prior == "gnn"
              else f"with the `{prior}` prior")
    fell_back = sorted(k for k, r in rows.items() if r["mcts"].get("fell_back"))
    others = [p for p in data.get("priors", [])[1:]]
    lines = [f"Both searches get the same {budget} budget in one run on this machine ({data.get('machine', 'CPU')}), "
             f"{measured_when(data)}, on the calibrated presets ({', '.join(presets)}), on the models without "
             f"dropout. MCTS runs as `auto` does: {guided}. Its polish includes group refinement (the groups "
             "column: METIS groups, balance, and the groups of the final plan after dominant groups were split). "
             "The baselines include HeteroG, which MCTS searches for a capped share of its budget. \"DP beaten "
             "at\" counts MCTS iterations; the time includes the baselines and that HeteroG search. "
             + ("MCTS never fell back to a baseline." if not fell_back
                else f"MCTS fell back to a baseline on {', '.join(fell_back)}.")
             + (f" The other priors run ({', '.join(others)}) are in the JSON (`mcts_<prior>`)." if others else ""),
             "",
             "| preset | model | groups (balance) -> after refinement | best baseline (ms) | local (ms) | MCTS (ms) | "
             "MCTS vs local | MCTS / bound | bound (ms) | DP beaten at iteration (s) | sims/s local / MCTS |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        preset, model = key.split("/", 1)
        m, best = r["mcts"], _best_baseline(r)
        if r["baselines_s"].get("dp") is None:
            dp = "n/a (DP does not fit)"
        elif m.get("iterations_to_beat_dp") is None:
            dp = "not beaten"
        else:
            dp = f"{m['iterations_to_beat_dp']} ({m['time_to_beat_dp_s']:.1f})"
        lines.append(f"| {preset} | {model} | {r['groups']} ({r['group_balance']:.2f}) -> {m['groups_after_refinement']} | "
                     f"{'n/a (-)' if best is None else f'{ms(best[1])} ({best[0]})'} | "
                     f"{ms(r['local']['iteration_time_s'])} | {ms(m['iteration_time_s'])} | {x(r['mcts_over_local'])} | "
                     f"{x(r['mcts_vs_bound'])} | {ms(r['lower_bound_s'])} | {dp} | "
                     f"{r['local']['sims_per_s']:.0f} / {m['sims_per_s']:.0f} |")
    lines += ["", "What this says (targets of #11):"]

    # DP: how soon MCTS beats it, and the best baseline.
    with_dp = {k: r for k, r in rows.items() if r["baselines_s"].get("dp") is not None}
    no_dp = sorted(set(rows) - set(with_dp))
    beaten = {k: r["mcts"] for k, r in with_dp.items() if r["mcts"].get("iterations_to_beat_dp") is not None}
    if beaten:
        its = {m["iterations_to_beat_dp"] for m in beaten.values()}
        at = "at its first iteration" if its == {1} else f"within {max(its)} iterations"
        where = ("on every row where DP fits" if len(beaten) == len(with_dp) else
                 f"on {len(beaten)} of the {len(with_dp)} rows where DP fits")
        if no_dp:
            where += f" (DP does not fit {', '.join(no_dp)})"
        dp_target = targets.get("beats_dp_within_10s", {})
        met = sum(bool(v) for v in dp_target.values())
        goal = ("" if not dp_target else f"; target: {(target or {}).get('beat_dp_s', 10):g} s, " + (f"met on all {met}" if met == len(dp_target)
                                                                 else f"met on {met} of {len(dp_target)}"))
        sentence = (f"- MCTS beats DP {at} {where}, within {_span([m['time_to_beat_dp_s'] for m in beaten.values()], '.1f')} s "
                    f"of starting (almost all of it the baselines and HeteroG's search{goal})")
    else:
        sentence = "- MCTS beats DP on no row"
    if all(r["mcts"]["seconds"] <= data["budget_s"] for r in rows.values()):
        sentence += f", plans within the {budget}"
    over_best = {k: r["mcts_over_best_baseline"] for k, r in rows.items() if r["mcts_over_best_baseline"] is not None}
    if over_best:
        slower = sorted(k for k, v in over_best.items() if v < 1)
        testbed = [v for k, v in over_best.items() if k.startswith("testbed/")]
        sentence += (", and is never slower than the best baseline" if not slower
                     else f", and is slower than the best baseline on {', '.join(slower)}")
        if testbed and not slower:
            sentence += f" ({_span(testbed, '.1f')}x faster on the testbed)"
    lines.append(sentence + ".")

    # Against the local search.
    vs = {k: r["mcts_over_local"] for k, r in rows.items() if r["mcts_over_local"] is not None}
    bar = (target or {}).get("mcts_over_local", 1.10)
    big = sorted((k for k, v in vs.items() if v >= bar), key=lambda k: -vs[k])
    mid = sorted((k for k, v in vs.items() if 1.03 <= v < bar), key=lambda k: -vs[k])
    slow = sorted(k for k, v in vs.items() if v <= 0.97)
    even = sorted(k for k, v in vs.items() if 0.97 < v < 1.03)
    parts = [", ".join(f"{vs[k] - 1:.0%} faster on {k}" for k in big)] if big else []
    if mid:
        parts.append(f"{_span([vs[k] - 1 for k in mid], '.0%').replace('%-', '-')} faster on {len(mid)} more "
                     f"({', '.join(mid)})")
    if even:
        parts.append(f"equal within {max(abs(vs[k] - 1) for k in even):.0%} on {len(even)} "
                     f"({_grouped(even, presets, rows)})")
    if slow:
        parts.append(f"slower on {', '.join(slow)}")
    text = f"- Against the local search at the same {budget}, MCTS is " + "; ".join(parts) + "."
    count = targets.get("mcts_10pct_faster_than_local_models")
    if count is not None:
        text += f" Models on which MCTS is 10% or more faster: {count}"
        if target and "mcts_over_local_models" in target:
            need = target["mcts_over_local_models"]
            text += (f"; the target, {target['mcts_over_local'] - 1:.0%} on {need} models, is "
                     f"{'met' if count >= need else 'NOT met'}")
        text += "."
    gnn = "The GNN's inference costs the tree" if prior == "gnn" else "The prior costs the tree"
    text += (" Both searches end in near-uniform plans over the fast GPUs: on the cloud, the GPUs of one machine "
             "(its network makes any plan across machines slower); on the testbed, its two fastest GPU kinds. At that "
             "point the calibrated per-op executor overhead (paid by every replica, for thousands of ops) dominates "
             f"each device's time, and both searches find the same kind of plan. {gnn} most of its simulations "
             f"(sims/s above: {_span([r['mcts']['sims_per_s'] for r in rows.values()], '.0f')} against "
             f"{_span([r['local']['sims_per_s'] for r in rows.values()], '.0f')} for the local search) without "
             "costing plan quality: the tree converges on the same plans, and the polish does the rest.")
    lines.append(text)

    # The lower bound.
    within = targets.get("testbed_within_2x_of_bound", {})
    judged = ", ".join(f"{k.split('/', 1)[1]} {x(rows[k]['mcts_vs_bound'])} ({'met' if ok else 'NOT met'})"
                       for k, ok in sorted(within.items(), key=lambda kv: rows[kv[0]]["mcts_vs_bound"] or 0))
    lines.append("- `lower_bound_s` spreads all compute, per-op overheads included, over all devices as if it were "
                 "divisible; no plan can do that (replicas repeat the overhead, a layer chain runs in order)."
                 + (f" Within {(target or {}).get('testbed_vs_bound', 2):g}x of it on the testbed: {judged}." if judged else "")
                 + " A tighter bound that stays valid for every plan is not easy to state: for BERT-Small on the "
                 "testbed, the critical path of per-op fixed costs alone is already below the bound above.")
    return "\n".join(lines) + "\n"


def _grouped(keys: list[str], presets: list[str], every) -> str:
    """"all of cloud; testbed: bert-large" for preset/model keys (`every`: all the keys of the run)."""
    out = []
    for preset in presets:
        models = [k.split("/", 1)[1] for k in keys if k.split("/", 1)[0] == preset]
        if models and len(models) == sum(k.split("/", 1)[0] == preset for k in every):
            out.append(f"all of {preset}")
        elif models:
            out.append(f"{preset}: {', '.join(models)}")
    return "; ".join(out)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"{time.perf_counter() - t0:.0f} s")
