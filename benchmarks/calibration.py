"""Calibration of the simulated testbed against the TAG paper's measured per-iteration times.

1. Fit (`tag-tf calibrate`'s code) on the 11 "fit" figures of benchmarks/data/paper_measurements.json
   (testbed DP-NCCL; 2x GTX 1080 Ti at batch 4, DP-NCCL without SFB), predict the held-out ones
   (testbed DP-NCCL-P and Horovod), and report both apart, with the datasheet ("nominal") errors.
2. Per model, whether the simulated order of DP-NCCL, DP-NCCL-P and Horovod agrees with the paper's
   wherever the paper's gap exceeds 5%.
3. `auto` on the calibrated `testbed` and `cloud` presets: speed-up over DP per model beside the
   paper's TAG (testbed: its figure; cloud: its speed-up table, VGG19/InceptionV3 rows swapped back
   to match the figure).

Everything here is SIMULATED (no GPU ran any of it); the paper's numbers are measured on its testbed.
Usage: python benchmarks/calibration.py [--budget 10] [--skip-auto]
Writes benchmarks/results/calibration.json (and, with --write-shipped, the presets' calibration files);
`render` makes RESULTS.md's calibration section from that JSON alone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.markdown import measured_when, stamp  # noqa: E402
from tag_tf.frontend.commands.calibrate import CaseBuilder, calibrate  # noqa: E402
from tag_tf.search.local_search import local_search  # noqa: E402
from tag_tf.search.registry import baseline  # noqa: E402
from tag_tf.sim.calibration import Calibration  # noqa: E402
from tag_tf.sim.simulator import Simulator  # noqa: E402
from tag_tf.topology.load import load_topology  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "paper_measurements.json")
MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small")
# A pair of (dp, dp-p, horovod) counts in `order_agreement` where the paper's times differ by more.
ORDER_MIN_GAP = 0.05
# Paper, speed-up of TAG over DP-NCCL: testbed from its per-iteration figure (DP / TAG), cloud from
# its table (1 + x%), with that table's VGG19/InceptionV3 rows swapped back to match the figure.
PAPER_TAG_SPEEDUP = {
    "testbed": {"vgg19": 1.4561 / 0.2618, "resnet101": 0.7929 / 0.7365, "inceptionv3": 0.5593 / 0.1448,
                "transformer": 1.1889 / 0.6594, "bert-small": 0.2704 / 0.0679},
    "cloud": {"vgg19": 2.177, "resnet101": 1.122, "inceptionv3": 1.436, "transformer": 1.150, "bert-small": 1.845},
}


def order_agreement(rows: dict[str, dict[str, float]], simulated: dict[str, float]) -> dict[str, dict]:
    """Per model: each pair of (dp, dp-p, horovod) whose paper gap exceeds 5% must be ordered alike."""
    out = {}
    for model in MODELS:
        paper = {s: rows.get(f"fig-iter/{s}/{model}") for s in ("dp", "dp-p", "horovod")}
        ours = {s: simulated.get(f"fig-iter/{s}/{model}") for s in ("dp", "dp-p", "horovod")}
        pairs = []
        for a, b in (("dp", "dp-p"), ("dp", "horovod"), ("dp-p", "horovod")):
            if None in (paper[a], paper[b], ours[a], ours[b]):
                continue
            gap = abs(paper[a] / paper[b] - 1)
            if gap > ORDER_MIN_GAP:
                pairs.append({"pair": f"{a} vs {b}", "paper_gap": round(gap, 3),
                              "agrees": (paper[a] < paper[b]) == (ours[a] < ours[b])})
        out[model] = {"paper_s": paper, "simulated_s": ours, "pairs": pairs,
                      "agrees": all(p["agrees"] for p in pairs)}
    return out


SHIPPED = os.path.join(os.path.dirname(HERE), "tag_tf", "profile", "data", "calibration_testbed.json")


def evaluate(calibration: Calibration) -> dict:
    """`calibration`'s errors on this code: every paper figure, fitted and held out, simulated with it,
    the two MAPEs and the order agreement."""
    from tag_tf.frontend.commands.calibrate import load_measurements
    from tag_tf.search.calibration_fit import simulate_cases

    topologies, rows = load_measurements(DATA)
    builder = CaseBuilder(topologies, 60)
    out: dict = {}
    for part, role in (("fitted", "fit"), ("held_out", "held_out")):
        cases = [builder.case(r) for r in rows if r.get("role", "fit") == role]
        out[part] = {c.label: {"measured_s": c.seconds, "simulated_s": s, "error": s / c.seconds - 1}
                     for c, s in zip(cases, simulate_cases(cases, calibration))}
        out[f"mape_{part}"] = sum(abs(r["error"]) for r in out[part].values()) / len(out[part])
    paper = {r["id"]: r["seconds"] for r in rows}
    simulated = {k: v["simulated_s"] for part in ("fitted", "held_out") for k, v in out[part].items()}
    out["order"] = order_agreement(paper, simulated)
    return out


def not_worse(refit: dict, shipped: dict) -> bool:
    """Whether a re-fit may replace the shipped calibration: fitted and held-out MAPE both no worse."""
    return refit["mape_fitted"] <= shipped["mape_fitted"] and refit["mape_held_out"] <= shipped["mape_held_out"]


def auto_speedups(builder: CaseBuilder, budget: float) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for preset in ("testbed", "cloud"):
        topo = load_topology(preset)
        for model in MODELS:
            sim = Simulator(builder.analysis(model, None), topo)          # the preset's default calibration
            dp = sim.simulate(baseline("dp", sim.num_groups, topo))
            result = local_search(sim, topo, budget_s=budget)
            dp_s = float("inf") if dp.oom else dp.iteration_time_s
            out[f"{preset}/{model}"] = {
                "calibration": sim.calibration_name, "dp_s": dp_s, "auto_s": result.iteration_time_s,
                "best_baseline": result.best_baseline, "baselines_s": result.baselines,
                "speedup_over_dp": dp_s / result.iteration_time_s,
                "paper_tag_speedup": PAPER_TAG_SPEEDUP[preset][model]}
            print(f"  {preset}/{model}: auto {result.iteration_time_s * 1e3:.1f} ms, dp {dp_s * 1e3:.1f} ms, "
                  f"{dp_s / result.iteration_time_s:.2f}x (paper TAG {PAPER_TAG_SPEEDUP[preset][model]:.2f}x)",
                  flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--skip-auto", action="store_true")
    ap.add_argument("--write-shipped", action="store_true",
                    help="also write tag_tf/profile/data/calibration_testbed.json (and the cloud's) from this fit, "
                         "where its fitted and held-out errors are no worse than the shipped calibration's on this code")
    args = ap.parse_args()
    start = time.perf_counter()
    out = calibrate(DATA, "testbed", progress=lambda i, cost: print(f"  fit iteration {i}: cost {cost:.4f}",
                                                                    flush=True))
    calibration, report = out["calibration"], out["report"]
    paper = {r["id"]: r["seconds"] for r in json.loads(Path(DATA).read_text())["measurements"]}
    simulated = {k: v["simulated_s"] for part in ("fitted", "held_out") for k, v in report[part].items()}
    result = {
        "simulated": True, "machine": platform.processor() or platform.machine(),
        "calibration": calibration.to_dict(), "mape_fitted": report["mape_fitted"],
        "mape_held_out": report["mape_held_out"],
        "mape_nominal_fitted": sum(abs(report["nominal"][k]["error"]) for k in report["fitted"]) / len(report["fitted"]),
        "mape_nominal_held_out": sum(abs(report["nominal"][k]["error"]) for k in report["held_out"]) / len(report["held_out"]),
        "order": order_agreement(paper, simulated), "order_min_gap": ORDER_MIN_GAP, "seconds": None}
    # The shipped calibration (what the presets simulate with) judged on this code beside the re-fit:
    # a re-fit replaces it only where it is no worse, fitted and held out.
    shipped = evaluate(Calibration.load(SHIPPED))
    result["shipped"] = {"file": os.path.relpath(SHIPPED, os.path.dirname(HERE)), **shipped}
    write = args.write_shipped and not_worse(result, shipped)
    if args.write_shipped and not write:
        print(f"not writing the shipped calibration: the re-fit ({result['mape_fitted']:.1%} fitted, "
              f"{result['mape_held_out']:.1%} held out) is worse than the shipped one on this code "
              f"({shipped['mape_fitted']:.1%}, {shipped['mape_held_out']:.1%})")
    result["in_use"] = "re-fit" if write else "shipped"
    if write:
        data_dir = os.path.join(os.path.dirname(HERE), "tag_tf", "profile", "data")
        calibration.save(os.path.join(data_dir, "calibration_testbed.json"))
        # No cloud measurement exists: the testbed's transport and executor physics carry over,
        # GPU types outside the fit (the T4) take compute_eff:*.
        values = {**calibration.values, "compute_eff:V100-16GB": calibration.value("compute_eff:V100-32GB")}
        provenance = {k: f"{v}; applied to the cloud preset as fitted on the testbed (same TF transport and executor)"
                      for k, v in calibration.provenance.items()}
        provenance["compute_eff:V100-16GB"] = "the testbed's compute_eff:V100-32GB (same GV100 chip, less memory)"
        Calibration("cloud", values, provenance,
                    {"derived_from": "calibration_testbed.json",
                     "note": "no cloud measurement exists to fit; the testbed's transport and executor physics "
                             "carry over, GPU types outside the fit take compute_eff:*"}
                    ).save(os.path.join(data_dir, "calibration_cloud.json"))
    if not args.skip_auto:
        builder = CaseBuilder({}, 60)
        result["auto"] = auto_speedups(builder, args.budget)
        result["auto_budget_s"] = args.budget
    result["seconds"] = round(time.perf_counter() - start, 1)
    result = stamp(result)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "calibration.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"fitted MAPE {result['mape_fitted'] * 100:.1f}% (nominal {result['mape_nominal_fitted'] * 100:.1f}%), "
          f"held out {result['mape_held_out'] * 100:.1f}% (nominal {result['mape_nominal_held_out'] * 100:.1f}%); "
          f"order agrees for {sum(o['agrees'] for o in result['order'].values())}/{len(MODELS)} models -> {path}")
    shipped = result["shipped"]
    print(f"shipped calibration on this code: fitted MAPE {shipped['mape_fitted'] * 100:.1f}%, held out "
          f"{shipped['mape_held_out'] * 100:.1f}%, order agrees for "
          f"{sum(o['agrees'] for o in shipped['order'].values())}/{len(MODELS)} models; in use: {result['in_use']}")


# Every run before the JSON recorded `order_min_gap` used 5% (unchanged since this file was written).
_ORDER_MIN_GAP_UNRECORDED = 0.05
_GPU = {"V100-32GB": "V100", "GTX1080Ti": "1080 Ti", "P100": "P100"}      # also the basins table's order
_MODEL = {"vgg19": "VGG19", "resnet101": "ResNet-101", "inceptionv3": "InceptionV3",
          "transformer": "the Transformer", "bert-small": "BERT-Small"}
_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_CLOSE = 1.5        # auto's speed-up over DP reads "close to" the paper's TAG within this factor either way


def _word(n: int) -> str:
    return _WORDS[n] if 0 <= n < len(_WORDS) else str(n)


def _names(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _gpu(key: str) -> str:
    """'compute_eff:GTX1080Ti' -> '1080 Ti'."""
    gpu = key.partition(":")[2]
    return _GPU.get(gpu, gpu)


def _gpu_keys(values: dict[str, float]) -> list[str]:
    """The fitted GPU types' compute_eff keys (not the derived `compute_eff:*`), V100, 1080 Ti, P100 first."""
    order = list(_GPU)

    def rank(key: str) -> tuple[int, str]:
        gpu = key.partition(":")[2]
        return (order.index(gpu) if gpu in order else len(order), gpu)
    return sorted((k for k in values if k.startswith("compute_eff:") and k != "compute_eff:*"), key=rank)


def _straggler(values: dict[str, float]) -> str:
    """The compute_eff key of the GPU type a fit makes slowest relative to its priors."""
    return min(_gpu_keys(values), key=lambda k: values[k])


def _speedup(x: float) -> str:
    return f"{x:.2f}x" if x < _CLOSE else f"{x:.1f}x"


def _span(xs: list[float]) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}x"


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=104, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _figures_table(data: dict) -> list[str]:
    """Every paper figure: measured, datasheet-simulated and calibrated-simulated, then the MAPEs."""
    fit = data["calibration"]["fit"]
    lines = ["| figure | role | paper (s) | datasheet sim (s) | error | calibrated sim (s) | error |",
             "|---|---|---|---|---|---|---|"]
    for role, part in (("fit", "fitted"), ("held out", "held_out")):
        for key, row in sorted(fit[part].items()):
            nominal = fit["nominal"][key]
            lines.append(f"| {key} | {role} | {row['measured_s']:.4f} | {nominal['simulated_s']:.4f} | "
                         f"{nominal['error'] * 100:+.0f}% | {row['simulated_s']:.4f} | {row['error'] * 100:+.1f}% |")
    return lines + ["", f"MAPE: fitted {data['mape_fitted']:.1%} (datasheet {data['mape_nominal_fitted']:.1%}), "
                        f"held out {data['mape_held_out']:.1%} (datasheet {data['mape_nominal_held_out']:.1%})."]


def _shipped_table(data: dict) -> list[str]:
    """The calibration the presets simulate with (shipped) against this run's re-fit, both on this code."""
    shipped = data.get("shipped")
    if not shipped:
        return []

    def agrees(order: dict) -> str:
        return f"{sum(o['agrees'] for o in order.values())}/{len(order)}"

    in_use = data.get("in_use", "shipped")
    return ["| calibration (simulated on this run's code) | fitted MAPE | held-out MAPE | order agrees | in use |",
            "|---|---|---|---|---|",
            f"| shipped (`{shipped['file']}`) | {shipped['mape_fitted']:.1%} | {shipped['mape_held_out']:.1%} | "
            f"{agrees(shipped['order'])} | {'yes' if in_use == 'shipped' else 'no'} |",
            f"| this run's re-fit | {data['mape_fitted']:.1%} | {data['mape_held_out']:.1%} | {agrees(data['order'])} | "
            f"{'yes' if in_use == 're-fit' else 'no'} |", ""]


def _reading_shipped(data: dict) -> list[str]:
    shipped = data.get("shipped")
    if not shipped:
        return []
    if data.get("in_use") == "re-fit":
        return [f"This re-fit replaced the shipped calibration: on this code it is no worse, fitted "
                f"({data['mape_fitted']:.1%} against {shipped['mape_fitted']:.1%}) and held out "
                f"({data['mape_held_out']:.1%} against {shipped['mape_held_out']:.1%})."]
    return [f"The presets keep the shipped calibration: on this code it is {shipped['mape_fitted']:.1%} off the fitted "
            f"figures and {shipped['mape_held_out']:.1%} off the held-out ones, where this run's re-fit is "
            f"{data['mape_fitted']:.1%} and {data['mape_held_out']:.1%} (a re-fit replaces it only where it is "
            "no worse on both; the per-figure table above is the re-fit's)."]


def _basins_table(calibration: dict) -> list[str]:
    """The fitted values, then every start of the fit with the compute_eff it reached."""
    values = ", ".join(f"`{k}` = {v:.3g}" for k, v in sorted(calibration["values"].items()))
    basins = calibration["fit"]["basins"]
    gpus = _gpu_keys(basins[0]["values"])
    lines = [f"Fitted values: {values}.", "",
             "Fit basins (every start; among the fits the figures cannot tell apart, `choose_basin` keeps the "
             "datasheet's GPU order best):", "",
             f"| start | cost | MAPE fitted | {' / '.join(_gpu(k) for k in gpus)} compute_eff | speed inversions | "
             "tied with the best | chosen |", "|---|---|---|---|---|---|---|"]
    for b in basins:
        effs = " / ".join(f"{b['values'][k]:.2f}" for k in gpus)
        tied = "" if "tied" not in b else ("yes" if b["tied"] else "no")
        lines.append(f"| {b['start']} | {b['cost']:.4f} | {b['mape']:.1%} | {effs} | {b['speed_inversions']} | "
                     f"{tied} | {'yes' if b['chosen'] else ''} |")
    return lines


def _order_table(data: dict) -> list[str]:
    """Per model, whether the simulated order of DP-NCCL, DP-NCCL-P and Horovod is the paper's."""
    gap = f"{data.get('order_min_gap', _ORDER_MIN_GAP_UNRECORDED):.0%}"

    def times(t: dict[str, float | None]) -> str:
        return " / ".join("—" if t.get(s) is None else f"{t[s]:.3f}" for s in ("dp", "dp-p", "horovod"))
    lines = [f"Order of DP-NCCL / DP-NCCL-P / Horovod per model, wherever the paper's gap exceeds {gap} "
             "(simulated s: dp, dp-p, horovod):", "",
             "| model | simulated dp / dp-p / horovod (s) | paper | pairs (paper gap) | agrees |",
             "|---|---|---|---|---|"]
    for model, o in sorted(data["order"].items()):
        pairs = "; ".join(f"{p['pair']} ({p['paper_gap']:.0%}): {'yes' if p['agrees'] else 'no'}" for p in o["pairs"])
        lines.append(f"| {model} | {times(o['simulated_s'])} | {times(o['paper_s'])} | {pairs or f'none over {gap}'} | "
                     f"{'yes' if o['agrees'] else 'no'} |")
    return lines


def _auto_table(data: dict) -> list[str]:
    """`auto`'s speed-up over DP per preset and model beside the paper's TAG."""
    lines = [f"`auto` ({data['auto_budget_s']:g} s budget) on the calibrated presets, speed-up over DP beside the "
             "paper's TAG:", "",
             "| preset | model | DP (ms) | auto (ms) | auto / DP | paper TAG / DP-NCCL |",
             "|---|---|---|---|---|---|"]
    for key, r in sorted(data["auto"].items()):
        preset, model = key.split("/", 1)
        lines.append(f"| {preset} | {model} | {r['dp_s'] * 1e3:.1f} | {r['auto_s'] * 1e3:.1f} | "
                     f"{r['speedup_over_dp']:.2f}x | {r['paper_tag_speedup']:.2f}x |")
    return lines


def _reading_error(data: dict) -> str:
    fitted, held = data["mape_fitted"], data["mape_held_out"]
    verdict = ("the held-out figures as close as the fitted ones, so the fit is not memorising figures" if held <= fitted
               else f"the held-out figures {(held - fitted) * 100:.1f} points further off than the fitted ones")
    return (f"The datasheet simulator was {data['mape_nominal_fitted']:.0%} (fitted figures) and "
            f"{data['mape_nominal_held_out']:.0%} (held out) off the paper's measurements; calibrated, {fitted:.1%} "
            f"and {held:.1%}, {verdict}.")


def _reading_order(data: dict) -> str:
    order = data["order"]
    wrong = [_MODEL.get(m, m) for m in MODELS if m in order and not order[m]["agrees"]]
    head = ("The order of DP-NCCL, DP-NCCL-P and Horovod now agrees with the paper for every model." if not wrong
            else f"The order of DP-NCCL, DP-NCCL-P and Horovod disagrees with the paper for {_names(wrong)}.")
    faster = [f"{order[m]['paper_s']['dp'] / order[m]['paper_s']['horovod'] - 1:.0%}" for m in ("vgg19", "transformer")]
    return (f"{head} Before DP waited for the backward pass, the simulation put Horovod and DP level on VGG19 and "
            f"the Transformer (the paper: Horovod {faster[0]} and {faster[1]} faster). VGG19 has few gradients "
            "(fusion changes little): the gain is overlap, which is what the paper's Horovod adds over its in-graph "
            "DP-NCCL.")


def _reading_basins(calibration: dict) -> str:
    basins, values, params = calibration["fit"]["basins"], calibration["values"], calibration["parameters"]
    costs = [b["cost"] for b in basins]
    groups: dict[str, list[float]] = {}
    for b in basins:
        key = _straggler(b["values"])
        groups.setdefault(key, []).append(b["values"][key])
    blames: list[str] = []
    for key, effs in sorted(groups.items(), key=lambda g: -len(g[1])):
        pct = "-".join(sorted({f"{e:.0%}" for e in effs}))
        if blames:
            blames.append(f"{_word(len(effs))} the {_gpu(key)}s ({pct})")
        else:
            verb = "blames" if len(effs) == 1 else "blame"
            blames.append(f"{_word(len(effs))} {verb} the {_gpu(key)}s ({pct} of the cost model's efficiency)")
    chosen = _straggler(values)
    tied = [b for b in basins if b.get("tied", True)]
    tied_costs = [b["cost"] for b in tied]
    if len(tied) < len(basins):
        apart = (f" {_word(len(tied)).capitalize()} of them the figures cannot tell apart (costs within "
                 f"{(max(tied_costs) / min(tied_costs) - 1):.1%}: Akaike's criterion within 2 of the best fit's)")
    else:
        apart = " The figures cannot tell them apart"
    text = (f"The fit is not unique physics. {_word(len(basins)).capitalize()} starts reach {_word(len(basins))} fits "
            f"with costs within {(max(costs) / min(costs) - 1):.2%}: {', '.join(blames)}.{apart}; `choose_basin` "
            "keeps the one that inverts the fewest pairs of the datasheet's GPU speed "
            f"order ({_gpu(chosen)} slow).")
    if chosen == "compute_eff:P100" and any("tied" in b for b in basins):
        text += (" Said plainly: this tie rule replaced a 1% cost tolerance on 2026-11-27, after a re-fit under "
                 "that tolerance chose the slow-V100 basin (4% lower cost; MAPE 11.2% against 11.3% on the fitted "
                 "figures) and missed the "
                 "held-out ones by 18.2% (with slow V100s, capacity-proportional shares make DP-NCCL-P slower than "
                 "DP-NCCL, the opposite of what the paper measured). The held-out figures informed that change of "
                 "rule, so they no longer check the choice of basin blindly; the rule itself is the textbook one.")
    elif chosen == "compute_eff:P100":      # a check of this choice, made once by hand
        text += (" The held-out DP-NCCL-P figures agree: with slow V100s, capacity-proportional shares would make "
                 "DP-NCCL-P slower than DP-NCCL on InceptionV3 (a one-off simulation, its times not in this JSON), "
                 "the opposite of what the paper measured; that check was made after the choice, never used for it.")
    gtx, lat = "compute_eff:GTX1080Ti", "inter_latency_s"
    if gtx in values:
        text += (f" The 1080 Ti sits at its upper bound ({values[gtx]:g}x the priors), because the figures measured "
                 "on 1080 Tis alone (the SFB table's) are fast;" if values[gtx] >= params[gtx]["high"]
                 else f" The 1080 Ti reaches {values[gtx]:.2f}x the priors;")
    text += (f" the latency goes to its floor ({values[lat] * 1e6:g} us)." if values[lat] <= params[lat]["low"]
             else f" the latency fits at {values[lat] * 1e6:g} us.")
    return text + f" Inter-machine transfers reach {values['inter_bw_eff']:.0%} of the line rate."


def _reading_auto(data: dict) -> str:
    values, fit = data["calibration"]["values"], data["calibration"]["fit"]
    straggler = _straggler(values)
    rows = {preset: {k.split("/", 1)[1]: r for k, r in data["auto"].items() if k.startswith(preset + "/")}
            for preset in ("testbed", "cloud")}
    testbed = rows["testbed"]
    clauses: list[str] = []
    for label, keep in (("close to", lambda q: 1 / _CLOSE <= q <= _CLOSE), ("far above", lambda q: q > _CLOSE),
                        ("far below", lambda q: q < 1 / _CLOSE)):
        models = [m for m in MODELS if m in testbed
                  and keep(testbed[m]["speedup_over_dp"] / testbed[m]["paper_tag_speedup"])]
        if models:
            pairs = ", ".join(f"{testbed[m]['speedup_over_dp']:.1f}x vs {_speedup(testbed[m]['paper_tag_speedup'])}"
                              for m in models)
            whom = "it" if clauses else "the paper's TAG"
            clauses.append(f"{label} {whom} for {_names([_MODEL.get(m, m) for m in models])} ({pairs})")
    text = (f"`auto`'s gains follow from the fitted straggler: leaving the {_gpu(straggler)}s out gives "
            f"{_span([r['speedup_over_dp'] for r in testbed.values()])} on the testbed, {' but '.join(clauses)}.")
    if "resnet101" in testbed:
        text += (" The paper's TAG kept every GPU on ResNet-101 and found DP nearly optimal there "
                 f"({_speedup(testbed['resnet101']['paper_tag_speedup'])}).")
    ratios = [fit["fitted"][f"fig-iter/dp/{m}"]["measured_s"] / fit["fitted"][f"tab-sfb/dp/{m}"]["measured_s"]
              for m in MODELS if f"fig-iter/dp/{m}" in fit["fitted"] and f"tab-sfb/dp/{m}" in fit["fitted"]]
    if "compute_eff:GTX1080Ti" in values and ratios:
        text += (f" A real {_gpu(straggler)} is nowhere near as slow against a 1080 Ti as the fit makes it "
                 f"(compute_eff {values[straggler]:.2f} against {values['compute_eff:GTX1080Ti']:g}), so the paper's "
                 f"DP must be slow for a reason our physics puts on the {_gpu(straggler)}s (the paper's testbed "
                 f"DP-NCCL figures are {_span(ratios)} its SFB table's DP figures at a similar per-GPU batch, which "
                 "bandwidth alone does not explain).")
    cloud = rows["cloud"].values()
    if cloud:
        text += (" On the cloud preset (physics carried over, T4 at the fitted types' geometric mean) our gains are "
                 f"{_span([r['speedup_over_dp'] for r in cloud])} against the paper's "
                 f"{_span([r['paper_tag_speedup'] for r in cloud])}, for the same reason.")
    return text + (" Figures that separate GPU speed from machine effects (single-GPU-type runs on the testbed) "
                   "would pin this down; the paper has none.")


def render(data: dict) -> str:
    """RESULTS.md's calibration section (everything below its heading) from results/calibration.json alone."""
    fit = data["calibration"]["fit"]
    intro = ("The simulator's physics (per GPU type compute efficiency, per-op executor overhead, inter-machine "
             "bandwidth efficiency and latency, intra-machine bandwidth efficiency; no per-model parameter) fitted by "
             f"bounded least squares on log time to the paper's {len(fit['fitted'])} DP-NCCL figures (testbed "
             "figure; the SFB table's 'without SFB' runs on GTX 1080 Tis), then used to predict the "
             f"{len(fit['held_out'])} held-out testbed figures (DP-NCCL-P, Horovod), never fitted on. Paper: "
             f"measured on its testbed; ours: simulated on this machine's CPU ({data.get('machine', 'not recorded')}), "
             f"{measured_when(data)}. DP-NCCL and DP-NCCL-P all-reduce after the backward pass "
             "(`sync_after_backward`: the paper implements them with in-graph replication and credits Horovod with "
             "overlapping AllReduce and backward computation); Horovod's fused buckets overlap it.")
    lines = [_wrap(intro), "", *_figures_table(data), "", *_shipped_table(data), *_basins_table(data["calibration"]),
             "", *_order_table(data), ""]
    if data.get("auto"):
        lines += [*_auto_table(data), ""]
    readings = [_reading_error(data), *_reading_shipped(data), _reading_order(data), _reading_basins(data["calibration"])]
    if data.get("auto"):
        readings.append(_reading_auto(data))
    lines += ["What this says:", *(_wrap("- " + r, "  ") for r in readings)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
