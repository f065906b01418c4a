"""Real step time of the rewritten graph next to TensorFlow's own strategies, MEASURED (not simulated).

Each configuration runs in its own process(es), on the same zoo model (dynamic batch; the cnn `--tiny`,
the transformer 2 layers, 32 tokens, width 128, the others `--tiny`), the same initial weights (the
model's seeded initialisers), the same batches (seeded) and SGD with momentum 0.9; global batch
`--batch`; median/min/max of `--steps` timed steps after `--warmup`, in `--repeats` rounds over every
configuration (load bursts on a shared machine then hit every row alike); a row is its median round:

  tf1-single             the plain TF1 graph in one session, one CPU device
  tf2-single             a TF2 tf.function step, one CPU device (benchmarks/peers.py)
  tag-{dp,horovod,auto}-local2      tag_tf.distribute(strategy=..., topology="local:2"), one process
  mirrored-local2        tf.distribute.MirroredStrategy over 2 logical CPU devices, one process
  tag-{dp,horovod,auto}-2proc-tfconfig   the same script on two tasks, each started with its own
                         TF_CONFIG (chief + worker): the chief plans; each task drives its own part
                         of every step where the plan allows (between-graph), else the chief drives
  tag-horovod-2proc-chiefdriven   the same with TAG_TF_BETWEEN_GRAPH=0: the chief drives every
                         task's part of each step (tag_tf's way before between-graph execution)
  mwms-2proc             MultiWorkerMirroredStrategy, two tasks with TF_CONFIG, half the batch each
  horovod-2proc          Horovod (Gloo) under horovodrun, hvd.DistributedOptimizer, half the batch
                         each; reported as absent when horovod is not installed

Also reported: the first step's time (for tag_tf: capture, analysis, planning, compilation,
migration), the first and last loss, and the bytes that crossed the loopback interface per timed
step (every process's traffic: collectives, feeds relayed to other tasks, gRPC framing).

`--predict`: after each round, one clean process per model predicts each tag_tf row's step (the
plan that row ran, on that row's setup) with the local machine model under TensorFlow's default
runtime (`tag_tf.localmachine`: profile, communication, side-by-side replicas and the step's own
cost on TF_CONFIG-like tasks, all measured then, beside the rows, into that round's ProfileDB:
`--db`/roundN), plus tag_tf's session layer (`tag_tf.frontend.run_cost`); a row's prediction is the
median of its rounds' as its time is; the JSON and RESULTS.md get the error per setup.

Usage: python benchmarks/step_time.py [--quick] [--models cnn,transformer] [--predict [--db DIR]]
Writes benchmarks/results/step_time.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import peers  # noqa: E402
from benchmarks.markdown import replace_section  # noqa: E402

CONFIGS = ("tf1-single", "tf2-single", "tag-dp-local2", "tag-horovod-local2", "tag-auto-local2", "mirrored-local2",
           "tag-dp-2proc-tfconfig", "tag-horovod-2proc-tfconfig", "tag-auto-2proc-tfconfig",
           "tag-horovod-2proc-chiefdriven", "mwms-2proc",
           "horovod-2proc")
COMMON = dict(tiny=True, dynamic_batch=True, dropout=0.0, optimizer="momentum")
MODEL_KWARGS = {"transformer": dict(COMMON, input_size=32, d_model=128, d_ff=512, num_heads=4, num_layers=2)}
TIMEOUT_S = 900


# Benchmark variants of zoo models: their name here -> the zoo model they build (with MODEL_KWARGS' sizes).
ZOO_NAME: dict[str, str] = {}


def model_kwargs(model: str) -> dict:
    return MODEL_KWARGS.get(model, COMMON)


def zoo_name(model: str) -> str:
    """The zoo model `model` (a benchmark variant's name, or the zoo's own) builds."""
    return ZOO_NAME.get(model, model)


def batches_for(model_name: str, batch: int, count: int, model=None) -> list[dict]:
    """The seeded batches every configuration trains on (`model`: the built graph, if already at hand)."""
    from tag_tf.models import build_model

    model = model or build_model(zoo_name(model_name), **model_kwargs(model_name))
    rng = np.random.default_rng(0)
    return [model.feed(rng, batch) for _ in range(count)]


def train(model_name: str, args: argparse.Namespace, distribute_kwargs: dict | None,
          inspect: Callable[[Any], dict] | None = None, as_written: bool = False) -> dict:
    """One process's TF1 training loop (the chief's, under TF_CONFIG); returns its timings (and, with
    `inspect`, what inspect(the distribute scope) adds once training is done). `as_written`: the
    session with TensorFlow's graph rewrites off."""
    import contextlib

    import tensorflow as tf

    import tag_tf
    from tag_tf.models import build_model

    model = build_model(zoo_name(model_name), **model_kwargs(model_name))
    batches = batches_for(model_name, args.batch, args.warmup + args.steps, model)
    scope = tag_tf.distribute(**distribute_kwargs) if distribute_kwargs is not None else contextlib.nullcontext()
    times, losses = [], []
    with scope as d:
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(model.graph_def, name="")
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=120_000)
        if as_written:
            from tag_tf.runtime.sessions import keep_as_written

            keep_as_written(config)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(model.init_op)
            for i, feed in enumerate(batches):
                if i == args.warmup:
                    lo_start = peers.loopback_bytes()
                start = time.perf_counter()
                _, loss = sess.run([model.train_op, model.loss], feed)
                times.append(time.perf_counter() - start)
                losses.append(float(loss))
            lo_end = peers.loopback_bytes()
            row = peers.summarize(times, losses, args.warmup, lo_end - lo_start)
            if args.breakdown:     # more steps, traced after the timed ones (so they change none of them)
                row["breakdown"] = peers.traced_step(lambda: sess.run(model.train_op, batches[0]))
    if distribute_kwargs is not None:      # what ran, for the local machine model's prediction (--predict)
        program = d.programs[0]
        strategy = program.plan.strategy
        row.update(plan=strategy.name, strategy=strategy.to_dict(), processes=program.target.topology.num_machines,
                   between_graph=bool(program.between), devices=len({d for g in strategy.groups for d in g.devices}))
        if inspect is not None:
            row.update(inspect(d))
    return row


def predict(model_name: str, args: argparse.Namespace) -> dict:
    """The local machine model's prediction (TensorFlow's default runtime, as the rows ran) of each
    plan in the JSON file `args.plans` ({row key: row}) on its row's setup: one process with local:N,
    or the tasks of TF_CONFIG (between-graph where each drove its own part, else driven by the
    chief). Runs in a process of its own after every round (nothing else running, so what it
    measures is this machine alone); the measurements are cached in the ProfileDB `args.db`. The
    analysis is distribute's own: one step of the program under `tag_tf.distribute` on local:2."""
    import tensorflow as tf

    import tag_tf
    from tag_tf.frontend.run_cost import measure_run_cost
    from tag_tf.localmachine import model as lm
    from tag_tf.models import build_model
    from tag_tf.profile.db import ProfileDB
    from tag_tf.strategy import Strategy

    model = build_model(zoo_name(model_name), **model_kwargs(model_name))
    batch = batches_for(model_name, args.batch, 1, model)[0]
    with tag_tf.distribute(strategy="dp", topology="local:2") as d:
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(model.graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(model.init_op)
            sess.run(model.train_op, batch)
    analysis = d.programs[0].analysis
    layer = measure_run_cost()          # tag_tf's session layer, on every row's step
    db = ProfileDB(args.db)
    zoo = lm.ZooModel.of(model_name, **model_kwargs(model_name))
    out = {}
    for key, row in json.loads(Path(args.plans).read_text()).items():
        started = time.perf_counter()
        processes = int(row["processes"])
        sim = lm.local_simulator(analysis, 2, processes, db=db, model=zoo, runtime=lm.TF_DEFAULTS,
                                 between_graph=processes > 1 and bool(row["between_graph"]), run_layer_s=layer)
        strategy = Strategy.from_dict(row["strategy"], source=key)
        out[key] = {"predicted_ms": sim.simulate(strategy).iteration_time_s * 1e3,
                    "predicted_setup": sim.machine.setup.name, "predict_s": round(time.perf_counter() - started, 1),
                    "predicted_serial": round(sim.serial, 3), "run_layer_ms": layer * 1e3}
    return out


def _child(config: str, model: str, args: argparse.Namespace, env: dict, prefix: list[str] | None = None,
           extra: list[str] | None = None) -> subprocess.Popen:
    cmd = (prefix or []) + [sys.executable, os.path.abspath(__file__), "--run", config, "--models", model,
                            "--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if args.breakdown:
        cmd.append("--breakdown")
    return subprocess.Popen(cmd + (extra or []), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _result(proc: subprocess.Popen, what: str) -> dict:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": f"{what} did not finish in {TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": f"{what} exited {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"}
    return json.loads(out.strip().splitlines()[-1])


def _mean_losses(rows: list[dict]) -> dict:
    """The first process's timings; losses averaged over the processes (each saw an equal shard)."""
    errors = [row["error"] for row in rows if "error" in row]
    if errors:
        return {"error": "; ".join(errors)}
    return dict(rows[0], first_loss=sum(r["first_loss"] for r in rows) / len(rows),
                last_loss=sum(r["last_loss"] for r in rows) / len(rows), processes=len(rows))


def _tf_config_pair(config: str, model: str, args: argparse.Namespace, env: dict, roles: tuple[str, str]) -> list:
    from tag_tf.runtime.cluster import free_ports

    ports = free_ports(2)
    cluster: dict[str, list[str]] = {}
    for role, port in zip(roles, ports):
        cluster.setdefault(role, []).append(f"127.0.0.1:{port}")
    tasks = [{"type": role, "index": cluster[role].index(f"127.0.0.1:{port}")} for role, port in zip(roles, ports)]
    return [_child(config, model, args, dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": task})))
            for task in tasks]


def _child_env(**extra: str) -> dict:
    """This process's environment without a TF_CONFIG or thread/oneDNN settings: TensorFlow's
    defaults, as a user's program runs."""
    from tag_tf.localmachine.runtime import RUNTIME_KEYS

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", *RUNTIME_KEYS)}
    return dict(env, TF_CPP_MIN_LOG_LEVEL="2", **extra)


def measure(config: str, model: str, args: argparse.Namespace) -> dict:
    env = _child_env(TAG_TF_CACHE_DIR=tempfile.mkdtemp(prefix="tag_tf_bench_"))
    if config.endswith(("2proc-tfconfig", "2proc-chiefdriven")):
        if config.endswith("chiefdriven"):
            env["TAG_TF_BETWEEN_GRAPH"] = "0"
        chief, worker = _tf_config_pair(config, model, args, env, ("chief", "worker"))
        row = _result(chief, "the chief")
        try:                    # the worker serves until the chief ends the run, then exits 0
            _, err = worker.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            err = "still running"
        if worker.returncode != 0 and "error" not in row:
            row = {"error": f"the worker exited {worker.returncode}: {err.strip().splitlines()[-1] if err else ''}"}
        return row
    if config == "mwms-2proc":
        procs = _tf_config_pair(config, model, args, env, ("worker", "worker"))
        return _mean_losses([_result(proc, f"worker {i}") for i, proc in enumerate(procs)])
    if config == "horovod-2proc":
        horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
        if horovodrun is None:
            return {"absent": "horovod is not installed (README: the optional Horovod build line)"}
        out_dir = tempfile.mkdtemp(prefix="tag_tf_hvd_")
        proc = _child(config, model, args, env, prefix=[horovodrun, "-np", "2", "-H", "localhost:2", "--gloo"],
                      extra=["--out", out_dir])
        try:
            _, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            return {"error": f"horovodrun did not finish in {TIMEOUT_S} s"}
        files = sorted(glob.glob(os.path.join(out_dir, "rank*.json")))
        if proc.returncode != 0 or len(files) != 2:
            return {"error": f"horovodrun exited {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"}
        rows = [json.loads(Path(f).read_text()) for f in files]
        return _mean_losses(rows)
    return _result(_child(config, model, args, env), config)


def run_in_this_process(config: str, model: str, args: argparse.Namespace) -> dict:
    if config == "tf1-single":
        return train(model, args, None)
    if config.startswith("tag-") and config.endswith("-local2"):
        return train(model, args, dict(strategy=config.split("-")[1], topology="local:2"))
    if config.endswith(("2proc-tfconfig", "2proc-chiefdriven")):        # TF_CONFIG says the rest
        return train(model, args, dict(strategy=config.split("-")[1]))
    batches = batches_for(model, args.batch, args.warmup + args.steps)
    if config == "horovod-2proc":
        row = peers.run_horovod(model, model_kwargs(model), batches, args.warmup, args.breakdown)
        with open(os.path.join(args.out, f"rank{row['rank']}.json"), "w") as f:
            json.dump(row, f)
        return row
    return peers.run_tf2(config, model, model_kwargs(model), batches, args.warmup, args.breakdown)


def representative(found: list[dict]) -> dict:
    """One row from a configuration's rounds: the round with the median median (its own min/max,
    first step, losses), with every round's median beside it; an error in any round is the row.
    Predicted like measured: the median of the rounds' predictions (each round's from the model
    measured in that round)."""
    errors = [row for row in found if "median_ms" not in row]
    if errors:
        return errors[0]
    ordered = sorted(found, key=lambda row: row["median_ms"])
    row = dict(ordered[(len(ordered) - 1) // 2], round_medians_ms=[row["median_ms"] for row in found])
    predicted = [r["predicted_ms"] for r in found if "predicted_ms" in r]
    if predicted:
        row.update(predicted_ms=float(np.median(predicted)), round_predictions_ms=predicted)
    return row


def round_db(args: argparse.Namespace, r: int) -> str:
    """The ProfileDB that round `r`'s predictions measure the local machine model into: the model's
    inputs (a step's own cost, collectives, side-by-side replicas, the profile) drift with this shared
    machine's load as the rows do, so each round measures its own beside the rows it predicts."""
    if args.db:
        return args.db if args.repeats == 1 else os.path.join(args.db, f"round{r + 1}")
    return tempfile.mkdtemp(prefix=f"tag_tf_bench_profiles_r{r + 1}_")


def add_predictions(rows: dict[str, dict], args: argparse.Namespace, db: str | None = None) -> None:
    """Each tag_tf row gains `predicted_ms` (see `predict`): one clean process per model, the local
    machine model from `db` (measured there first when it is not)."""
    db = db or args.db or tempfile.mkdtemp(prefix="tag_tf_bench_profiles_")
    for model in args.models.split(","):
        ours = {key: row for key, row in rows.items() if key.startswith(model + "/") and "strategy" in row}
        if not ours:
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(ours, f)
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--run", "predict", "--models", model,
                                 "--batch", str(args.batch), "--plans", f.name, "--db", db], cwd=ROOT, env=_child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        found = _result(proc, f"the prediction for {model}")
        os.unlink(f.name)
        if "error" in found:
            print(f"{model:12s} prediction failed: {found['error']}", flush=True)
            continue
        for key, pred in found.items():
            rows[key].update(pred)
            print(f"{key:38s} measured {rows[key]['median_ms']:.2f} ms, predicted {pred['predicted_ms']:.2f} ms "
                  f"({pred['predicted_setup']})", flush=True)


def prediction_error(rows: dict[str, dict]) -> dict:
    """Mean absolute percentage error of the local machine model's predictions against the measured
    medians, per setup (one process; TF_CONFIG tasks, between-graph and chief-driven) and overall."""
    err: dict[str, list[float]] = {"all": [], "local2": [], "2proc": []}
    for key, row in rows.items():
        if "predicted_ms" not in row or "median_ms" not in row:
            continue
        e = abs(row["predicted_ms"] - row["median_ms"]) / row["median_ms"]
        err["all"].append(e)
        err["local2" if key.endswith("-local2") else "2proc"].append(e)
    return {"runtime": "tfdefault (TensorFlow's default threads, oneDNN and Grappler)",
            "mape": {k: float(np.mean(v)) for k, v in err.items() if v}, "rows": {k: len(v) for k, v in err.items()}}


BEGIN, END = "<!-- step-time:begin -->", "<!-- step-time:end -->"


def distributed(row: dict, config: str) -> bool:
    """Whether a row ran on more than one device: a fixed strategy always spreads over the setup's
    devices, as every peer does; `auto` only where its plan did (`devices`, recorded by runs since the
    field exists; before it, a between-graph run is one whose tasks each ran a replica)."""
    if "devices" in row:
        return int(row["devices"]) > 1
    return not config.startswith("tag-auto") or bool(row.get("between_graph"))


def render(data: dict) -> str:
    """RESULTS.md's step-time tables from a run's JSON: every row, then tag_tf's best against the best peer."""
    from benchmarks.markdown import measured_when

    lines = [f"Global batch {data['batch']}, median of {data['steps']} steps after {data['warmup']} warm-up steps, "
             f"{data.get('repeats', 1)} round(s) over every configuration (a row is its median round); "
             f"{data.get('cores', '?')} cores ({data.get('machine', 'machine not recorded')}); {measured_when(data)}.",
             "", "| model | configuration | median ms | min–max ms | first step s | loss first → last | loopback kB/step |",
             "|---|---|---|---|---|---|---|"]
    zoo_order = ("mlp", "cnn", "transformer", "bert-small")

    def order(key: str) -> tuple:
        model, config = key.split("/")
        return (zoo_order.index(model) if model in zoo_order else len(zoo_order), model,
                CONFIGS.index(config) if config in CONFIGS else len(CONFIGS))

    keys = sorted(data["rows"], key=order)
    models = list(dict.fromkeys(key.split("/")[0] for key in keys))
    for key in keys:
        row, (model, config) = data["rows"][key], key.split("/")
        if "median_ms" not in row:
            lines.append(f"| {model} | {config} | {row.get('error') or row.get('absent')} | | | | |")
            continue
        lines.append(f"| {model} | {config} | {row['median_ms']:.1f} | {row['min_ms']:.1f}–{row['max_ms']:.1f} | "
                     f"{row['first_step_s']:.2f} | {row['first_loss']:.4f} → {row['last_loss']:.4f} | "
                     f"{row.get('loopback_bytes_per_step', 0) / 1e3:.0f} |")
    lines += ["", "tag_tf's best against the best peer, from the table (measured, same run):", "",
              "| model | one process: best tag_tf / MirroredStrategy | two processes: best tag_tf / faster of MWMS and "
              "Horovod |", "|---|---|---|"]

    def best(model: str, configs: list[str]) -> tuple[str, float] | None:
        found = [(c, data["rows"][f"{model}/{c}"]["median_ms"]) for c in configs
                 if "median_ms" in data["rows"].get(f"{model}/{c}", {}) and distributed(data["rows"][f"{model}/{c}"], c)]
        return min(found, key=lambda cv: cv[1]) if found else None

    def versus(ours: tuple[str, float] | None, peer: tuple[str, float] | None, strip: str) -> str:
        if ours is None or peer is None:
            return "n/a"
        return (f"{ours[0].removeprefix('tag-').removesuffix(strip)} {ours[1]:.1f} / {peer[0]} {peer[1]:.1f} ms = "
                f"{ours[1] / peer[1]:.2f}x")

    kept_one = []
    for key in keys:
        row, (model, config) = data["rows"][key], key.split("/")
        if config.startswith("tag-") and "median_ms" in row and not distributed(row, config):
            single = data["rows"].get(f"{model}/tf1-single", {}).get("median_ms")
            what = ("its plan kept one device" if row.get("devices") == 1 else
                    "this run did not record how many devices its plan used")
            kept_one.append(f"{model} {config.removeprefix('tag-')} ({row['median_ms']:.1f} ms): {what}"
                            + ("" if single is None or row.get("devices") != 1 else
                               f"; against the plain one-device run {single:.1f} ms = {row['median_ms'] / single:.2f}x"))
    for model in models:
        one = versus(best(model, [c for c in CONFIGS if c.startswith("tag-") and c.endswith("-local2")]),
                     best(model, ["mirrored-local2"]), "-local2")
        two = versus(best(model, [c for c in CONFIGS if c.startswith("tag-") and c.endswith("-2proc-tfconfig")]),
                     best(model, ["mwms-2proc", "horovod-2proc"]), "-2proc-tfconfig")
        lines.append(f"| {model} | {one} | {two} |")
    if kept_one:
        lines += ["", "Left out of the comparison with the distributed peers (only distributed tag_tf rows are compared with "
                  "them): " + "; ".join(kept_one) + "."]
    if data.get("prediction"):
        lines += [""] + render_prediction(data, keys)
    return "\n".join(lines) + "\n"


ACCURACY_JSON = os.path.join(ROOT, "benchmarks", "results", "simulator_accuracy.json")


def render_prediction(data: dict, keys: list[str]) -> list[str]:
    """The local machine model's prediction of every tag_tf row beside its measured median, and the
    error per setup next to the simulator-accuracy benchmark's (its pinned runtime)."""
    lines = ["The local machine model's prediction of each tag_tf row (`--predict`: TensorFlow's default runtime, the "
             "plan the row ran, the row's setup; measured on this machine, then predicted from its measurements):", "",
             "| model | configuration | measured ms | predicted ms | error | setup modelled |", "|---|---|---|---|---|---|"]
    for key in keys:
        row, (model, config) = data["rows"][key], key.split("/")
        if "predicted_ms" in row and "median_ms" in row:
            err = (row["predicted_ms"] - row["median_ms"]) / row["median_ms"]
            lines.append(f"| {model} | {config} | {row['median_ms']:.2f} | {row['predicted_ms']:.2f} | {err:+.0%} | "
                         f"{row.get('predicted_setup', '')} |")
    mape, counts = data["prediction"]["mape"], data["prediction"]["rows"]
    theirs = ""
    if os.path.exists(ACCURACY_JSON):
        per_setup = json.loads(Path(ACCURACY_JSON).read_text()).get("summary", {}).get("per_setup", {})
        if {"1proc-4cpu", "2proc-2cpu"} <= set(per_setup):
            theirs = (f"; the simulator-accuracy benchmark's, pinned runtime: one process "
                      f"{per_setup['1proc-4cpu']['mape']:.1%}, two server processes {per_setup['2proc-2cpu']['mape']:.1%}")
    parts = [f"{name} {mape[k]:.1%} ({counts[k]} rows)" for k, name in
             (("local2", "one process"), ("2proc", "two processes"), ("all", "all")) if k in mape]
    return lines + ["", "Prediction error (MAPE): " + ", ".join(parts) + theirs + "."]


def write_markdown(data: dict, path: str) -> None:
    """Replace the tables between the step-time markers of `path` (RESULTS.md)."""
    replace_section(path, BEGIN, END, render(data))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="cnn,transformer")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds over every configuration; each row is its median round (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true",
                    help="2 warm-up and 5 timed steps, cnn only, no `auto` rows (their planning is tested elsewhere)")
    ap.add_argument("--out", help="where to write the JSON (default benchmarks/results/step_time[_quick].json)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also trace one extra step per configuration: compute/collectives/transfers/idle per device")
    ap.add_argument("--markdown", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"),
                    help="regenerate the step-time tables of this RESULTS.md ('' to skip; --quick never writes it)")
    ap.add_argument("--predict", action="store_true",
                    help="tag_tf rows also get the local machine model's prediction (TensorFlow's default runtime) "
                         "of the plan they ran, and the JSON the prediction error per setup")
    ap.add_argument("--db", help="with --predict: ProfileDB directory of the local machine model, one per round "
                                 "under it (DIR/roundN) when --repeats > 1 (default: fresh temporary ones; measuring "
                                 "it takes about half a minute per model)")
    ap.add_argument("--keep-plans", action="store_true",
                    help="keep each tag_tf row's plan (the strategy JSON) in the output, for --predict-only")
    ap.add_argument("--predict-only", metavar="JSON",
                    help="no runs: predict the tag_tf rows of a previous --keep-plans run's JSON again (--out, "
                         "default: that file)")
    ap.add_argument("--run", help=argparse.SUPPRESS)          # internal: one configuration (or predict), here
    ap.add_argument("--plans", help=argparse.SUPPRESS)        # internal: --run predict's rows
    args = ap.parse_args()
    if args.run == "predict":
        print(json.dumps(predict(args.models, args)))
        return
    if args.predict_only:         # a previous run's rows (their plans), predicted again
        data = json.loads(Path(args.predict_only).read_text())
        if not any("strategy" in row for row in data["rows"].values()):
            raise SystemExit(f"{args.predict_only}: no tag_tf row keeps its plan (make the run with --keep-plans)")
        args.models, args.batch = ",".join(data["model_kwargs"]), int(data["batch"])     # as that run
        add_predictions(data["rows"], args)
        data["prediction"] = prediction_error(data["rows"])
        print(json.dumps(data["prediction"], indent=1))
        with open(args.out or args.predict_only, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        return
    if args.run:
        result = run_in_this_process(args.run, args.models, args)
        print(json.dumps(result))
        return
    configs = args.configs.split(",")
    if args.quick:
        args.models, args.warmup, args.steps, args.repeats = "cnn", 2, 5, 1
        configs = [c for c in configs if "-auto-" not in c]
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")

    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    runs: dict[str, list[dict]] = {}
    for r in range(args.repeats):      # rounds: load bursts on this shared machine spread over every row
        this_round = {}
        for model in args.models.split(","):
            for config in configs:
                row = measure(config, model, args)
                runs.setdefault(f"{model}/{config}", []).append(row)
                this_round[f"{model}/{config}"] = row
                if "median_ms" in row:
                    shown = (f"{row['median_ms']:.1f} ms (min {row['min_ms']:.1f}, max {row['max_ms']:.1f}), first "
                             f"step {row['first_step_s']:.2f} s, loss {row['first_loss']:.4f} -> "
                             f"{row['last_loss']:.4f}, loopback {row.get('loopback_bytes_per_step', 0) / 1e3:.0f} kB/step")
                else:
                    shown = row.get("error") or row.get("absent")
                print(f"{model:12s} {config:26s} {shown}" + (f"  [round {r + 1}/{args.repeats}]" if args.repeats > 1
                                                             else ""), flush=True)
        if args.predict:
            add_predictions({k: row for k, row in this_round.items() if "median_ms" in row}, args, round_db(args, r))
    rows = {key: representative(found) for key, found in runs.items()}
    if not args.keep_plans:
        for row in rows.values():
            row.pop("strategy", None)      # the plan's name stays
    out = {"measured": True, "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "batch": args.batch, "warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
           "optimizer": "momentum 0.9",
           "model_kwargs": {m: model_kwargs(m) for m in args.models.split(",")}, "rows": rows}
    if args.predict:
        out["prediction"] = prediction_error(rows)
        print(json.dumps(out["prediction"], indent=1))
    from benchmarks.markdown import stamp

    out = stamp(out)
    name = "step_time_quick.json" if args.quick else "step_time.json"
    path = args.out or os.path.join(ROOT, "benchmarks", "results", name)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    if args.markdown and not args.quick:
        write_markdown(out, args.markdown)


if __name__ == "__main__":
    main()
