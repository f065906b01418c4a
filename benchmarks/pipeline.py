"""Pipelining in the search, SIMULATED: `auto` (MCTS) with its pipelining phase against the same
search without it (`MctsOptions.pipeline=False`), same seed and budget, on the calibrated paper
presets (the paper's global batches) and the 64-GPU mixed cluster (global batch per GPU as
benchmarks/scale.py). Each row: both step times, the speed-up, the pipelined plan's micro-batches
and stages where one was kept, and the compute lower bound (Simulator.lower_bound_s).

Verdicts (issue: pipeline parallelism): with pipelining >= 1.2x faster on bert-large and transformer,
never slower on any model (1% tolerance: the polish shares its budget with the pipelining phase),
and bert-small <= 2.5x the lower bound on the testbed.

Usage: python benchmarks/pipeline.py [--budget 20] [--models ...] [--presets testbed,cloud,mixed:64]
           [--markdown benchmarks/RESULTS.md] [--render]
Writes benchmarks/results/pipeline.json and the RESULTS.md section between the markers.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small", "bert-large")
PRESETS = ("testbed", "cloud", "mixed:64")
MIXED_PER_GPU = {"vgg19": 8, "resnet101": 8, "inceptionv3": 8, "transformer": 16, "bert-small": 16, "bert-large": 4}
TARGET_MODELS = ("bert-large", "transformer")
TARGET_SPEEDUP = 1.2
NEVER_SLOWER_TOL = 1.01
BOUND_MODEL, BOUND_PRESET, BOUND_RATIO = "bert-small", "testbed", 2.5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "pipeline.json")
BEGIN, END = "<!-- pipeline:begin -->", "<!-- pipeline:end -->"
TITLE = "Pipelining in the search (simulated)"


def analysis_for_row(model: str, preset: str) -> Any:
    from tag_tf.context import Options, PassContext
    from tag_tf.frontend.loading import analysis_for, load

    batch = MIXED_PER_GPU[model] * int(preset.split(":")[1]) if preset.startswith("mixed:") else None
    args = argparse.Namespace(model=model, batch=batch, tiny=False, input_size=None, graph=None, groups=60)
    return analysis_for(load(args, dropout=0.0), args, PassContext(Options(num_groups=60)))


def run_row(model: str, preset: str, budget: float) -> dict[str, Any]:
    from tag_tf.search.mcts import MctsOptions, mcts_search
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    analysis = analysis_for_row(model, preset)
    topology = load_topology(preset)
    row: dict[str, Any] = {"batch": analysis.batch_size}
    for key, pipeline in (("without", False), ("with", True)):
        sim = Simulator(analysis, topology)
        start = time.perf_counter()
        result = mcts_search(sim, topology, MctsOptions(budget_s=budget, seed=0, pipeline=pipeline))
        plan = result.strategy
        row[key] = {"ms": result.iteration_time_s * 1e3, "wall_s": round(time.perf_counter() - start, 1),
                    "simulations": result.simulations, "microbatches": plan.microbatches,
                    "device_sets": len({g.devices for g in plan.groups}),
                    "devices": len({d for g in plan.groups for d in g.devices})}
        if key == "without":
            row["lower_bound_ms"] = sim.lower_bound_s() * 1e3
            row["split_floor_ms"] = sim.split_floor_s() * 1e3
            row["sweep"] = pipeline_sweep(sim, analysis, topology)
    row["speedup"] = row["without"]["ms"] / row["with"]["ms"]
    row["with_over_bound"] = row["with"]["ms"] / row["lower_bound_ms"]
    row["ceiling"] = row["without"]["ms"] / row["split_floor_ms"]       # the most pipelining can give (FLOOR)
    return row


def pipeline_sweep(sim: Any, analysis: Any, topology: Any) -> dict[str, Any]:
    """Every pipeline of the shape the search builds (stages of about equal capacity, each data-parallel
    over its machines, work in proportion to capacity) over the k fastest machines, k = 1..all (one
    machine: its devices), S = 2..min(k, MAX_STAGES) stages, M in MICROBATCHES; and data parallelism
    (Horovod-P) over the same k. The least of each, and the pipeline's shape. Where pipelines lose to
    data parallelism on every such shape, the search's pipelining phase has none to find."""
    import numpy as np

    from tag_tf.errors import StrategyError
    from tag_tf.search import stages as st
    from tag_tf.search.baselines import HOROVOD_FUSION_BYTES
    from tag_tf.strategy import Option, Strategy

    def ms(plan: Any) -> float:
        try:
            return sim.simulate(plan).iteration_time_s * 1e3
        except StrategyError:        # a plan the batch cannot fill (fewer samples than replicas)
            return float("inf")

    caps = st.stage_capacities(sim, topology)
    weights = st.planned_op_weights(sim, int(sim.device_type_index[int(np.argmax(caps))]))
    machines = st.fastest_first([tuple(g.devices) for g in topology.groups], caps)
    out: dict[str, Any] = {"pipeline_ms": float("inf"), "dp_ms": float("inf"), "tried": 0}
    for k in range(1, len(machines) + 1):
        units = machines[:k] if k > 1 else [(d,) for d in machines[0]]
        devices = tuple(d for u in units for d in u)
        dp = Strategy.uniform(len(analysis.grouping.groups), devices, Option.ALLREDUCE, shares=tuple(caps),
                              fusion_bytes=HOROVOD_FUSION_BYTES)
        out["dp_ms"] = min(out["dp_ms"], ms(dp))
        for count in range(2, min(st.MAX_STAGES, len(units)) + 1):
            blocks = st.capacity_blocks(units, caps, count)
            capacity = [sum(caps[d] for d in b) for b in blocks]
            for m in st.MICROBATCHES:
                if m * max(len(b) for b in blocks) > analysis.batch_size:
                    continue
                plan = st.pipeline_plan(analysis, blocks, m, fractions=capacity, shares=caps, weights=weights,
                                        fusion_bytes=HOROVOD_FUSION_BYTES)
                t = ms(plan)
                out["tried"] += 1
                if t < out["pipeline_ms"]:
                    out.update(pipeline_ms=t, machines=k, stages=len(set(plan.op_groups or ())), microbatches=m)
    return out


def verdicts(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    targets = {k: r["speedup"] for k, r in rows.items() if k.split("/")[1] in TARGET_MODELS}
    out["targets_speedup"] = targets
    out["targets_met"] = bool(targets) and all(v >= TARGET_SPEEDUP for v in targets.values())
    slower = {k: r["speedup"] for k, r in rows.items() if r["with"]["ms"] > NEVER_SLOWER_TOL * r["without"]["ms"]}
    out["slower_rows"] = slower
    out["never_slower"] = not slower
    bound = rows.get(f"{BOUND_PRESET}/{BOUND_MODEL}")
    out["bert_small_testbed_over_bound"] = None if bound is None else bound["with_over_bound"]
    out["bound_met"] = bool(bound is not None and bound["with_over_bound"] <= BOUND_RATIO)
    out["pipelined_rows"] = sorted(k for k, r in rows.items() if r["with"]["microbatches"] > 1)
    # What the op costs allow (the split floor): a target row whose plan without pipelining is within
    # TARGET_SPEEDUP of its split floor, or a bound below the split floor, cannot be met by a plan that
    # splits the batch, nor by a pipeline of equal stages.
    out["targets_out_of_reach"] = {k: r["ceiling"] for k, r in rows.items()
                                   if k.split("/")[1] in TARGET_MODELS and "ceiling" in r and r["ceiling"] < TARGET_SPEEDUP}
    # Pipelines of the search's shape over the fastest machines (`pipeline_sweep`): the best of them
    # against the plan without pipelining, on every target row.
    swept = {k: r["without"]["ms"] / r["sweep"]["pipeline_ms"] for k, r in rows.items()
             if k.split("/")[1] in TARGET_MODELS and "sweep" in r}
    if swept:                              # rows measured before the sweep have none
        out["targets_sweep"] = swept
    out["bert_small_testbed_floor_over_bound"] = (None if bound is None or "split_floor_ms" not in bound
                                                  else bound["split_floor_ms"] / bound["lower_bound_ms"])
    out["bound_out_of_reach"] = bool(out["bert_small_testbed_floor_over_bound"] is not None
                                     and out["bert_small_testbed_floor_over_bound"] > BOUND_RATIO)
    return out


def render(data: dict[str, Any]) -> str:
    v = data["verdicts"]
    lines = [f"SIMULATED ({data['date']}, code {data['commit']}, {data['budget_s']:g} s search budget each, seed 0): "
             "`auto` with its pipelining phase against the same search without it. A row is pipelined where the "
             "plan kept has micro-batches (M > 1).", "",
             "The split floor (`Simulator.split_floor_s`) is the least any plan that splits the batch computes "
             "in under these op costs (every computing device pays each op's fixed cost once a step, shares "
             "perfect, communication free); a GPipe pipeline of S stages and M micro-batches pays each op's fixed "
             "cost (M+S-1)/S times and its per-sample work (M+S-1)/M times along its critical path, so it does "
             "not go below it either (equal devices). `without / split floor` is thus the most pipelining "
             "can gain on a row.", "",
             "The sweep (`pipeline_sweep`) simulates every pipeline of the shape the search builds over the k "
             "fastest machines (k = 1..all; one machine: its devices), S = 2..k stages of about equal capacity, "
             "M = 2..16 micro-batches, beside data parallelism (Horovod-P) over the same machines: the best "
             "pipeline (k machines, S stages, M) and the best such data parallelism.", "",
             "| preset / model | batch | without, ms | with, ms | speed-up | plan kept | with / lower bound | "
             "split floor, ms | without / split floor | swept: best pipeline, ms (k, S, M) | swept: best DP, ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in data["rows"].items():
        w = r["with"]
        kept = (f"M={w['microbatches']}, {w['device_sets']} device set(s), {w['devices']} devices"
                if w["microbatches"] > 1 else "no pipeline")
        floor = (f"{r['split_floor_ms']:.1f} | {r['ceiling']:.2f}x" if "split_floor_ms" in r else "- | -")
        sw = r.get("sweep")
        swept = ("- | -" if sw is None else
                 f"{sw['pipeline_ms']:.1f} ({sw.get('machines')}, {sw.get('stages')}, {sw.get('microbatches')}) | "
                 f"{sw['dp_ms']:.1f}")
        lines.append(f"| {key} | {r['batch']} | {r['without']['ms']:.1f} | {w['ms']:.1f} | {r['speedup']:.2f}x | "
                     f"{kept} | {r['with_over_bound']:.2f}x | {floor} | {swept} |")
    targets = ", ".join(f"{k} {x:.2f}x" for k, x in v["targets_speedup"].items())
    lines += ["", f"Targets: >= {TARGET_SPEEDUP}x on {' and '.join(TARGET_MODELS)} -- "
              f"{'met' if v['targets_met'] else 'NOT MET'} ({targets}); never slower (1% tolerance) -- "
              f"{'met' if v['never_slower'] else 'NOT MET: ' + ', '.join(v['slower_rows'])}; {BOUND_MODEL} on the "
              f"{BOUND_PRESET} <= {BOUND_RATIO}x the lower bound -- "
              + ("not run" if v["bert_small_testbed_over_bound"] is None else
                 f"{'met' if v['bound_met'] else 'NOT MET'} ({v['bert_small_testbed_over_bound']:.2f}x)") + "."]
    reach = v.get("targets_out_of_reach")
    if reach is not None:
        floor = v.get("bert_small_testbed_floor_over_bound")
        lines += ["", "Out of reach under these op costs for plans that split the batch and pipelines of equal "
                  "stages: " + (", ".join(f"{k} (at most {x:.2f}x)" for k, x in reach.items()) or "no target row") +
                  (f"; {BOUND_MODEL} on the {BOUND_PRESET}: its split floor is {floor:.2f}x the lower bound"
                   if v.get("bound_out_of_reach") else "") + "."]
    sweep = v.get("targets_sweep")
    if sweep:
        lines += ["", "The best swept pipeline against the plan without pipelining, on the target rows: " +
                  ", ".join(f"{k} {x:.2f}x" for k, x in sweep.items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.markdown import simulated_study

    simulated_study(__doc__, models=MODELS, presets=PRESETS, out=OUT, title=TITLE, markers=(BEGIN, END),
                    run_row=run_row, verdicts=verdicts,
                    line=lambda row: (f"without {row['without']['ms']:.1f} ms, with {row['with']['ms']:.1f} ms "
                                      f"({row['speedup']:.2f}x, M={row['with']['microbatches']})"))


if __name__ == "__main__":
    main()
