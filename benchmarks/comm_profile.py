"""Profile communication on this machine and fit segmented linear models.

Measures (real TensorFlow runs, see tag_tf/measure/comm.py for the method):
  * p2p: gRPC transfers between two local tf.distribute.Server processes over 127.0.0.1;
  * all-reduce: CollectiveReduceV2 over 4 virtual CPU devices in one session;
  * all-reduce: CollectiveReduceV2 over 2 server processes (gRPC), unless --no-processes;
sizes from 1 KiB doubling up to --cap (default 64 MiB). Fits a SegmentedLinear model to each series,
prints a table (measured vs fitted) and writes benchmarks/results/comm_local.json with the sizes,
medians, raw step/baseline medians, fitted segments, fit errors and the resulting CommModel for the
`local:4` topology.

Usage: python benchmarks/comm_profile.py [--cap 67108864] [--repeats 5] [--no-processes]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tag_tf.measure.comm import measure_allreduce, measure_p2p, sizes_up_to  # noqa: E402
from tag_tf.profile.comm import CommModel, SegmentedLinear  # noqa: E402
from tag_tf.runtime.cluster import LocalCluster  # noqa: E402
from tag_tf.topology.presets import local  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _human(n: int) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _series(name: str, samples, record) -> dict:
    fit = SegmentedLinear.fit(*zip(*samples))
    print(f"\n{name}: {fit.num_segments} segment(s), relative RMS fit error {fit.error:.1%}")
    print(f"  {'size':>8}  {'chain':>5}  {'measured':>11}  {'fitted':>11}  {'rel.err':>7}  {'GB/s':>6}")
    for (nbytes, t), raw in zip(samples, record):
        pred = fit.predict(nbytes)
        rel = (pred - t) / t if t > 0 else float("nan")
        rate = nbytes / t / 1e9 if t > 0 else float("inf")
        print(f"  {_human(nbytes):>8}  {raw['chain']:>5}  {t * 1e3:>8.3f} ms  {pred * 1e3:>8.3f} ms  "
              f"{rel:>+7.1%}  {rate:>6.2f}")
    for start, end, slope, intercept in fit.segments:
        lo = "-inf" if start == float("-inf") else _human(int(start))
        hi = "inf" if end == float("inf") else _human(int(end))
        bw = f"{1 / slope / 1e9:.2f} GB/s" if slope > 0 else "n/a"
        print(f"  segment [{lo}, {hi}): {intercept * 1e6:.1f} us + bytes / {bw}")
    return {"sizes": [s for s, _ in samples], "seconds": [t for _, t in samples], "raw": record,
            "fit": fit.to_dict()}


# Sizes whose measured and fitted times the RESULTS.md section shows (those the run measured).
SHOWN_SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)


def _describe(key: str) -> str:
    """A series key of comm_local.json in words."""
    if key == "p2p_grpc_2proc":
        return "p2p, gRPC between 2 server processes"
    m = re.fullmatch(r"allreduce_(\d+)dev_inproc", key)
    if m:
        return f"all-reduce, {m.group(1)} virtual CPU devices in one session"
    m = re.fullmatch(r"allreduce_(\d+)proc_grpc", key)
    if m:
        return f"all-reduce, {m.group(1)} server processes (gRPC)"
    return key


def _us(seconds: float) -> str:
    v = seconds * 1e6
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _ms(seconds: float) -> str:
    v = seconds * 1e3
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def render(data: dict) -> str:
    """RESULTS.md's communication section (everything after its heading) from comm_local.json alone."""
    from benchmarks.markdown import measured_when

    series = data["series"]
    used = {json.dumps(f, sort_keys=True) for group in ("p2p", "allreduce")
            for f in data.get("comm_model_local", {}).get(group, {}).values()}
    sizes = sorted({n for s in series.values() for n in s["sizes"]})
    host = data.get("host", {})
    lines = [f"MEASURED on this machine ({host.get('machine', 'cpu')}, {host.get('cpus', '?')} CPUs, no GPU); "
             f"{measured_when(data)}. Real TensorFlow transfers from {_human(sizes[0])} to {_human(sizes[-1])} "
             f"(sizes doubling), {data['repeats']} repeats each: {data['method']}. Each series is fitted by a continuous "
             "piecewise-linear model of time against bytes (`SegmentedLinear`); within a segment time = intercept + "
             "bytes / bandwidth (the first segment's intercept is the small-message latency; a later one is where "
             "its line meets zero bytes, and may be negative). For an all-reduce, bandwidth counts the reduced "
             "tensor's bytes. Series marked * are the ones the `local` topology's simulator uses.", "",
             "| series | sizes | intercept µs | bandwidth GB/s | fit error (relative RMS) |", "|---|---|---|---|---|"]
    for key, s in series.items():
        fit = s["fit"]
        lo, hi = fit.get("fit_range") or (min(s["sizes"]), max(s["sizes"]))
        edges = [lo, *fit["breakpoints"], hi]
        mark = "*" if json.dumps(fit, sort_keys=True) in used else ""
        for i, (slope, intercept) in enumerate(zip(fit["slopes"], fit["intercepts"])):
            bw = f"{1 / slope / 1e9:.2f}" if slope > 0 else "n/a"
            span = f"{_human(int(edges[i]))}–{_human(int(edges[i + 1]))}"
            name = f"{_describe(key)}{mark}" if i == 0 else ""
            err = f"{fit['error']:.1%}" if i == 0 else ""
            lines.append(f"| {name} | {span} | {_us(intercept)} | {bw} | {err} |")
    shown = [n for n in SHOWN_SIZES if n in sizes] or sizes[:: max(1, len(sizes) // 4)]
    lines += ["", "Measured (fitted) time per transfer or all-reduce, ms:", "",
              "| size | " + " | ".join(_describe(k) for k in series) + " |", "|---" * (len(series) + 1) + "|"]
    for n in shown:
        cells = []
        for s in series.values():
            if n not in s["sizes"]:
                cells.append("-")
                continue
            t = s["seconds"][s["sizes"].index(n)]
            cells.append(f"{_ms(t)} ({_ms(SegmentedLinear.from_dict(s['fit']).predict(n))})")
        lines.append(f"| {_human(n)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=int, default=64 << 20, help="largest size in bytes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--devices", type=int, default=4, help="virtual CPU devices for all-reduce")
    ap.add_argument("--no-processes", action="store_true", help="skip the 2-process all-reduce")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "comm_local.json"))
    args = ap.parse_args()
    sizes = sizes_up_to(args.cap)
    started = time.time()
    results: dict = {}

    rec_ar: list = []
    ar = measure_allreduce(args.devices, sizes, repeats=args.repeats, record=rec_ar)
    rec_p2p: list = []
    rec_ar2: list = []
    with LocalCluster(2) as cluster:
        p2p = measure_p2p(sizes, repeats=args.repeats, cluster=cluster, record=rec_p2p)
        if not args.no_processes:
            ar2 = measure_allreduce(2, sizes, processes=True, repeats=args.repeats,
                                    cluster=cluster, record=rec_ar2)

    results["p2p_grpc_2proc"] = _series("p2p, gRPC between 2 server processes", p2p, rec_p2p)
    results[f"allreduce_{args.devices}dev_inproc"] = _series(
        f"all-reduce, {args.devices} virtual CPU devices in one session", ar, rec_ar)
    if not args.no_processes:
        results["allreduce_2proc_grpc"] = _series("all-reduce, 2 server processes (gRPC)", ar2,
                                                  rec_ar2)

    topo = local(args.devices)
    model = CommModel.from_measurements(topo, p2p=p2p, allreduce={args.devices: ar})
    sys.path.insert(0, os.path.dirname(HERE))
    from benchmarks.markdown import stamp

    doc = stamp({
        "benchmark": "comm_profile",
        "host": {"machine": platform.machine(), "python": platform.python_version(),
                 "cpus": os.cpu_count()},
        "repeats": args.repeats,
        "method": "median of repeats after 1 warm-up, minus the median of a baseline step with the "
                  "same participants and no transfer, divided by the chain length",
        "elapsed_s": round(time.time() - started, 1),
        "series": results,
        "comm_model_local": model.to_dict(),
    })     # with the date and code, which the RESULTS.md section states (render)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nwrote {args.out} ({doc['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
