"""Planning for 16 to 1,024 GPUs (simulated): how fast one simulation is, how fast the planner plans,
how good its plans are and how much memory it takes, as the cluster grows.

Clusters: `mixed:N` (tag_tf/topology/presets.py): eight-GPU machines, a quarter H100 and the rest
A100-80GB and V100-32GB in equal parts, NVLink inside, 200/200/100 Gbps NICs on one switch,
hierarchical all-reduces, every machine reading its own part of each batch. Global batches grow
with the cluster (a fixed number of samples per GPU, `PER_GPU`). Every figure is SIMULATED except
wall times and memory, which are measured on this machine (2 cores, other load recorded as none).

Per model and cluster size, each in its own process:
  * simulation: the Simulator prepared once; DP and Horovod-P simulated with device classes
    (kernels/expand.h; median of `--repeats` calls, warm) and once in full, every device expanded
    (skipped above FULL_TASKS tasks); the iteration times of both and their relative difference;
  * planning: `tag-tf plan --model M --batch B --topology mixed:N --budget-s BUDGET --json` with an
    empty plan cache: wall time, simulations per second of the search, the plan's simulated time
    against the compute lower bound, the floor of plans that split the batch, Horovod-P and
    best-subset, whether it fell back to a baseline, and the process's peak memory (max RSS).

Usage: python benchmarks/scale.py [--models resnet101,transformer,bert-large] [--sizes 16,64,256,1024]
       [--budgets 30,60,60,300] [--repeats 5] [--merge]
Writes benchmarks/results/scale.json, benchmarks/results/scale.svg and the RESULTS.md section.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.markdown import (  # noqa: E402
    measured_when,
    replace_section,  # noqa: E402
    stamp,
)

BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
PER_GPU = {"resnet101": 8, "transformer": 16, "bert-large": 4}
SIZES = (16, 64, 256, 1024)
BUDGETS = {16: 30.0, 64: 60.0, 256: 60.0, 1024: 240.0}   # 1,024: the whole run within 5 minutes
FULL_TASKS = 12_000_000      # a full simulation above this many tasks is not run (memory, minutes)
STRATEGIES = ("dp", "horovod-p")
MARK = "SCALE-ROW "
# The targets (#35), checked in `verdicts`.
TARGETS = {"sim_ms": {256: 20.0, 1024: 80.0}, "agreement": 0.01, "lb_ratio_256": 2.0, "memory_gib_1024": 8.0}


def simulation_row(model: str, gpus: int, repeats: int) -> dict:
    """In this process: the analysis, the Simulator and the speed and agreement of its simulations."""
    from benchmarks.simulator_speed import build_analysis
    from tag_tf.search.registry import baseline
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.presets import mixed

    batch = PER_GPU[model] * gpus
    analysis, build_s = build_analysis(model, batch)
    topology = mixed(gpus)
    t0 = time.perf_counter()
    sim = Simulator(analysis, topology)
    prepare_s = time.perf_counter() - t0
    row: dict = {"batch": batch, "build_s": round(build_s, 2), "prepare_s": round(prepare_s, 3),
                 "lower_bound_ms": sim.lower_bound_s() * 1e3, "split_floor_ms": sim.split_floor_s() * 1e3,
                 "calibration": sim.calibration_name, "strategies": {}}
    for name in STRATEGIES:
        plan = baseline(name, sim.num_groups, topology)
        sim.simulate(plan)                     # warm
        calls, native = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            report = sim.simulate(plan)
            calls.append((time.perf_counter() - t0) * 1e3)
            native.append(report.sim_ms)
        one = {"iteration_ms": report.iteration_time_s * 1e3, "call_ms": statistics.median(calls),
               "native_ms": statistics.median(native), "tasks": report.num_tasks,
               "devices_simulated": report.devices_simulated, "exact": report.exact}
        estimate = report.num_tasks * gpus / max(report.devices_simulated, 1)
        if estimate <= FULL_TASKS:
            t0 = time.perf_counter()
            full = sim.simulate(plan, collapse=False)
            one.update(full_call_ms=(time.perf_counter() - t0) * 1e3, full_tasks=full.num_tasks,
                       full_iteration_ms=full.iteration_time_s * 1e3,
                       difference=abs(report.iteration_time_s / full.iteration_time_s - 1),
                       memory_same=report.peak_memory_bytes == full.peak_memory_bytes)
        else:
            one["full"] = f"not run: about {estimate / 1e6:.0f} M tasks"
        row["strategies"][name] = one
    return row


def plan_row(model: str, gpus: int, budget: float) -> dict:
    """`tag-tf plan` in a child process with an empty plan cache: its JSON, wall time and max RSS."""
    batch = PER_GPU[model] * gpus
    cache = tempfile.mkdtemp(prefix="tag_tf_scale_")
    env = dict(os.environ, TAG_TF_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [os.path.join(os.path.dirname(sys.executable), "tag-tf"), "plan", "--model", model, "--batch", str(batch),
           "--topology", f"mixed:{gpus}", "--budget-s", str(budget), "--json"]
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if status != 0:
        return {"error": f"tag-tf plan exited with {status}", "command": " ".join(cmd[1:])}
    d = json.loads(out)
    base = d["baselines"]
    t = d["iteration_time_s"]
    return {"command": "tag-tf " + " ".join(cmd[1:]), "budget_s": budget, "wall_s": round(wall, 1),
            "planning_s": d["planning_time_s"], "search_s": d["planning_time_s"], "simulations": d["simulations"],
            "iterations": d["iterations"], "simulations_per_s": d["simulations"] / max(d["planning_time_s"], 1e-9),
            "plan_ms": t * 1e3, "lower_bound_ms": d["lower_bound_s"] * 1e3, "x_lower_bound": t / d["lower_bound_s"],
            "split_floor_ms": d["split_floor_s"] * 1e3, "x_split_floor": t / d["split_floor_s"],
            "horovod_p_ms": base["horovod-p"] * 1e3, "best_subset_ms": base["best-subset"] * 1e3,
            "vs_horovod_p": base["horovod-p"] / t, "vs_best_subset": base["best-subset"] / t,
            "fell_back": d["fell_back_to_baseline"], "converged": d["converged"],
            "groups": describe_plan(d["strategy"]), "peak_rss_gib": usage.ru_maxrss / 2**20}


def describe_plan(strategy: dict) -> str:
    """The plan in a few words: how many groups on how many devices with which option."""
    from collections import Counter

    counts = Counter((len(g["devices"]), g["option"]) for g in strategy["groups"])
    return "; ".join(f"{n} groups on {d} devices ({o})" for (d, o), n in counts.most_common(4))


def verdicts(data: dict) -> dict:
    out: dict = {}
    for model, sizes in data["models"].items():
        for size, row in sorted(sizes.items(), key=lambda kv: int(kv[0])):
            gpus = int(size)
            sim = row.get("simulation", {}).get("strategies", {}).get("dp")
            if sim and gpus in TARGETS["sim_ms"] and model == "resnet101":     # the model
                out[f"{model} {gpus}: one DP simulation <= {TARGETS['sim_ms'][gpus]:.0f} ms"] = \
                    f"{sim['call_ms']:.1f} ms: {'met' if sim['call_ms'] <= TARGETS['sim_ms'][gpus] else 'NOT MET'}"
            for name, s in row.get("simulation", {}).get("strategies", {}).items():
                if "difference" in s:
                    key = f"{model} {gpus}: {name} collapsed vs full within 1%"
                    out[key] = f"{s['difference'] * 100:.4f}%: {'met' if s['difference'] <= TARGETS['agreement'] else 'NOT MET'}"
            plan = row.get("plan")
            if not plan or "error" in plan:
                continue
            if gpus == 256 and model in ("resnet101", "transformer"):
                floor = (f" (no plan that splits the batch goes below {plan['split_floor_ms'] / plan['lower_bound_ms']:.2f}x: "
                         f"the plan is {plan['x_split_floor']:.2f}x that floor)" if "split_floor_ms" in plan else "")
                out[f"{model} 256: plan <= 2x the lower bound"] = \
                    f"{plan['x_lower_bound']:.2f}x{floor}: {'met' if plan['x_lower_bound'] <= TARGETS['lb_ratio_256'] else 'NOT MET'}"
                out[f"{model} 256: plan >= 1.0x horovod-p"] = \
                    f"{plan['vs_horovod_p']:.2f}x: {'met' if plan['vs_horovod_p'] >= 1.0 else 'NOT MET'}"
            if gpus == 1024:
                out[f"{model} 1024: a plan within 5 minutes that beats horovod-p"] = \
                    f"{plan['wall_s']:.0f} s, {plan['vs_horovod_p']:.2f}x: " \
                    f"{'met' if plan['wall_s'] <= 300 and plan['vs_horovod_p'] > 1.0 else 'NOT MET'}"
                out[f"{model} 1024: peak memory of plan <= 8 GB"] = \
                    f"{plan['peak_rss_gib']:.2f} GiB: {'met' if plan['peak_rss_gib'] <= TARGETS['memory_gib_1024'] else 'NOT MET'}"
    return out


def _label(model: str, row: dict, data: dict) -> str:
    """The model, with the code and date of a row measured by another run than the file's stamp (--merge)."""
    when = row.get("when") or {}
    if when.get("commit") and when.get("commit") != data.get("commit"):
        return f"{model} (code {when['commit']}, {when['date']})"
    return model


def _floor(plan: dict) -> str:
    return f"{plan['x_split_floor']:.2f}" if "x_split_floor" in plan else "-"


def render(data: dict) -> str:
    lines = [f"Planning for 16 to 1,024 GPUs (`python benchmarks/scale.py`; {measured_when(data)}, rows measured by an earlier run say their code; "
             f"{data['machine']}, {data['cores']} cores). Clusters `mixed:N`: eight-GPU machines, a quarter "
             "H100, the rest A100-80GB and V100-32GB, NVLink inside, 200/200/100 Gbps NICs, hierarchical "
             "all-reduces, inputs read on every machine. Step times are SIMULATED; wall times and memory "
             "are measured here. Global batch: "
             + ", ".join(f"{m} {n} per GPU" for m, n in data["per_gpu"].items()) + ".", "",
             "One simulation (device classes; median of warm calls) against the full one (every device):", "",
             "| model | GPUs | strategy | simulated step, ms | call, ms | tasks | devices simulated | "
             "full call, ms | full tasks | difference |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, sizes in data["models"].items():
        for size, row in sorted(sizes.items(), key=lambda kv: int(kv[0])):
            for name, s in row.get("simulation", {}).get("strategies", {}).items():
                full = (f"{s['full_call_ms']:.0f} | {s['full_tasks']:,} | {s['difference'] * 100:.4f}%"
                        if "difference" in s else f"{s.get('full', '-')} | - | -")
                lines.append(f"| {_label(model, row, data)} | {size} | {name} | {s['iteration_ms']:.2f} | {s['call_ms']:.1f} | "
                             f"{s['tasks']:,} | {s['devices_simulated']} | {full} |")
    lines += ["", "`tag-tf plan` with an empty plan cache (search, SFB, baselines; one process each). x lower bound: "
              "the plan's step over the compute lower bound (`Simulator.lower_bound_s`: every device computing whole "
              "batches, so each op's fixed cost is spread too); x split floor: over the floor of any plan that "
              "splits the batch (`Simulator.split_floor_s`: every device computing pays each op's fixed cost once "
              "a step; shares perfect, communication free); \"-\": a row of an earlier run that did not record it:", "",
              "| model | GPUs | batch | budget, s | wall, s | simulations/s | plan, ms | x lower bound | x split floor | "
              "vs Horovod-P | vs best-subset | fell back | peak memory, GiB | plan |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, sizes in data["models"].items():
        for size, row in sorted(sizes.items(), key=lambda kv: int(kv[0])):
            p = row.get("plan")
            if not p:
                continue
            if "error" in p:
                lines.append(f"| {_label(model, row, data)} | {size} | - | - | - | - | {p['error']} | | | | | | | |")
                continue
            lines.append(f"| {_label(model, row, data)} | {size} | {row['simulation']['batch'] if 'simulation' in row else '-'} | "
                         f"{p['budget_s']:.0f} | {p['wall_s']:.0f} | {p['simulations_per_s']:.0f} | {p['plan_ms']:.2f} | "
                         f"{p['x_lower_bound']:.2f} | {_floor(p)} | {p['vs_horovod_p']:.2f}x | {p['vs_best_subset']:.2f}x | "
                         f"{'yes' if p['fell_back'] else 'no'} | {p['peak_rss_gib']:.2f} | {p['groups']} |")
    lines += ["", "Targets (#35):", ""]
    def order(item: tuple[str, str]) -> tuple[str, int, str]:      # by model, then cluster size
        model, size, *_ = item[0].split()
        return model, int(size.rstrip(":")), item[0]
    lines += [f"- {k}: {v}" for k, v in sorted(data.get("verdicts", {}).items(), key=order)]
    lines += ["", "![planning time and plan quality against cluster size](results/scale.svg)", ""]
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for k, (model, sizes) in enumerate(data["models"].items()):
        color = f"C{k}"
        xs = sorted(int(s) for s in sizes)
        rows = [sizes[str(x)] for x in xs]
        sim = [r.get("simulation", {}).get("strategies", {}).get("dp", {}).get("call_ms") for r in rows]
        axes[0].plot(xs, sim, marker="o", color=color, label=model)
        plans = [(x, r["plan"]) for x, r in zip(xs, rows) if r.get("plan") and "error" not in r["plan"]]
        axes[1].plot([x for x, _ in plans], [p["wall_s"] for _, p in plans], marker="o", color=color, label=model)
        axes[2].plot([x for x, _ in plans], [p["x_lower_bound"] for _, p in plans], marker="o", color=color,
                     label=f"{model} plan")
        axes[2].plot([x for x, _ in plans], [p["horovod_p_ms"] / p["lower_bound_ms"] for _, p in plans],
                     linestyle="--", marker="x", color=color, label=f"{model} Horovod-P")
    titles = ("one DP simulation, ms (measured)", "tag-tf plan wall time, s (measured)",
              "step / compute lower bound (simulated)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[2].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path)     # SVG: text, no binary in the repository


def child(model: str, gpus: int, repeats: int) -> None:
    print(MARK + json.dumps(simulation_row(model, gpus, repeats)), flush=True)


def _simulate_in_child(model: str, gpus: int, repeats: int) -> dict:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model, str(gpus), "--repeats",
                           str(repeats)], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def rerender(path: str, markdown: str) -> None:
    """The verdicts, plot and section again from a stored JSON (after a change to how they read it)."""
    with open(path) as f:
        data = json.load(f)
    data["verdicts"] = verdicts(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    plot(data, os.path.splitext(path)[0] + ".svg")
    if markdown:
        replace_section(markdown, BEGIN, END, render(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(PER_GPU))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--budgets", help="planning budget per size, seconds (default " +
                    ",".join(f"{k}:{v:.0f}" for k, v in BUDGETS.items()) + "); comma-separated, one per size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-plan", action="store_true", help="only the simulations")
    ap.add_argument("--merge", action="store_true", help="keep the models and sizes of the existing JSON not run now")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "scale.json"))
    ap.add_argument("--markdown", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"))
    ap.add_argument("--render", action="store_true", help="only recompute the verdicts, plot and section from --out")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        rerender(args.out, args.markdown)
        return
    if args.child:
        child(args.child[0], int(args.child[1]), args.repeats)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    budgets = ([float(b) for b in args.budgets.split(",")] if args.budgets else [BUDGETS.get(s, 60.0) for s in sizes])
    data = stamp({"simulated": True, "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                  "per_gpu": PER_GPU, "models": {}})
    if args.merge and os.path.exists(args.out):
        with open(args.out) as f:
            data["models"] = json.load(f)["models"]
    for model in args.models.split(","):
        for gpus, budget in zip(sizes, budgets):
            print(f"{model} on {gpus} GPUs ...", flush=True)
            row = {"simulation": _simulate_in_child(model, gpus, args.repeats)}
            if not args.no_plan:
                row["plan"] = plan_row(model, gpus, budget)
            row["when"] = {"date": data["date"], "commit": data["commit"]}
            print(json.dumps(row)[:400], flush=True)
            data["models"].setdefault(model, {})[str(gpus)] = row
            with open(args.out, "w") as f:          # after every row: a stopped run keeps what it measured
                json.dump(data, f, indent=1, sort_keys=True)
    data["verdicts"] = verdicts(data)
    print(json.dumps(data["verdicts"], indent=1))
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    with open(args.out) as f:
        data = json.load(f)
    plot(data, os.path.splitext(args.out)[0] + ".svg")
    if args.markdown:
        replace_section(args.markdown, BEGIN, END, render(data))


if __name__ == "__main__":
    main()
