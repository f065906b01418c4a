"""RESULTS.md's step-time studies: the side-by-side runs kept beside the main step-time table, each
rendered from its own JSON (benchmarks/report.py's `step-time-studies` section).

- results/step_time_between.json: between-graph execution against the chief-driven step it replaced
  (`step_time.py --configs tag-horovod-2proc-tfconfig,tag-horovod-2proc-chiefdriven,mwms-2proc,horovod-2proc
  --breakdown`);
- results/remote_step.json: what a client-driven step that spans processes costs (`remote_step.py`);
- results/step_time_cnn_steady.json: the cnn's two-process rows in steady state (300 steps after 20);
- results/step_time_predict_steady.json: the local machine model's predictions of steady-state rows;
- results/step_time_before.json: two-process rows with their traced breakdown, measured on the
  compiler before whole-batch shapes came from a shard (the run after it is in git history).
"""
from __future__ import annotations

import json
import os
import statistics

from benchmarks.markdown import measured_when

BREAKDOWN = ("wall_ms", "compute", "collectives", "transfers", "idle")


def _load(results_dir: str, name: str) -> dict | None:
    path = os.path.join(results_dir, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _protocol(data: dict) -> str:
    return (f"global batch {data['batch']}, median of {data['steps']} steps after {data['warmup']} warm-up steps, "
            f"{data.get('repeats', 1)} round(s); {measured_when(data)}")


def _breakdown(row: dict) -> list[str]:
    b = row.get("breakdown") or {}
    return [f"{b[k]:.1f}" if k in b else "" for k in BREAKDOWN]


def _rounds(row: dict) -> str:
    rounds = row.get("round_medians_ms")
    return f" ({', '.join(f'{r:.2f}' for r in rounds)})" if rounds and len(rounds) > 1 else ""


def _rows_table(data: dict, label=lambda config: config) -> list[str]:
    lines = ["| model | configuration | median ms (rounds) | loopback kB/step | first step s | traced wall ms | compute | "
             "collectives | transfers | idle |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(data["rows"]):
        row, (model, config) = data["rows"][key], key.split("/")
        if "median_ms" not in row:
            lines.append(f"| {model} | {label(config)} | {row.get('error') or row.get('absent')} | | | | | | | |")
            continue
        lines.append(f"| {model} | {label(config)} | {row['median_ms']:.2f}{_rounds(row)} | "
                     f"{row.get('loopback_bytes_per_step', 0) / 1e3:.0f} | {row['first_step_s']:.1f} | "
                     + " | ".join(_breakdown(row)) + " |")
    return lines


def _ratio(data: dict, model: str, ours: str, peers: tuple[str, ...]) -> str | None:
    rows = data["rows"]
    mine = rows.get(f"{model}/{ours}", {}).get("median_ms")
    theirs = [(p, rows[f"{model}/{p}"]["median_ms"]) for p in peers if "median_ms" in rows.get(f"{model}/{p}", {})]
    if mine is None or not theirs:
        return None
    name, best = min(theirs, key=lambda pt: pt[1])
    return f"{model} {mine / best:.2f}x (against {name})"


def _between(data: dict) -> list[str]:
    labels = {"tag-horovod-2proc-chiefdriven": "tag horovod, the chief drives every step",
              "tag-horovod-2proc-tfconfig": "tag horovod, between-graph (every task drives its own part)"}
    models = sorted({k.split("/")[0] for k in data["rows"]})
    faster = [r for m in models if (r := _ratio(data, m, "tag-horovod-2proc-tfconfig", ("tag-horovod-2proc-chiefdriven",)))]
    peers = [r for m in models if (r := _ratio(data, m, "tag-horovod-2proc-tfconfig", ("mwms-2proc", "horovod-2proc")))]
    return ["### Between-graph execution against the chief-driven step (`results/step_time_between.json`, MEASURED)", "",
            "Two TF_CONFIG tasks on this machine. Chief-driven: the chief's session runs every step and calls the other "
            "task each step; between-graph (`tag_tf/compiler/localize.py`, what tag_tf runs under TF_CONFIG now): "
            "every task runs its own part and the tasks meet only in collectives, as under MultiWorkerMirroredStrategy "
            "and Horovod. Breakdown: one traced step of the chief, ms during which some op computes, runs a "
            f"collective (waiting for the peer included) or transfers, and idle = wall - busy; {_protocol(data)}.", "",
            *_rows_table(data, lambda c: labels.get(c, c)), "",
            "Step time of between-graph over chief-driven, same run: " + "; ".join(faster) + ". Step time of "
            "between-graph over the faster peer: " + "; ".join(peers) + "."]


def _remote(data: dict) -> list[str]:
    meaning = {"local": "every op on the chief's server",
               "remote-fed": "the reduce on the second process, its input fed inside RunGraph",
               "remote-pulled": "the reduce on the second process, its input pulled from the chief",
               "exchange-client": "each process sums its half, the chief adds (Send/Recv), one session drives both",
               "collective-client": "the same exchange as a CollectiveReduceV2, one session drives both",
               "collective-each": "each process drives its own half, only the collective crosses (as MWMS, Horovod)"}
    lines = ["### What a step that spans processes costs (`results/remote_step.json`, MEASURED)", "",
             f"A trivial step (a reduce over a fed {'x'.join(map(str, data['shape']))} batch), {data['steps']} steps "
             f"per layout, median of {len(data['rounds_ms'])} rounds, {data['cores']} cores ({data['cpu']}); "
             f"{measured_when(data)}.", "", "| layout | what runs where | ms per step |", "|---|---|---|"]
    for name, ms in data["median_ms"].items():
        lines.append(f"| {name} | {meaning.get(name, '')} | {ms:.2f} |")
    lines += ["", f"A client-driven step that spans processes costs {data['remote_over_local_ms']:.2f} ms more than one "
              f"on the chief alone, whichever way its input travels (pulled over fed: {data['pulled_over_fed_ms']:+.2f} "
              f"ms); every task driving its own part saves {data['between_graph_saves_ms']:.2f} ms of a data-parallel "
              f"step, and a plain Send/Recv exchange costs {data['exchange_under_collective_ms']:.2f} ms less than the "
              "collective for two processes. This is why tag_tf runs between-graph under TF_CONFIG."]
    return lines


def _steady(data: dict) -> list[str]:
    ratio = _ratio(data, "cnn", "tag-horovod-2proc-tfconfig", ("mwms-2proc", "horovod-2proc"))
    return ["### The cnn in steady state (`results/step_time_cnn_steady.json`, MEASURED)", "",
            "The main table's protocol includes the first steps, while gRPC channels and collectives warm up; the same "
            f"two-process configurations measured longer: {_protocol(data)}.", "", *_rows_table(data), "",
            f"Step time of tag_tf `horovod` over the faster peer: {ratio or 'n/a'}."]


def _predict_steady(data: dict) -> list[str]:
    pred = data["prediction"]
    names = (("local2", "one process"), ("2proc", "two processes"), ("all", "all"))
    errors = []
    for key in sorted(data["rows"]):
        row = data["rows"][key]
        if "predicted_ms" in row and "median_ms" in row:
            errors.append(abs(row["predicted_ms"] - row["median_ms"]) / row["median_ms"])
    worst = max(errors) if errors else None
    return ["### Predictions of steady-state rows (`results/step_time_predict_steady.json`, MEASURED vs predicted)", "",
            f"Every tag_tf configuration of the main table, {_protocol(data)}; each row predicted by the local machine "
            f"model, runtime {pred['runtime']}. MAPE: "
            + ", ".join(f"{label} {pred['mape'][k]:.1%} ({pred['rows'][k]} rows)" for k, label in names if k in pred["mape"])
            + (f"; the worst row {worst:.0%}, the median row {statistics.median(errors):.1%}." if errors else ".")]


def _before(data: dict) -> list[str]:
    return ["### Two-process rows on the compiler before whole-batch shapes came from a shard "
            "(`results/step_time_before.json`, MEASURED)", "",
            "With a dynamic batch, every layer-norm and mean gradient reads the shape of the whole batch; that compiler "
            "built it by gathering both replicas' activations only to read their shape (compare the loopback bytes "
            "with the main table's rows of the same configurations, measured on later code). "
            f"{_protocol(data)[0].upper()}{_protocol(data)[1:]}.", "", *_rows_table(data)]


def render(results_dir: str) -> str:
    """The studies section: one subsection per JSON present."""
    parts = []
    for name, fn in (("step_time_between.json", _between), ("remote_step.json", _remote),
                     ("step_time_cnn_steady.json", _steady), ("step_time_predict_steady.json", _predict_steady),
                     ("step_time_before.json", _before)):
        data = _load(results_dir, name)
        if data is not None:
            parts.append("\n".join(fn(data)))
    return "\n\n".join(parts) + "\n"
