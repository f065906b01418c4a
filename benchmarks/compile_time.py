"""Compile time of the full-size paper models (issue target: under 10 s for resnet101 and bert-large).

Measures analysis (once, not part of the target) and compile (placement + graph building) for DP on
16 devices of the testbed topology, plus a random mixed strategy, and writes
benchmarks/results/compile.json. Compile here means emitting the GraphDef; importing it into
TensorFlow is TF's own cost and is reported separately.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.markdown import measured_when, stamp  # noqa: E402
from tag_tf.analysis import analyze  # noqa: E402
from tag_tf.compiler import DeviceMap, compile_strategy  # noqa: E402
from tag_tf.context import PassContext  # noqa: E402
from tag_tf.frontend.loading import model_ir  # noqa: E402
from tag_tf.models import build_model  # noqa: E402
from tag_tf.profile.weights import reference_weights  # noqa: E402
from tag_tf.search.baselines import data_parallel, random_strategy  # noqa: E402
from tag_tf.topology.load import load_topology  # noqa: E402

MODELS = sys.argv[1:] or ["resnet101", "bert-large"]


def render(data: dict) -> str:
    """RESULTS.md's compile-time section (benchmarks/report.py)."""
    lines = [f"Compiling for the {data['topology']} (placement + graph building; TensorFlow's own import of "
             f"the result reported separately) on {data['machine']}; {measured_when(data)}. "
             f"Target: {data['target']}.", "",
             "| model | ops | strategy | compile | compiled ops | TF import |", "|---|---|---|---|---|---|"]
    labels = {"dp_16": "DP, 16 devices", "random_16": "random mixed"}
    for name, row in data["models"].items():
        for key, label in labels.items():
            if key in row:
                r = row[key]
                lines.append(f"| {name} | {row['ops']} | {label} | {r['compile_s']:.1f} s | {r['compiled_ops']:,} | "
                             f"{r['tf_import_s']:.1f} s |")
    return "\n".join(lines) + "\n"


def main() -> None:
    topology = load_topology("testbed")
    devices = DeviceMap.for_topology(topology)
    results = {}
    for name in MODELS:
        t0 = time.perf_counter()
        model = build_model(name)
        graph = model_ir(model)
        analysis = analyze(PassContext(), graph, rebuild=lambda b, name=name: model_ir(build_model(name, batch_size=b)),
                           weight_fn=reference_weights)
        analyze_s = time.perf_counter() - t0
        row = {"ops": len(graph), "groups": len(analysis.grouping.groups), "batch": analysis.batch_size,
               "build_and_analyze_s": round(analyze_s, 2)}
        for label, strategy in (("dp_16", data_parallel(len(analysis.grouping.groups), 16)),
                                ("random_16", random_strategy(len(analysis.grouping.groups), 16,
                                                              np.random.default_rng(0), uneven=False))):
            ctx = PassContext()
            t = time.perf_counter()
            compiled = compile_strategy(ctx, analysis, strategy, devices)
            compile_s = time.perf_counter() - t
            t = time.perf_counter()
            from tag_tf.runtime.sessions import import_graph
            import_graph(compiled.graph_def)
            import_s = time.perf_counter() - t
            row[label] = {"compile_s": round(compile_s, 2), "tf_import_s": round(import_s, 2),
                          "compiled_ops": compiled.stats["ops"], "timers": ctx.timing_report(),
                          "conversions": {k: compiled.stats[k] for k in ("split", "concat", "addn", "allreduce")}}
            print(f"{name} {label}: compile {compile_s:.2f} s ({compiled.stats['ops']} ops), "
                  f"TF import {import_s:.2f} s", flush=True)
        results[name] = row
    out = stamp({"target": "compile under 10 s per model", "machine": f"{platform.processor() or 'cpu'}, "
                 f"{os.cpu_count()} cores (shared)", "topology": "testbed (16 devices)", "models": results})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compile.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
