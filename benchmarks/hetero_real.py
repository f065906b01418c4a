"""TAG for real on emulated heterogeneous clusters, MEASURED: every row a real run (root; CPU).

Each cluster is built with `tag_tf.emulate` on this machine: every host a network namespace behind
a shaped link (tc) with its own CPU quota (cgroup v1); tasks get their TF_CONFIG. On each cluster,
for each model (the zoo's, as step_time.py builds them: dynamic batch, SGD with momentum 0.9, the
same seeded initial values and batches everywhere), side by side in one run:

  plain            the unchanged program on the fastest host alone (no TF_CONFIG)
  plain-as-written the same with TensorFlow's graph rewrites (Grappler) off: tag_tf runs a program
                   so where its profile found the rewrites slower; any single-host run could too
  tag-auto         tag_tf.distribute(strategy="auto") on every host: the planner, on the cluster as
                   discovery measures it (each task's speed, every link)
  tag-dp, tag-dp-p, tag-horovod, tag-horovod-p   tag_tf's baselines on every host
  mwms             MultiWorkerMirroredStrategy, equal shards, as its users run it
  horovod          Horovod (Gloo), equal shards, one rank per host over its shaped link (task 0 serves
                   the rendezvous, as horovodrun's launcher would): absent unless horovod is installed

Before the rows, the model is profiled on the fastest host (its own quota, as the planner's "cpu"
op times: discovery's speeds are against the fastest task) into the cluster's profile database.
A tag_tf row also reports the plan it ran (groups, options, hosts, batch shares), its predicted
step time (the simulator the planner judged plans with, on the discovered topology; for a plan on
one device, the plain program's), planning time and first step.

With --rounds R every row runs R times, interleaved (round r starts its row order r places further
on), and reports the median of its R step times (`rounds_ms` keeps each): a shared 2-core machine drifts
by 15-35% over a cluster's minutes, which one pass per row charges to whichever rows ran in a slow
stretch. The row's plan and prediction are the median round's; where discovery measured the hosts
differently and the rounds ran different plans, `rounds_plans` lists each. Later rounds find auto's
plan in the plan cache when discovery saw the same cluster (planning time is the first round's).

A row's step time is the mean of its timed steps (`mean_ms`; the median, min and max beside it): a
host's CPU quota is a budget per 10 ms period (cgroup CFS), so steps shorter than a period run at
full speed until the budget is spent and then wait for the next period: their median picks one mode
or the other (the mlp at batch 48, 1.5 ms a step on a full core, on a host of half a core: medians
of 2.1 and 6.9 ms in two rows that ran one plan; means of 3.5-4.3 ms in another run). The mean is the time a run takes per step, what a
real host of that speed gives. For the same reason the mlp runs at batch 480 (MODEL_BATCH: about
25 ms a step on half a core), where a step spans a few periods.

Usage (root): python benchmarks/hetero_real.py [--quick] [--clusters compute,link,mixed]
                  [--models mlp,cnn,transformer,cnn-wide] [--batch 48] [--warmup 5] [--steps 15] [--rounds 1] [--merge]
Writes benchmarks/results/hetero_real.json (--quick: hetero_real_quick.json; --out: that file), the
RESULTS.md section (--markdown '' skips it) and the plot beside the JSON (hetero_real.svg).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.markdown import replace_section  # noqa: E402

CLUSTERS = {
    # speeds 1 : 0.5 : 0.25, fast links
    "compute": {"hosts": [{"name": "fast", "cpu": 1.0, "nic": "1Gbps"}, {"name": "half", "cpu": 0.5, "nic": "1Gbps"},
                          {"name": "quarter", "cpu": 0.25, "nic": "1Gbps"}]},
    # equal hosts, one behind a slow link
    "link": {"hosts": [{"name": "a", "cpu": 0.5, "nic": "1Gbps"}, {"name": "b", "cpu": 0.5, "nic": "1Gbps"},
                       {"name": "far", "cpu": 0.5, "nic": "50Mbps"}]},
    # both: the slowest host also behind the slow link
    "mixed": {"hosts": [{"name": "fast", "cpu": 1.0, "nic": "1Gbps"}, {"name": "half", "cpu": 0.5, "nic": "1Gbps"},
                        {"name": "far", "cpu": 0.25, "nic": "50Mbps"}]},
}
# The models as step_time.py builds them, the mlp and the cnn at full size (their dense gradients: 2.1 and
# 3.2 MB, more than a 50 Mbit/s link moves in a step), the transformer as step_time's (embeddings), and
# cnn-wide: the cnn on 56x56 images with 64/128 filters and a 512-unit dense layer, a step that is mostly
# convolution (small weights) beside a 51 MB dense gradient (25088 x 512), at batch 96 (MODEL_BATCH); the
# mlp at batch 480, where its steps span a few CFS periods (module docstring).
WIDE_CNN = dict(input_size=56, filters=(64, 128), dense_units=512)
MODEL_BATCH = {"cnn-wide": 96, "mlp": 480}
STEP_KEY = "mean_ms"             # a row's step time (module docstring)


def step_ms(row: dict) -> float | None:
    """A measured row's step time: its mean step (`STEP_KEY`), or, in results from before rows had
    one, its median; None for a row that did not run."""
    if not isinstance(row, dict):
        return None
    return row.get(STEP_KEY, row.get("median_ms"))


def _model_kwargs() -> dict[str, dict]:
    from benchmarks.step_time import COMMON, MODEL_KWARGS

    return {"mlp": dict(COMMON, tiny=False), "cnn": dict(COMMON, tiny=False), "transformer": MODEL_KWARGS["transformer"],
            "cnn-wide": dict(COMMON, tiny=False, **WIDE_CNN)}


def _register_models() -> None:
    """Make step_time build this benchmark's models (sizes, and which zoo model a variant is)."""
    from benchmarks import step_time

    step_time.MODEL_KWARGS.update(_model_kwargs())
    step_time.ZOO_NAME["cnn-wide"] = "cnn"


def model_batch(model: str, args: argparse.Namespace) -> int:
    """The global batch `model` runs at: MODEL_BATCH's, else --batch."""
    return MODEL_BATCH.get(model, args.batch)


TAG_ROWS = ("tag-auto", "tag-dp", "tag-dp-p", "tag-horovod", "tag-horovod-p", "tag-best-subset", "tag-pipeline")
# plain: the program alone on the fastest host as its user runs it (TensorFlow's defaults); plain-as-written:
# the same with TensorFlow's graph rewrites (Grappler) off, which tag_tf chooses where its profile measured
# them slower (`OpProfile.runtime_fit`): a single-host program gets that without any plan.
PLAIN_ROWS = ("plain", "plain-as-written")
ROWS = (*PLAIN_ROWS, *TAG_ROWS, "mwms", "horovod")
PROFILE_SIZES = (8, 16, 32)     # and the batch the model runs at (`profile_sizes`)
ROW_MARK = "HETERO_ROW "
TIMEOUT_S = 600
BEGIN, END = "<!-- hetero_real:begin -->", "<!-- hetero_real:end -->"


# -- one row's process (on an emulated host) -------------------------------------------------------
def child(args: argparse.Namespace) -> dict:
    from benchmarks import step_time

    _register_models()      # every builder below reads the sizes (and a variant's zoo model) from there

    if args.run == "profile":
        return profile(args)
    if args.run == "mwms":
        from benchmarks import peers

        batches = step_time.batches_for(args.model, args.batch, args.warmup + args.steps)
        return peers.run_tf2("mwms-2proc", step_time.zoo_name(args.model), step_time.model_kwargs(args.model), batches,
                             args.warmup)
    if args.run == "horovod":
        from benchmarks import peers

        horovod_environment()
        batches = step_time.batches_for(args.model, args.batch, args.warmup + args.steps)
        return peers.run_horovod(step_time.zoo_name(args.model), step_time.model_kwargs(args.model), batches,
                                 args.warmup)
    if args.run in PLAIN_ROWS:
        return step_time.train(args.model, args, None, as_written=args.run == "plain-as-written")
    return step_time.train(args.model, args, dict(strategy=args.run[len("tag-"):]), inspect=describe_run)


HOROVOD_RENDEZVOUS_PORT_OFFSET = 100   # the rendezvous listens on host 0 at the cluster's port + this


def horovod_environment() -> None:
    """Horovod's Gloo settings for this emulated host, as horovodrun would set them for one rank per
    host: rank = the TF_CONFIG task index, every host its own machine (local size 1), collectives
    over the host's own interface (eth0, its shaped link). Task 0 also serves the rendezvous (in this
    process: a few HTTP requests at start) for the hosts TF_CONFIG lists."""
    tf_config = json.loads(os.environ["TF_CONFIG"])
    addresses = list(tf_config["cluster"]["worker"])
    rank, size = int(tf_config["task"]["index"]), len(addresses)
    host, _, port = addresses[0].rpartition(":")
    rendezvous_port = int(port) + HOROVOD_RENDEZVOUS_PORT_OFFSET
    os.environ.update(HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE="eth0",
                      HOROVOD_GLOO_RENDEZVOUS_ADDR=host, HOROVOD_GLOO_RENDEZVOUS_PORT=str(rendezvous_port),
                      HOROVOD_HOSTNAME=f"h{rank}", HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(size),
                      HOROVOD_LOCAL_RANK="0", HOROVOD_LOCAL_SIZE="1", HOROVOD_CROSS_RANK=str(rank),
                      HOROVOD_CROSS_SIZE=str(size))
    if rank == 0:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
        from horovod.runner.util.threads import in_thread

        # The HTTP server RendezvousServer wraps, at a known port (RendezvousServer.start takes a random one).
        server = RendezvousHTTPServer(("", rendezvous_port), RendezvousHandler, 0)
        in_thread(target=server.serve_forever)
        server.init(get_host_assignments(parse_hosts(",".join(f"h{i}:1" for i in range(size))), size))


def profile(args: argparse.Namespace) -> dict:
    """The model's op profile on this host (the fastest), stored as the "cpu" type's."""
    import dataclasses

    from benchmarks import step_time
    from tag_tf.frontend.loading import model_ir
    from tag_tf.measure.ops import profile_model
    from tag_tf.models import build_model
    from tag_tf.profile.db import ProfileDB, default_db_path

    kwargs = dict(step_time.model_kwargs(args.model))
    zoo = step_time.zoo_name(args.model)
    fingerprint = model_ir(build_model(zoo, **kwargs)).fingerprint
    tiny, dynamic = kwargs.pop("tiny", False), kwargs.pop("dynamic_batch", False)
    start = time.perf_counter()
    sizes = profile_sizes(args.batch)
    prof = profile_model(zoo, sizes, repeats=5, warmup=2, tiny=tiny, dynamic_batch=dynamic,
                         inter_op_threads=None, **kwargs)
    ProfileDB(default_db_path()).put_op_profile(dataclasses.replace(prof, fingerprint=fingerprint), fingerprint,
                                                "cpu", list(sizes))
    return {"profiled_s": time.perf_counter() - start, "fingerprint": fingerprint}


def profile_sizes(batch: int) -> tuple[int, ...]:
    """The batch sizes a model is profiled at: PROFILE_SIZES and the global batch it runs at (the
    one-device plans run the whole batch; extrapolated from 8-32 to 48, the mlp's steps were
    predicted 1.6x their time)."""
    return tuple(sorted({*PROFILE_SIZES, int(batch)}))


def describe_run(d) -> dict:
    """What a tag_tf run (`d`, its distribute scope) planned and ran: the plan (hosts, options,
    shares), its predicted step (the simulator the planner judges plans with, on the discovered
    topology, with the profile database's op times, and the client's feed and drive where tasks
    drive themselves: `client_ms` of it), planning time."""
    from tag_tf.context import default_cache_dir
    from tag_tf.frontend.compiling import drive_cost
    from tag_tf.frontend.planning import client_for, simulator, stored_costs_for

    program = d.programs[0]
    plan, topo, analysis = program.plan, program.target.topology, program.analysis
    strategy = plan.strategy
    hosts = sorted(strategy.machines(topo))
    devices = sorted({dv for g in strategy.groups for dv in g.devices})
    costs = stored_costs_for(analysis, topo, os.path.join(default_cache_dir(), "profiles"))
    client = client_for(analysis, topo, drive_cost(program.target, analysis))
    sim = simulator(analysis, topo, "default", costs).with_client(client)
    report = sim.simulate(strategy)
    predicted = report.iteration_time_s
    shares = None if strategy.shares is None else [strategy.shares[dv] for dv in devices]
    options = sorted({g.option.name.lower() for g in strategy.groups})
    return {"plan": {"name": strategy.name, "groups": len(strategy.groups), "options": options,
                     "hosts": [topo.machines[h].name for h in hosts], "devices": devices,
                     "whole_replicas": bool(strategy.whole_replicas), "sfb": len(strategy.sfb),
                     "shares": None if shares is None else [round(x / sum(shares), 3) for x in shares],   # of `devices`
                     "one_device": len(devices) == 1, "microbatches": strategy.microbatches,
                     "fusion_bytes": strategy.fusion_bytes, "as_written": bool(program.as_written),
                     "stages": len({g.devices for g in strategy.groups}) if strategy.microbatches > 1 else None},
            "predicted_ms": predicted * 1e3, "client_ms": report.client_s * 1e3, "planned_s": plan.seconds,
            "cache_hit": plan.cache_hit,
            "profiled_costs": sorted(costs.files), "topology": topo.to_dict()}


# -- the launcher (root) ----------------------------------------------------------------------------
def _argv(run: str, model: str, args: argparse.Namespace) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--run", run, "--model", model, "--batch", str(model_batch(model, args)),
            "--warmup", str(args.warmup), "--steps", str(args.steps)]


def _rows_of(lines: list[str]) -> dict[str, dict]:
    """Host name -> the JSON row it printed."""
    out = {}
    for line in lines:
        host, _, text = line.partition("] ")
        if text.startswith(ROW_MARK):
            out[host.lstrip("[").strip()] = json.loads(text[len(ROW_MARK):])
    return out


def _tail(lines: list[str], n: int = 3) -> str:
    return " | ".join(line for line in lines[-n:])


def _failed(what: str, lines: list[str]) -> dict:
    """A row that did not run: its last lines, and the first error any host logged (`first_error`):
    where one task fails, the others' last lines say only that it went away."""
    row = {"error": f"{what}: {_tail(lines)}"}
    first = first_error(lines)
    if first:
        row["first_error"] = first
    return row


def first_error(lines: list[str]) -> str | None:
    """The first error a host logged, as "[host] message": TensorFlow's error and fatal log lines
    (" E " or " F " after the timestamp, the timestamp dropped) with the remote call they name on
    that host's next line, else the first line of a Python exception; None where no line is one."""
    import re

    for k, line in enumerate(lines):
        host, _, text = line.partition("] ")
        logged = re.match(r"\d{4}-\d\d-\d\d [\d:.]+: [EF] \S+\] (.*)", text)
        if logged:
            message = logged.group(1)
            nxt = next((ln.partition("] ")[2] for ln in lines[k + 1:] if ln.partition("] ")[0] == host), "")
            call = re.search(r"while calling (\S+?):?$", nxt)
            return f"{host}] {message}" + (f" (calling {call.group(1)})" if call else "")
        if re.match(r"[A-Za-z_.]+(Error|Exception): ", text):
            return f"{host}] {text}"
    return None


def run_row(emu, row: str, model: str, args: argparse.Namespace, env: dict) -> dict:
    names = [h.name for h in emu.cluster.hosts]
    lines: list[str] = []
    if row in (*PLAIN_ROWS, "profile"):           # the fastest host alone, no TF_CONFIG
        p = emu.spawn(0, _argv(row, model, args), env=env, tf_config=False)
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()          # the host process itself (the wrappers exec it); the rest goes with the cluster
            return {"error": f"{row} did not finish in {TIMEOUT_S} s"}
        lines = [f"[{names[0]}] {line}" for line in out.splitlines()]
        found = _rows_of(lines)
        return found.get(names[0]) or _failed(f"{row} exited {p.returncode}", lines)
    if row == "horovod":
        try:
            import horovod  # noqa: F401
        except ImportError:
            return {"absent": "horovod is not installed (README: the optional Horovod build line)"}
    argv = _argv(row, model, args)
    if row == "horovod":
        argv = _own_host_names(emu, argv, env["TAG_TF_CACHE_DIR"])
    code = emu.run_everywhere(argv, timeout_s=TIMEOUT_S, env=env, out=lines.append)
    found = _rows_of(lines)
    if code != 0 or names[0] not in found:
        return _failed(f"{row} exited {code}", lines)
    result = dict(found[names[0]])
    if row in ("mwms", "horovod"):   # each task reports the mean loss of its shard (equal shards): the mean of those
        result["first_loss"] = statistics.mean(r["first_loss"] for r in found.values())
        result["last_loss"] = statistics.mean(r["last_loss"] for r in found.values())
    result["log"] = [line for line in lines if "tag_tf:" in line and line.startswith(f"[{names[0]}")][:8]
    return result


def _own_host_names(emu, argv: list[str], folder: str) -> list[str]:
    """`argv` run where each emulated host's own name resolves to its own address, as on real hosts:
    Gloo's per-process-set contexts (Horovod 0.28) find their address by the host name, which here
    every namespace shares and /etc/hosts maps to loopback. Each host gets a private UTS and mount
    namespace, its name, and an /etc/hosts listing every host (written to `folder`, the model's
    cache, removed with it)."""
    from tag_tf.context import EMULATED_HOST_ENV

    path = os.path.join(folder, "hosts")
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n" + "".join(f"{emu.cluster.address(i)} {h.name}\n"
                                                  for i, h in enumerate(emu.cluster.hosts)))
    script = f'hostname "${EMULATED_HOST_ENV}" && mount --bind {path} /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--uts", "sh", "-c", script, "sh", *argv]


def measure_cluster(name: str, args: argparse.Namespace) -> dict:
    from tag_tf.emulate import load_cluster
    from tag_tf.emulate.cluster import Emulation

    cluster = load_cluster(dict(CLUSTERS[name], name=name))
    out: dict = {"cluster": cluster.to_dict(), "models": {}}
    with Emulation(cluster) as emu:
        measured = emu.measure(seconds_per_link=0.3)
        out["measured"], out["cpusets"] = measured.to_dict(), emu.cpusets
        print(f"== cluster {name}\n{measured.render()}", flush=True)
        for model in args.models.split(","):
            # The run's plan and profile caches: removed after the model unless --keep-caches names a folder
            # (what a prediction can be replayed from later).
            cache = tempfile.mkdtemp(prefix=f"tag_tf_hetero_{name}_{model}_", dir=getattr(args, "keep_caches", None))
            try:
                env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
                env.update(TAG_TF_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
                rows: dict = {"profile": run_row(emu, "profile", model, args, env)}
                measured_rows = rows_to_measure(args)
                runs: dict[str, list[dict]] = {row: [] for row in measured_rows}
                for rnd in range(args.rounds):
                    k = rnd % len(measured_rows)
                    for row in measured_rows[k:] + measured_rows[:k]:
                        r = run_row(emu, row, model, args, env)
                        runs[row].append(r)
                        shown = (f"{step_ms(r):8.1f} ms  first step {r['first_step_s']:.1f} s  loss {r['first_loss']:.5f}"
                                 f" -> {r['last_loss']:.5f}" if step_ms(r) is not None else r.get("error") or r.get("absent"))
                        if "predicted_ms" in r:
                            shown += f"  predicted {r['predicted_ms']:.1f} ms, plan {r['plan']['hosts']} {r['plan']['shares']}"
                        label = f"{row} [{rnd + 1}/{args.rounds}]" if args.rounds > 1 else row
                        print(f"{name:8s} {model:12s} {label:20s} {shown}", flush=True)
                for row in measured_rows:
                    rows[row] = combine_rounds(runs[row])
                if args.rounds > 1:
                    rows["rounds"] = args.rounds
                if model_batch(model, args) != args.batch:
                    rows["batch"] = model_batch(model, args)
                out["models"][model] = rows
            finally:
                if not getattr(args, "keep_caches", None):
                    shutil.rmtree(cache, ignore_errors=True)
    return out


def rows_to_measure(args: argparse.Namespace) -> tuple[str, ...]:
    """The rows this run measures (`--rows`, in the table's order; default every row)."""
    if not getattr(args, "rows", None):
        return ROWS
    asked = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in asked if r not in ROWS]
    if unknown:
        sys.exit(f"--rows: unknown row(s) {', '.join(unknown)} (known: {', '.join(ROWS)})")
    return tuple(r for r in ROWS if r in asked)


def carry_rows(fresh: dict, old: dict, when: dict) -> dict:
    """A model's rows measured now (`fresh`), with each row of `old` (the model as measured `when`:
    commit and date) this run did not measure, marked with `measured_with`."""
    out = dict(fresh)
    for row, r in old.items():
        if row in ROWS and row not in fresh:
            out[row] = dict(r, measured_with=r.get("measured_with") or old.get("measured_with") or when)
    return out


def combine_rounds(results: list[dict]) -> dict:
    """One row from its interleaved rounds: the median of every measured round's step time, with
    the details (plan, prediction, losses) of the round that measured it (the lower of the middle two
    for an even count), so that a prediction is always judged against its own plan's time; planning
    time and first step are the first round's (later rounds find the plan cached). Where the rounds
    ran different plans (discovery measured the hosts differently), `rounds_plans` lists each round's.
    Rounds that failed are counted. A row no round measured is its first round's result."""
    measured = [r for r in results if step_ms(r) is not None]
    if not measured:
        return results[0]
    if len(results) == 1:
        return results[0]
    stat = STEP_KEY if all(STEP_KEY in r for r in measured) else "median_ms"
    by_time = sorted(measured, key=lambda r: r[stat])
    row = dict(by_time[(len(by_time) - 1) // 2])
    for key in ("planned_s", "first_step_s", "cache_hit"):
        if key in measured[0]:
            row[key] = measured[0][key]
    row["rounds_ms"] = [r[stat] for r in measured]
    row[stat] = statistics.median(row["rounds_ms"])
    plans = [(r.get("plan") or {}).get("hosts") for r in measured]
    if any(p != plans[0] for p in plans):
        row["rounds_plans"] = [{"hosts": (r.get("plan") or {}).get("hosts"), "shares": (r.get("plan") or {}).get("shares"),
                                "predicted_ms": r.get("predicted_ms"), stat: r[stat]} for r in measured]
    if len(measured) < len(results):
        row["rounds_failed"] = [r.get("error") or r.get("absent") for r in results if step_ms(r) is None]
    return row


# -- figures --------------------------------------------------------------------------------------
def verdicts(data: dict) -> dict:
    """Per cluster and model: auto against every tag_tf baseline and the plain run, against the
    faster peer, and the predictions' error and order."""
    out: dict = {}
    pairs = []
    pipelined = []
    for cname, c in data["clusters"].items():
        for model, rows in c["models"].items():
            t = {k: step_ms(r) for k, r in rows.items() if k in ROWS and step_ms(r) is not None}
            if "tag-auto" not in t:
                continue
            baselines = {k: t[k] for k in (*PLAIN_ROWS, *TAG_ROWS[1:]) if k in t}
            peers = {k: t[k] for k in ("mwms", "horovod") if k in t}
            best_base = min(baselines, key=baselines.get) if baselines else None
            plan = rows["tag-auto"].get("plan") or {}
            chief = c["cluster"]["hosts"][0]["name"] if c.get("cluster") else None
            written = ran_as_written(rows["tag-auto"])
            ties = [k for k in baselines if (same_plan(plan, None, chief) and (k == "plain-as-written") == written
                                             if k in PLAIN_ROWS else same_plan(plan, rows[k].get("plan"), chief))]
            others = {k: x for k, x in baselines.items() if k not in ties}
            best_other = min(others, key=others.get) if others else None
            v = {"auto_ms": t["tag-auto"], "best_baseline": best_base, "same_plan_as": ties,
                 "auto_over_best_other_plan": t["tag-auto"] / others[best_other] if best_other else None,
                 "auto_over_best_baseline": t["tag-auto"] / baselines[best_base] if best_base else None,
                 "auto_over_faster_peer": t["tag-auto"] / min(peers.values()) if peers else None,
                 "auto_plan": plan or None, "searched_multi_host": searched_multi_host(plan)}
            noise = same_plan_noise([rows[k] for k in ("tag-auto", *ties)])
            v["same_plan_noise"] = noise
            v["never_slower"] = never_slower(v["auto_over_best_baseline"], best_base in ties, noise)
            predicted = {k: rows[k]["predicted_ms"] for k in TAG_ROWS if k in t and "predicted_ms" in rows[k]}
            if predicted:
                errors = [abs(predicted[k] - t[k]) / t[k] for k in predicted]
                v["mape"] = statistics.mean(errors)
                plans = distinct_plans(rows, list(predicted), chief)
                v["plans"] = [list(p) for p in plans]
                v["spearman"] = _spearman([statistics.mean(predicted[k] for k in p) for p in plans],
                                          [statistics.mean(t[k] for k in p) for p in plans])
                v["spearman_rows"] = _spearman([predicted[k] for k in predicted], [t[k] for k in predicted])
                pairs += [(predicted[k], t[k]) for k in predicted]
            plain_loss = rows.get("plain", {}).get("last_loss")
            if plain_loss is not None:
                v["max_last_loss_diff"] = max(abs(r["last_loss"] - plain_loss) for k, r in rows.items()
                                              if isinstance(r, dict) and "last_loss" in r and k != "profile")
            out[f"{cname}/{model}"] = v
            for k in TAG_ROWS:             # pipelined plans that ran: their prediction against the run
                plan_k = (rows.get(k) or {}).get("plan") or {}
                if k in t and (plan_k.get("microbatches") or 1) > 1 and "predicted_ms" in rows[k]:
                    pipelined.append({"row": f"{cname}/{model}/{k}", "measured_ms": t[k],
                                      "predicted_ms": rows[k]["predicted_ms"], "microbatches": plan_k["microbatches"],
                                      "stages": plan_k.get("stages"), "hosts": plan_k.get("hosts"),
                                      "error": (rows[k]["predicted_ms"] - t[k]) / t[k]})
    if pairs:
        out["all"] = {"mape": statistics.mean(abs(p - m) / m for p, m in pairs)}
    if pipelined:
        out["pipelined"] = pipelined
    return out


def same_plan_noise(rows: list[dict]) -> float | None:
    """What runs of one plan differ by: the widest spread (largest less smallest, over the median) of
    one row's own interleaved rounds among `rows` (auto's and the rows that ran its plan); None unless
    each ran two or more rounds. Each row's own: a row slower throughout widens no spread."""
    rounds = [r.get("rounds_ms") or [] for r in rows]
    if len(rows) < 2 or any(len(x) < 2 for x in rounds):
        return None
    return max((max(x) - min(x)) / statistics.median(x) for x in rounds)


def never_slower(auto_over_best: float | None, best_ran_autos_plan: bool, noise: float | None) -> bool | None:
    """Whether auto never lost to the fastest baseline or plain run: at most 1.0x of it, or, where that
    row ran auto's own plan, by no more than runs of that plan differ (`same_plan_noise`)."""
    if auto_over_best is None:
        return None
    if auto_over_best <= 1.0:
        return True
    return bool(best_ran_autos_plan and noise is not None and auto_over_best - 1.0 <= noise)


def ran_as_written(row: dict) -> bool:
    """Whether a tag_tf row ran its graph with TensorFlow's rewrites off (its profile measured them
    slower): the plan says so; rows from before it did, their log ("runs as written")."""
    plan = row.get("plan") or {}
    if "as_written" in plan:
        return bool(plan["as_written"])
    return any("runs as written" in line for line in row.get("log") or ())


def same_plan(auto: dict, other: dict | None, chief: str | None) -> bool:
    """Whether a row ran auto's plan: the same devices, options, SFB and batch shares (a baseline), or
    (`other` None: the plain program) auto keeps the model on one device of the chief's host, where
    the program runs alone (with TensorFlow's rewrites or without, as auto ran: `ran_as_written`). Such rows differ by measurement noise only. A plan without shares splits
    the batch evenly: dp-p's shares on equal hosts are dp's."""
    if not auto:
        return False
    if other is None:
        return bool(auto.get("one_device")) and auto.get("hosts") == [chief]
    keys = ("devices", "options", "sfb", "whole_replicas", "fusion_bytes", "microbatches")
    if any(auto.get(k) != other.get(k) for k in keys):
        return False
    if auto.get("one_device"):
        return True
    a, b = _shares(auto), _shares(other)
    return len(a) == len(b) and all(abs(x - y) <= 2e-3 for x, y in zip(a, b))


def _shares(plan: dict) -> list[float]:
    """A plan's batch shares of its devices (as rounded in the row); even where it lists none."""
    n = len(plan.get("devices") or [])
    return list(plan.get("shares") or [round(1.0 / n, 3)] * n) if n else []


def distinct_plans(rows: dict, names: list[str], chief: str | None) -> list[tuple[str, ...]]:
    """The tag_tf rows `names` grouped by the plan they ran (`same_plan`): the predicted order is
    an order of plans, and rows that ran one plan differ by measurement noise only."""
    plans: list[list[str]] = []
    for k in names:
        for p in plans:
            a, b = rows[p[0]], rows[k]
            # (the same prediction too: plans differing in what the row's plan does not list, such
            # as fusion in results from before it did, are told apart by it)
            if same_plan(a.get("plan") or {}, b.get("plan"), chief) and \
                    abs(a["predicted_ms"] - b["predicted_ms"]) <= 1e-3 * max(a["predicted_ms"], b["predicted_ms"]):
                p.append(k)
                break
        else:
            plans.append([k])
    return [tuple(p) for p in plans]


def group_sets_text(row: dict) -> str | None:
    """A searched plan's op groups by the devices they run on, for a plan whose groups lie on more
    than one set of devices (None otherwise, or for a row without its strategy): each set's hosts,
    its number of groups and, where it splits the batch, the shares within it -- the plan's shares
    are per device and only their ratios within a group's devices mean anything (link/cnn-wide's
    plan gives a and b 0.0002 each beside far's 0.9997: a+b's groups split their batch 50/50, far's
    run the whole batch)."""
    strategy, topology = row.get("strategy"), row.get("topology")
    if not strategy or not topology:
        return None
    sets: dict[tuple[int, ...], int] = {}
    for g in strategy.get("groups") or []:
        key = tuple(sorted(g["devices"]))
        sets[key] = sets.get(key, 0) + 1
    if len(sets) < 2:
        return None
    host_of = [m["name"] for m in topology["machines"] for gpu in m["gpus"] for _ in range(int(gpu["count"]))]
    shares = strategy.get("shares")
    parts = []
    for devices, count in sets.items():
        text = f"{'+'.join(host_of[d] for d in devices)} x{count}"
        if len(devices) > 1:
            weights = [float(shares[d]) if shares else 1.0 for d in devices]
            if not sum(weights) > 0:
                weights = [1.0] * len(devices)
            text += " (" + "/".join(f"{w / sum(weights):.2f}" for w in weights) + ")"
        parts.append(text)
    return "groups " + ", ".join(parts)


def searched_multi_host(plan: dict) -> bool:
    """Whether auto's plan is one only the search finds on two or more hosts: neither whole replicas
    (every group data-parallel on the same devices, no SFB: what the baselines are) nor one device."""
    return bool(plan) and not plan.get("whole_replicas", True) and not plan.get("one_device") \
        and len(plan.get("hosts") or []) >= 2


def _spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation with tied values given their average rank (Pearson's
    correlation of the ranks): rows that ran one plan have one prediction, a tie, not an order."""
    if len(a) < 3:
        return None

    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        start = 0
        while start < len(order):
            end = start
            while end + 1 < len(order) and x[order[end + 1]] == x[order[start]]:
                end += 1
            for k in range(start, end + 1):
                r[order[k]] = (start + end) / 2.0
            start = end + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    sa = sum((x - ma) ** 2 for x in ra) ** 0.5
    sb = sum((y - mb) ** 2 for y in rb) ** 0.5
    if sa == 0.0 or sb == 0.0:
        return None                       # every prediction (or measurement) the same: no order to compare
    return sum((x - ma) * (y - mb) for x, y in zip(ra, rb)) / (sa * sb)


def _statistic(data: dict) -> str:
    """How the rows' step times are taken: the mean, or (results from before rows had it) the median."""
    rows = [r for c in data["clusters"].values() for m in c["models"].values() for r in m.values()
            if isinstance(r, dict) and step_ms(r) is not None]
    if rows and all(STEP_KEY in r for r in rows):
        return "mean"
    return "mean (median where marked)" if any(STEP_KEY in r for r in rows) else "median"


def render(data: dict) -> str:
    stat = _statistic(data)
    lines = [f"Measured {data['date']} on {data['machine']} ({data['cores']} cores), code {data['commit']}; "
             f"batch {data['batch']}, {stat} of {data['steps']} steps after {data['warmup']}. Every row a real run "
             f"on an emulated cluster (namespaces, tc, cgroup CPU quotas; `tag_tf.emulate`); predictions SIMULATED.", ""]
    for cname, c in data["clusters"].items():
        hosts = ", ".join(f"{h['name']} {h['cpu_speed']:.2f}x" for h in c["measured"]["hosts"])
        links = sorted({f"{lk['bandwidth_bps'] / 1e6:.0f}" for lk in c["measured"]["links"]}, key=float)
        when = f" (code {c['commit']}, {c['date']})" if c.get("commit") and c["commit"] != data["commit"] else ""
        lines += [f"**{cname}**{when} — measured host speeds {hosts}; links {'/'.join(links)} Mbit/s", "",
                  "| model | " + " | ".join(ROWS) + " | auto's plan (hosts, shares) | auto predicted |",
                  "|---|" + "---|" * (len(ROWS) + 2)]
        for model, rows in c["models"].items():
            cells = []
            for row in ROWS:
                r = rows.get(row, {})
                cells.append((f"{step_ms(r):.1f}" + ("" if STEP_KEY in r or stat == "median" else " (median)")
                              if step_ms(r) is not None else
                              "absent" if "absent" in r else "error" if r else "not run")
                             + (f" (code {r['measured_with']['commit']})" if r.get("measured_with") else ""))
            auto = rows.get("tag-auto", {})
            plan = auto.get("plan") or {}
            if rows.get("batch"):
                model = f"{model} (batch {rows['batch']})"
            if rows.get("rounds", 1) > 1:
                model = f"{model} (median of {rows['rounds']} interleaved rounds)"
            if rows.get("measured_with"):
                model = f"{model} (code {rows['measured_with']['commit']}, {rows['measured_with']['date']})"
            desc = (f"{'+'.join(plan.get('hosts', []))} {plan.get('options')} "
                    f"{group_sets_text(auto) or '/'.join(str(s) for s in plan.get('shares') or []) or 'even'}"
                    + (f", SFB on {plan['sfb']} gradient(s)" if plan.get("sfb") else "")
                    + (" (one device)" if plan.get("one_device") else "")
                    + (" (searched: not whole replicas)" if searched_multi_host(plan) else "")) if plan else "-"
            pred = f"{auto['predicted_ms']:.1f}" if "predicted_ms" in auto else "-"
            lines.append(f"| {model} | " + " | ".join(cells) + f" | {desc} | {pred} |")
        failed = [(model, row, rows[row]["first_error"]) for model, rows in c["models"].items() for row in ROWS
                  if isinstance(rows.get(row), dict) and rows[row].get("first_error")]
        if failed:
            lines += [""] + [f"- {row} on {model} stopped; the first error a host logged: `{text}`"
                             for model, row, text in failed]
        lines.append("")
    v = verdicts(data)      # from the rows as stored: every figure below is derived from a measured row
    lines += ["| cluster/model | auto / best of baselines and plain | best | rows that ran auto's plan | "
              "spread of their rounds | never slower | auto / best other plan | auto / faster peer | MAPE | Spearman | "
              "largest last-loss difference |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, x in v.items():
        if key in ("all", "pipelined"):
            continue

        def f(value: float | None, fmt: str = ".2f", unit: str = "") -> str:
            return "-" if value is None else format(value, fmt) + unit
        lines.append(f"| {key} | {f(x.get('auto_over_best_baseline'), '.2f', 'x')} | {x.get('best_baseline')} | "
                     f"{', '.join(x.get('same_plan_as') or []) or '-'} | {f(x.get('same_plan_noise'), '.1%')} | "
                     f"{ {True: 'yes', False: 'no', None: '-'}[x.get('never_slower')]} | "
                     f"{f(x.get('auto_over_best_other_plan'), '.2f', 'x')} | {f(x.get('auto_over_faster_peer'), '.2f', 'x')} | {f(x.get('mape'), '.1%')} | {f(x.get('spearman'))} | "
                     f"{f(x.get('max_last_loss_diff'), '.2e')} |")
    lines += ["", "MAPE: of every tag_tf row's prediction against its measured step. Spearman: of the predicted "
              "and measured step times of the distinct plans the tag_tf rows ran (rows that ran one plan counted "
              "once, at their mean; ties at their average rank). Never slower: auto at most 1.0x of the fastest "
              "baseline or plain run, or, where that row ran auto's own plan, slower by no more than the widest spread "
              "of one row's own interleaved rounds among auto and the rows that ran its plan (runs of one program "
              "differ by that much)."]
    if "all" in v:
        lines += ["", f"Every tag_tf row's prediction against its measured step: MAPE {v['all']['mape']:.1%}."]
    if v.get("pipelined"):
        lines += ["", "Pipelined plans that ran (micro-batches, stages): " + "; ".join(
            f"{p['row']} M={p['microbatches']}, {p['stages']} stage(s) on {'+'.join(p['hosts'] or [])}: measured "
            f"{p['measured_ms']:.1f} ms, predicted {p['predicted_ms']:.1f} ms ({p['error']:+.1%})" for p in v["pipelined"]) + "."]
    searched = [(k, x) for k, x in v.items() if k not in ("all", "pipelined") and x.get("searched_multi_host")]
    lines += ["", "Plans only the search finds (neither whole replicas nor one device) on two or more hosts: " + (
        "; ".join(f"{k} on {'+'.join(x['auto_plan']['hosts'])}, auto / best of the baselines and plain "
                  f"{x['auto_over_best_baseline']:.2f}x ({x['best_baseline']})" for k, x in searched
                  if x.get("auto_over_best_baseline")) or "none") + "."]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(c, m) for c, cd in data["clusters"].items() for m in cd["models"]]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys)), 4))
    width = 0.8 / len(ROWS)
    for k, row in enumerate(ROWS):
        values = [step_ms(data["clusters"][c]["models"][m].get(row, {})) or 0.0 for c, m in keys]
        ax.bar([i + k * width for i in range(len(keys))], values, width, label=row)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))])
    ax.set_xticklabels([f"{c}\n{m}" for c, m in keys])
    ax.set_ylabel("step, ms (measured: mean of the timed steps)")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path)     # SVG: text, no binary in the repository


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--models", default="mlp,cnn,transformer,cnn-wide")
    ap.add_argument("--batch", type=int, default=48,
                    help="global batch (default 48: MultiWorkerMirroredStrategy's equal shards over 3 hosts)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every row this many times, interleaved, and report the median (default 1)")
    ap.add_argument("--quick", action="store_true", help="the compute cluster, cnn, 2 + 5 steps")
    ap.add_argument("--merge", action="store_true",
                    help="keep the clusters (and a re-measured cluster's models) of the existing JSON that this run "
                         "does not measure; each says the code and date it was measured with")
    ap.add_argument("--rows", help="measure only these rows (comma-separated, of " + ",".join(ROWS) + "); with --merge "
                    "the model's other rows stay as measured before, each saying the code and date it was measured with")
    ap.add_argument("--keep-caches", metavar="DIR",
                    help="keep each model's plan and profile caches in a folder under DIR (default: removed)")
    ap.add_argument("--out", help="the JSON (default benchmarks/results/hetero_real[_quick].json)")
    ap.add_argument("--markdown", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"))
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        args.breakdown = False
        print(ROW_MARK + json.dumps(child(args)), flush=True)
        return
    # Stopped (SIGTERM, SIGHUP): unwind, so every emulated cluster is removed on the way out.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    if args.quick:
        args.clusters, args.models, args.warmup, args.steps, args.batch = "compute", "cnn", 2, 5, 24
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    data = {"measured": True, "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(), "batch": args.batch,
            "warmup": args.warmup, "steps": args.steps, "clusters": {}}
    name = "hetero_real_quick" if args.quick else "hetero_real"
    path = args.out or os.path.join(ROOT, "benchmarks", "results", f"{name}.json")
    if args.merge and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if (old["batch"], old["steps"], old["warmup"]) != (args.batch, args.steps, args.warmup):
            sys.exit(f"--merge: {path} was measured with batch/steps/warmup {old['batch']}/{old['steps']}/"
                     f"{old['warmup']}, not {args.batch}/{args.steps}/{args.warmup}")
        for cname, c in old["clusters"].items():
            c.setdefault("commit", old["commit"])
            c.setdefault("date", old["date"])
            data["clusters"][cname] = c
    for cname in args.clusters.split(","):
        fresh = dict(measure_cluster(cname, args), commit=commit, date=data["date"])
        old = data["clusters"].get(cname)
        if old is not None:        # --merge: this cluster's models not measured now stay, saying when they were
            when = {"commit": old["commit"], "date": old["date"]}
            for model, rows in old["models"].items():
                if model not in fresh["models"]:
                    fresh["models"][model] = dict(rows, measured_with=rows.get("measured_with") or when)
                elif args.rows:    # and so do the rows of a re-measured model this run did not measure
                    fresh["models"][model] = carry_rows(fresh["models"][model], rows, when)
        data["clusters"][cname] = fresh
    data["verdicts"] = verdicts(data)
    print(json.dumps(data["verdicts"], indent=1))
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    with open(path) as f:      # rendered as stored (sorted keys): what `python -m benchmarks report` renders
        data = json.load(f)
    if not args.quick:
        plot(data, os.path.splitext(path)[0] + ".svg")
        if args.markdown:
            replace_section(args.markdown, BEGIN, END, render(data))

if __name__ == "__main__":
    main()
