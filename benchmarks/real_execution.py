"""The paper's experiment 8, real execution here: tiny models trained through `tag_tf.distribute`,
MEASURED, beside what the local machine model predicts for the very plan that ran.

For each model (the simulator-accuracy benchmark's sizes, batch 64; `--quick`: the zoo's `--tiny`
sizes) a plain single-device session of the original graph trains on seeded batches first: its
losses are the reference and its step time the one-device figure. Then the same program, unchanged,
runs under `tag_tf.distribute(strategy=...)` for dp, horovod, auto (distribute's own planner, on
its analytical model of CPUs) and auto-local (the same search judged by the local machine model,
as `tag-tf plan --calibration local` plans, given to distribute as a Strategy), on two setups:

  local2   topology local:2, two virtual CPU devices in this process
  2proc    two local server processes with one CPU device each (a cluster of `tag-tf`-style
           servers; this process is the client), topology cpu-2x1

Each run starts from the same initial values and trains on the same batches; reported: median /
min / max step time of the timed steps, the first step (analysis, planning, compilation), the
relative loss difference from the single-device run (equivalence: the first 5 steps within 1e-4;
the largest over all steps is reported too), and
the local machine model's prediction (`tag_tf.localmachine.model.local_simulator`: op profile and
communication measured on this machine, cached) of the plan `distribute` used. Speed-ups of auto
over dp and horovod, measured and predicted.

Runtime: the local machine model's (`tag_tf.localmachine.runtime`: one intra-op and one inter-op
thread per process, two inter-op threads in the servers, oneDNN and Grappler off), set before
TensorFlow is imported; the predictions hold for that runtime (`benchmarks/step_time.py --predict`
judges the model under TensorFlow's default runtime, on TF_CONFIG tasks).

Usage: python -m benchmarks run real [--quick]   (or: python benchmarks/real_execution.py [--quick]
       [--models mlp,cnn,transformer] [--steps 20] [--db DIR] [--out FILE])
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.machine import cpu_name  # noqa: E402
from benchmarks.peers import summarize as summarize_steps  # noqa: E402
from benchmarks.simulator_accuracy import BATCH  # noqa: E402
from benchmarks.simulator_accuracy import MODELS as ACCURACY_MODELS
from tag_tf.localmachine import model as lm  # noqa: E402

lm.configure_runtime()     # before TensorFlow is imported; the servers started here inherit it

import numpy as np  # noqa: E402

# The simulator-accuracy benchmark's sizes (tiny variants widened so that a one-device step takes tens
# of ms), with a dynamic batch dimension: a user graph that distribute can shard.
MODELS = {name: dict(kwargs, dynamic_batch=True) for name, kwargs in ACCURACY_MODELS.items()}
QUICK_MODELS = {name: dict(tiny=True, dynamic_batch=True, dropout=0.0) for name in MODELS}
LOCAL_AUTO = "auto-local"     # auto judged by the local machine model (`tag-tf plan --calibration local`)
REQUESTS = ("dp", "horovod", "auto", LOCAL_AUTO)
SETUPS = {"local2": lm.LocalSetup(1, 2), "2proc": lm.LocalSetup(2, 1)}
# Equivalence: the first steps' losses agree with one device's to float32 reassociation noise; later
# ones are reported (a steep learning rate lets that noise grow to ~1e-3 over 20 steps).
EQUIVALENCE_STEPS, EQUIVALENCE_RTOL = 5, 1e-4


def train(model, feeds: list[dict], warmup: int, sess) -> dict:
    """Steps `sess` through `feeds`: per-step seconds and losses."""
    times, losses = [], []
    for feed in feeds:
        start = time.perf_counter()
        _, loss = sess.run([model.train_op, model.loss], feed)
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    return dict(summarize_steps(times, losses, warmup), losses=losses)


def single_device(model, feeds: list[dict], warmup: int) -> dict:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(model.graph_def, name="")
    with tf.compat.v1.Session(graph=graph, config=lm.session_config(1)) as sess:
        sess.run(model.init_op)
        return train(model, feeds, warmup, sess)


def distributed(model, feeds: list[dict], warmup: int, request: str, setup, spec, cache_dir: str) -> tuple[dict, object]:
    """One run under tag_tf.distribute, as a user writes it; returns its row and the Program it compiled."""
    import tensorflow as tf

    import tag_tf

    d = tag_tf.distribute(strategy=request, topology=setup.topology(), cluster=spec, cache_dir=cache_dir)
    with d:
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(model.graph_def, name="")
        config = lm.session_config(setup.devices_per_process, leader=spec.leader if spec is not None else None)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(model.init_op)
            row = train(model, feeds, warmup, sess)
    program = d.programs[0]
    used = {dv for g in program.plan.strategy.groups for dv in g.devices}
    row.update(plan=program.plan.strategy.name, planning_s=program.plan.seconds,
               compiled=dict(program.compiled.stats), devices=len(used))
    return row, program


def devices_of(row: dict) -> int | None:
    """How many devices a row's plan used: recorded by runs since the field exists; for older rows,
    1 where the compiled graph is the original one (as many ops, no split, no collective), else None
    (not recorded)."""
    if "devices" in row:
        return int(row["devices"])
    c = row.get("compiled")
    if not c:
        return 1          # the plain program
    if c.get("ops") == c.get("original_ops") and not _replicated(row):
        return 1
    return None


def _replicated(row: dict) -> bool:
    """The compiled graph splits the batch or synchronises gradients (data parallelism somewhere)."""
    c = row.get("compiled") or {}
    return any(c.get(k) for k in ("allreduce", "split", "concat", "addn"))


def used_label(row: dict) -> str:
    """The devices-used cell of a row: its count, and whether it was distributed."""
    n = devices_of(row)
    if n == 1:
        return "1 (not distributed)" if row.get("compiled") else "1"
    if n is None:
        return "several (replicas)" if _replicated(row) else "not recorded (no split, no collective)"
    return f"{n}" + ("" if _replicated(row) else " (model parallel)")


def run(args: argparse.Namespace) -> dict:
    from tag_tf.frontend.planning import choose_auto, local_machine_simulator
    from tag_tf.models import build_model
    from tag_tf.profile.db import ProfileDB
    from tag_tf.strategy import Strategy

    sizes = QUICK_MODELS if args.quick else MODELS
    db = ProfileDB(args.db or os.path.join(tempfile.mkdtemp(prefix="tag_tf_real_"), "profiles"))
    cache_dir = tempfile.mkdtemp(prefix="tag_tf_real_plans_")
    rows: dict[str, dict] = {}
    for name in args.models.split(","):
        kwargs = sizes[name]
        model = build_model(name, batch_size=BATCH, **kwargs)
        rng = np.random.default_rng(0)
        feeds = [model.feed(rng, BATCH) for _ in range(args.warmup + args.steps)]
        zoo = lm.ZooModel.of(name, **kwargs)
        reference = single_device(model, feeds, args.warmup)
        rows[f"{name}/single"] = reference
        for setup_name, setup in SETUPS.items():
            with (lm.local_servers(setup.processes, setup.devices_per_process) if setup.processes > 1
                  else contextlib.nullcontext()) as spec:
                sim = None
                for request in REQUESTS:
                    strategy = request
                    if request == LOCAL_AUTO:        # planned on the local machine model, then given to distribute
                        strategy = choose_auto(sim.analysis, setup.topology(), sim=sim)
                    row, program = distributed(model, feeds, args.warmup, strategy, setup, spec, cache_dir)
                    if sim is None:        # judged on the analysis distribute made of the user's graph
                        sim = local_machine_simulator(program.analysis, setup.topology(), name, kwargs, db)
                    if "predicted_ms" not in reference:
                        one = lm.local_simulator(program.analysis, 1, db=db, model=zoo)
                        reference["predicted_ms"] = one.simulate(
                            Strategy.uniform(one.num_groups, (0,))).iteration_time_s * 1e3
                        print(f"{name:12s} single              {_line(reference)}", flush=True)
                    row["predicted_ms"] = sim.simulate(program.plan.strategy).iteration_time_s * 1e3
                    diff = np.abs(np.asarray(row["losses"]) - reference["losses"]) / np.abs(reference["losses"])
                    row["loss_rel_diff_first_steps"] = float(np.max(diff[:EQUIVALENCE_STEPS]))
                    row["max_loss_rel_diff"] = float(np.max(diff))
                    row["equivalent"] = row["loss_rel_diff_first_steps"] <= EQUIVALENCE_RTOL
                    rows[f"{name}/{setup_name}/{request}"] = row
                    print(f"{name:12s} {setup_name:6s} {request:10s} {_line(row)}", flush=True)
    return {"measured": True, "cpu": cpu_name(), "cores": os.cpu_count(), "batch": BATCH, "warmup": args.warmup,
            "steps": args.steps, "models": {m: sizes[m] for m in args.models.split(",")},
            "runtime": {"tag": lm.RUNTIME_TAG, "env": dict(lm.RUNTIME_ENV), "grappler": "off"},
            "equivalence": {"steps": EQUIVALENCE_STEPS, "rtol": EQUIVALENCE_RTOL}, "rows": rows,
            "summary": summarize(rows)}


def _line(row: dict) -> str:
    text = (f"{row['median_ms']:.1f} ms (min {row['min_ms']:.1f}, max {row['max_ms']:.1f}), predicted "
            f"{row['predicted_ms']:.1f} ms, first step {row['first_step_s']:.2f} s")
    if "max_loss_rel_diff" in row:
        text += f", losses within {row['max_loss_rel_diff']:.1e} of one device"
    return text


def summarize(rows: dict[str, dict]) -> dict:
    """Prediction error (MAPE, per setup and overall) and auto's speed-ups, measured and predicted:
    every auto row over the one-device run (`single`); over the distributed baselines (dp, horovod)
    only a row known to be distributed (several devices recorded, or a split or collective)."""
    err = {"all": [], "local2": [], "2proc": []}
    speedups = {}
    for key, row in rows.items():
        e = abs(row["predicted_ms"] - row["median_ms"]) / row["median_ms"]
        err["all"].append(e)
        parts = key.split("/")
        if len(parts) == 3:
            err[parts[1]].append(e)
    for key, row in rows.items():
        parts = key.split("/")
        if len(parts) != 3 or not parts[2].startswith("auto"):
            continue
        base = "/".join(parts[:2])
        distributed = (devices_of(row) or 0) > 1 or _replicated(row)
        for other in (("single", "dp", "horovod") if distributed else ("single",)):
            o = rows.get(f"{parts[0]}/single" if other == "single" else f"{base}/{other}")
            if o:
                speedups[f"{key}_over_{other}"] = {"measured": o["median_ms"] / row["median_ms"],
                                                         "predicted": o["predicted_ms"] / row["predicted_ms"]}
    return {"mape": {k: float(np.mean(v)) for k, v in err.items() if v},
            "all_equivalent": all(r.get("equivalent", True) for r in rows.values()), "speedups": speedups}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="the zoo's --tiny sizes and 3 timed steps: a smoke test")
    ap.add_argument("--db", help="ProfileDB directory for the local machine model (default: a fresh temporary one)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "paper_real.json"),
                    help="the JSON (default: the paper harness's file for this experiment, which "
                         "`python -m benchmarks run real` writes too)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.quick:
        args.warmup, args.steps = 1, 3
    start = time.perf_counter()
    data = run(args)
    data["seconds"] = round(time.perf_counter() - start, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, args.out)
    print(json.dumps(data["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
