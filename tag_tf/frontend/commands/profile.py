"""`tag-tf profile`: measure per-op times of a zoo model on this machine and store them in the profile DB.

    tag-tf profile --model cnn --tiny --batch-sizes 2,4,8 --repeats 5 --json

    tag-tf profile --model vgg19 --cluster cluster.json --topology mine.yaml --json

Without --cluster, a device of this machine is measured ("local": the first GPU, else the CPU;
"cpu"; "gpu[:N]"). With --cluster (the servers of `tag-tf server`), each device type present on the
cluster is measured once, on the first server that has it: the types come from --topology (machine
i = task i), or, for CPU-only servers, from the servers themselves. GPU types that are measured
nowhere get op times from the analytical cost model at planning time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any

from tag_tf.deadline import Deadline
from tag_tf.errors import ProfileError

if TYPE_CHECKING:
    from tag_tf.profile.op_profile import OpProfile


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile", help="measure per-op compute times of a model on this machine",
        description="Run single-device training of a zoo model under full tracing at several batch sizes, "
                    "fit t = fixed + per_sample * batch per op, and store the profile in the profile database.")
    p.add_argument("--model", required=True, help="zoo model name (mlp, cnn, vgg19, resnet101, ...)")
    p.add_argument("--device", default="local",
                   help="local device to measure: local (first GPU, else CPU), cpu, gpu or gpu:N")
    p.add_argument("--batch-sizes", default="2,4,8,16", help="comma-separated batch sizes (default 2,4,8,16)")
    p.add_argument("--repeats", type=int, default=5, help="traced steps per batch size (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untraced warm-up steps per batch size (default 2)")
    p.add_argument("--cluster", help="a cluster file: profile each device type present on its servers")
    p.add_argument("--topology", help="with --cluster: the cluster's topology (machine i = task i), which names "
                                      "each server's GPU types (default: CPU-only servers)")
    p.add_argument("--tiny", action="store_true", help="build the tiny variant of the model")
    p.add_argument("--dynamic-batch", action="store_true",
                   help="build once with a dynamic batch dimension and feed each batch size")
    p.add_argument("--db", default=None, help="profile database directory (default $TAG_TF_CACHE_DIR/profiles, else ~/.cache/tag_tf/profiles)")
    p.add_argument("--force", action="store_true", help="re-profile even when the database has the profile")
    p.add_argument("--top", type=int, default=10, help="how many of the slowest ops to list (default 10)")
    p.add_argument("--budget-s", dest="budget", type=float,
                   help="stop, with an error naming it, once profiling has run this many seconds (default: no limit)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise ProfileError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if len(sizes) < 2:
        raise ProfileError(f"--batch-sizes needs at least two distinct sizes, got {text!r}")
    if sizes[0] < 1:
        raise ProfileError(f"--batch-sizes must be >= 1, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    from tag_tf.frontend.loading import model_ir
    from tag_tf.measure.ops import profile_model, resolve_device
    from tag_tf.models import build_model
    from tag_tf.profile.db import ProfileDB, default_db_path

    sizes = parse_batch_sizes(args.batch_sizes)
    if args.repeats < 1:
        raise ProfileError(f"--repeats must be >= 1, got {args.repeats}")
    if args.warmup < 0:
        raise ProfileError(f"--warmup must be >= 0, got {args.warmup}")
    if args.topology and not args.cluster:
        raise ProfileError("--topology is for --cluster (the cluster's machines); a local profile needs neither")
    if args.budget is not None and not args.budget > 0:
        raise ProfileError(f"--budget-s must be positive, got {args.budget}")
    deadline = Deadline.never() if args.budget is None else Deadline.after(args.budget)
    targets = cluster_devices(args.cluster, args.topology) if args.cluster else [Target(*resolve_device(args.device))]
    db = ProfileDB(args.db or default_db_path())

    t0 = time.perf_counter()
    # The key: the graph's IR fingerprint (at the smallest batch size; batch-independent when the
    # batch dimension is dynamic).
    model = build_model(args.model, batch_size=sizes[0], tiny=args.tiny, dynamic_batch=args.dynamic_batch)
    fingerprint = model_ir(model).fingerprint     # what `plan` rebuilds and matches (frontend/loading.py)
    reports = []
    for target in targets:
        def measure(target=target):
            prof = profile_model(args.model, sizes, repeats=args.repeats, warmup=args.warmup, tiny=args.tiny,
                                 dynamic_batch=args.dynamic_batch,
                                 device=target.tf_device if target.server else args.device,
                                 target=target.server, device_type=target.device_type if target.server else None,
                                 deadline=deadline)
            return dataclasses.replace(prof, fingerprint=fingerprint)

        if args.force:
            profile, cached = measure(), False
            db.put_op_profile(profile, fingerprint, target.device_type, sizes)
        else:
            profile, cached = db.op_profile(fingerprint, target.device_type, sizes, measure)
        report = summarize(profile, args.model, args.top)
        report.update({"fingerprint": fingerprint, "tiny": bool(args.tiny), "cached": cached,
                       "db": db.op_profile_path(fingerprint, target.device_type, sizes)})
        if target.server:
            report.update({"server": target.server, "device": target.tf_device})
        reports.append(report)
    elapsed = round(time.perf_counter() - t0, 3)
    if args.cluster:
        out = {"model": args.model, "cluster": args.cluster, "device_types": [r["device_type"] for r in reports],
               "profiles": reports, "elapsed_s": elapsed}
    else:
        out = {**reports[0], "elapsed_s": elapsed}
    if args.json:
        print(json.dumps(out, indent=None, sort_keys=False))
    else:
        print("\n".join(_text(r) for r in reports))
    return 0


@dataclasses.dataclass(frozen=True)
class Target:
    """A device to profile: its type, its TF name, and the server it is on ("" = this process)."""

    device_type: str
    tf_device: str
    server: str = ""


def _short(device: str) -> str:
    """A device name without its replica, upper-cased kind: comparable across TF's spellings."""
    return device.replace("/replica:0", "").replace("/device:", "/").upper()


def cluster_devices(cluster_file: str, topology_spec: str | None) -> list[Target]:
    """One device per device type of the cluster, on the first task that has it."""
    import tensorflow as tf

    from tag_tf.runtime.cluster import ClusterSpec
    from tag_tf.runtime.sessions import session_config

    spec = ClusterSpec.load(cluster_file)
    spec.check()                                   # a dead server is named before anything runs
    prefix = f"/job:{spec.job}/replica:0/task:"
    with tf.Graph().as_default():
        with tf.compat.v1.Session(spec.target, config=session_config(None, timeout_ms=spec.timeout_ms,
                                                                     soft_placement=False)) as sess:
            devices = sess.list_devices()
    present = {_short(d.name) for d in devices}
    found: dict[str, Target] = {}
    if topology_spec:
        from tag_tf.topology.load import load_topology

        topology = load_topology(topology_spec)
        if topology.num_machines != len(spec.tasks):
            raise ProfileError(f"{cluster_file}: {len(spec.tasks)} tasks but topology {topology.name!r} has "
                               f"{topology.num_machines} machines (task i runs machine i)")
        for task, machine in enumerate(topology.machines):
            for index, gpu in enumerate(machine.gpus):
                kind = "CPU" if gpu.type == "cpu" else "GPU"
                name = f"{prefix}{task}/device:{kind}:{index if kind == 'GPU' else 0}"
                if gpu.type not in found and _short(name) not in present:
                    # Soft placement would run the ops elsewhere and store those times as this type's.
                    raise ProfileError(f"{cluster_file}: topology {topology.name!r} puts a {gpu.type} at {name}, but "
                                       f"task {task} ({spec.tasks[task]}) has no such device")
                found.setdefault(gpu.type, Target(gpu.type, name, f"grpc://{spec.tasks[task]}"))
        return list(found.values())
    gpus = [d.name for d in devices if d.device_type == "GPU"]
    if gpus:
        raise ProfileError(f"{cluster_file}: the servers have GPUs ({gpus[0]}, ...) whose types only a topology "
                           "names: pass --topology with the cluster's machines")
    task_of = {d.name: int(d.name.split("/task:")[1].split("/")[0]) for d in devices if "/task:" in d.name}
    cpu_tasks = sorted(task_of[d.name] for d in devices if d.device_type == "CPU" and d.name in task_of)
    if not cpu_tasks:
        raise ProfileError(f"{cluster_file}: the servers list no devices")
    task = cpu_tasks[0]
    return [Target("cpu", f"{prefix}{task}/device:CPU:0", f"grpc://{spec.tasks[task]}")]


def summarize(profile: OpProfile, model: str, top: int) -> dict[str, Any]:
    """The JSON report of a profile."""
    b_max = max(profile.batch_sizes)
    k = {b: i for i, b in enumerate(profile.batch_sizes)}
    fit = profile.runtime_fit()
    return {
        "model": model,
        "device_type": profile.device_type,
        "batch_sizes": list(profile.batch_sizes),
        "repeats": profile.repeats,
        "ops_profiled": profile.num_ops,
        "ops_batch_dependent": int((profile.per_sample > 0).sum()),
        "ops_fused": len(profile.info.get("absorbed", {})),
        "total_fitted_s": {str(b): profile.total(b) for b in profile.batch_sizes},
        "total_measured_s": {str(b): profile.measured_total(b) for b in profile.batch_sizes},
        "step_wall_s": ({str(b): float(profile.step_times[k[b]]) for b in profile.batch_sizes}
                        if profile.step_times is not None else None),
        "rewritten_step_wall_s": ({str(b): float(profile.rewritten_step_times[k[b]]) for b in profile.batch_sizes}
                                  if profile.rewritten_step_times is not None else None),
        "runtime": None if fit is None else {"as_written": fit.as_written, "op_time_scale": fit.scale,
                                             "op_overhead_s": fit.op_overhead_s,
                                             "rewrites_ratio": fit.rewrites_ratio, "said": fit.describe()},
        "top_ops": [{"name": n, "type": t, "time_s": s,
                     "fixed_s": float(profile.fixed[profile.index()[n]]),
                     "per_sample_s": float(profile.per_sample[profile.index()[n]])}
                    for n, t, s in profile.top(max(top, 0), b_max)],
        "top_ops_batch": b_max,
    }


def _text(r: dict[str, Any]) -> str:
    lines = [f"{r['model']} on {r['device_type']}: {r['ops_profiled']} ops profiled "
             f"({r['ops_batch_dependent']} batch-dependent) at batch sizes {r['batch_sizes']}"
             + (" [from the database]" if r["cached"] else "")]
    for b, t in r["total_fitted_s"].items():
        wall = r["step_wall_s"][b] if r["step_wall_s"] else float("nan")
        lines.append(f"  batch {b:>4}: fitted {t * 1e3:9.3f} ms  measured {r['total_measured_s'][b] * 1e3:9.3f} ms"
                     f"  step wall {wall * 1e3:9.3f} ms")
    if r.get("runtime"):
        lines.append(f"whole steps: {r['runtime']['said']}")
    lines.append(f"slowest ops at batch {r['top_ops_batch']}:")
    for op in r["top_ops"]:
        lines.append(f"  {op['time_s'] * 1e6:10.1f} us  {op['type']:<24} {op['name']}")
    lines.append(f"stored in {r['db']}")
    return "\n".join(lines)
