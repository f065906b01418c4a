"""Real step time of the rewritten graph on this machine, side by side, MEASURED (not simulated).

Each configuration runs in its own process(es), on the same zoo model (`--tiny`, dynamic batch),
the same initial weights (the model's seeded initialisers), the same batches (seeded) and the same
optimizer; global batch `--batch`; median/min/max of `--steps` timed steps after `--warmup`:

  tf1-single          the plain TF1 graph in one session, one CPU device
  tag-dp-local2       tag_tf.distribute(strategy="dp", topology="local:2"), one process
  tag-horovod-local2  the same with fused buckets (strategy="horovod")
  tag-dp-2proc-client two `tag-tf server` processes (1 CPU each) and a client process that only drives
  tag-dp-2proc-tfconfig  the same script on two tasks with TF_CONFIG: the chief's own device works,
                      no third process (the cluster-conventions way)
  tag-horovod-2proc-tfconfig  the same with fused buckets

Also reported: the first step's time (capture, analysis, planning, compilation, migration), first
and last loss. MirroredStrategy / MultiWorkerMirroredStrategy / Horovod are not in this run yet.

Usage: python benchmarks/step_time.py [--quick] [--models cnn,transformer]
Writes benchmarks/results/step_time.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CONFIGS = ("tf1-single", "tag-dp-local2", "tag-horovod-local2", "tag-dp-2proc-client", "tag-dp-2proc-tfconfig",
           "tag-horovod-2proc-tfconfig")


def train(model_name: str, batch: int, warmup: int, steps: int, distribute_kwargs: dict | None) -> dict:
    """One process's training loop (the chief's, under TF_CONFIG); returns its timings."""
    import contextlib

    import numpy as np
    import tensorflow as tf

    import tag_tf
    from tag_tf.models import build_model

    model = build_model(model_name, tiny=True, dynamic_batch=True, dropout=0.0)
    rng = np.random.default_rng(0)
    batches = [model.feed(rng, batch) for _ in range(warmup + steps)]
    scope = tag_tf.distribute(**distribute_kwargs) if distribute_kwargs is not None else contextlib.nullcontext()
    times, losses = [], []
    with scope:
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(model.graph_def, name="")
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=120_000)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(model.init_op)
            for feed in batches:
                start = time.perf_counter()
                _, loss = sess.run([model.train_op, model.loss], feed)
                times.append(time.perf_counter() - start)
                losses.append(float(loss))
    timed = times[warmup:]
    return {"first_step_s": times[0], "median_ms": statistics.median(timed) * 1e3, "min_ms": min(timed) * 1e3,
            "max_ms": max(timed) * 1e3, "first_loss": losses[0], "last_loss": losses[-1], "steps": len(timed)}


def _child(config: str, model: str, args: argparse.Namespace, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--run", config, "--models", model, "--batch", str(args.batch),
           "--warmup", str(args.warmup), "--steps", str(args.steps)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env or dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen, what: str) -> dict:
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        return {"error": f"{what} exited {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"}
    return json.loads(out.strip().splitlines()[-1])


def measure(config: str, model: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=tempfile.mkdtemp(prefix="tag_tf_bench_"))
    env.pop("TF_CONFIG", None)
    if not config.endswith("2proc-tfconfig"):
        return _result(_child(config, model, args, env), config)
    from tag_tf.runtime.cluster import free_ports

    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs = []
    for task in ({"type": "worker", "index": 0}, {"type": "chief", "index": 0}):
        procs.append(_child(config, model, args, dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": task}))))
    worker_out, worker_err = procs[0].communicate(timeout=900)
    chief = _result(procs[1], "the chief")
    if procs[0].returncode != 0:
        chief = {"error": f"the worker exited {procs[0].returncode}"}
    return chief


def run_in_this_process(config: str, model: str, args: argparse.Namespace) -> dict:
    if config == "tf1-single":
        return train(model, args.batch, args.warmup, args.steps, None)
    if config == "tag-dp-local2":
        return train(model, args.batch, args.warmup, args.steps, dict(strategy="dp", topology="local:2"))
    if config == "tag-horovod-local2":
        return train(model, args.batch, args.warmup, args.steps, dict(strategy="horovod", topology="local:2"))
    if config.endswith("2proc-tfconfig"):        # TF_CONFIG says the rest
        return train(model, args.batch, args.warmup, args.steps, dict(strategy=config.split("-")[1]))
    if config == "tag-dp-2proc-client":
        from tag_tf.runtime.cluster import local_cluster

        with local_cluster(2, 1) as (spec, _):
            return train(model, args.batch, args.warmup, args.steps, dict(strategy="dp", cluster=spec))
    raise SystemExit(f"unknown configuration {config!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="cnn,transformer")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="2 warm-up and 5 timed steps, cnn only")
    ap.add_argument("--out", help="where to write the JSON (default benchmarks/results/step_time[_quick].json)")
    ap.add_argument("--run", help=argparse.SUPPRESS)          # internal: one configuration, in this process
    args = ap.parse_args()
    if args.run:
        result = run_in_this_process(args.run, args.models, args)
        print(json.dumps(result))
        return
    if args.quick:
        args.models, args.warmup, args.steps = "cnn", 2, 5
    rows = {}
    for model in args.models.split(","):
        for config in CONFIGS:
            row = measure(config, model, args)
            rows[f"{model}/{config}"] = row
            shown = (f"{row['median_ms']:.1f} ms (min {row['min_ms']:.1f}, max {row['max_ms']:.1f}), first step "
                     f"{row['first_step_s']:.2f} s, loss {row['first_loss']:.4f} -> {row['last_loss']:.4f}"
                     if "error" not in row else row["error"])
            print(f"{model:12s} {config:24s} {shown}", flush=True)
    out = {"measured": True, "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "batch": args.batch, "warmup": args.warmup, "steps": args.steps, "rows": rows}
    name = "step_time_quick.json" if args.quick else "step_time.json"
    path = args.out or os.path.join(ROOT, "benchmarks", "results", name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
