"""`tag-tf calibrate`: fit the simulator's physical parameters to measured per-iteration times.

The measurements file (JSON, format "tag_tf.measurements/1") lists figures — model, batch (default:
the model's), topology (a preset, a file, or a name from its `topologies` map), strategy (a
baseline: dp, dp-p, horovod, horovod-p), seconds, source — each with role "fit" or "held_out". Only
"fit" figures move the parameters; "held_out" ones are predicted with the result and reported
apart. `benchmarks/data/paper_measurements.json` holds the TAG paper's; a user's own few timed
steps of `dp` on their cluster fit the same way.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.errors import TagError
from tag_tf.search.registry import Names, fittable_baselines

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.search.calibration_fit import Case
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.spec import Topology

MEASUREMENTS_FORMAT = "tag_tf.measurements/1"
FITTABLE_STRATEGIES = Names(fittable_baselines)     # what the simulator can judge from a measured step
ROLES = ("fit", "held_out")


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the simulator's physical parameters to measured iteration times")
    p.add_argument("--against", required=True, help="measurements JSON (see benchmarks/data/paper_measurements.json)")
    p.add_argument("--out", required=True, help="where to write the calibration JSON")
    p.add_argument("--name", help="the calibration's name (default: from --out)")
    p.add_argument("--groups", type=int, default=60)
    p.add_argument("--budget-s", dest="budget", type=float,
                   help="end the fit after this many seconds with the best values found so far (default: no limit)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def load_measurements(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(topologies map, measurements), every field checked with a message naming it."""
    from tag_tf.datafiles import CALIBRATION_FILE_LIMIT, read_text

    if not os.path.exists(path):
        raise TagError(f"no such measurements file: {path}")
    try:
        data = json.loads(read_text(path, "a measurements file", CALIBRATION_FILE_LIMIT, TagError))
    except json.JSONDecodeError as e:
        raise TagError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != MEASUREMENTS_FORMAT:
        raise TagError(f"{path}: field 'format' must be {MEASUREMENTS_FORMAT!r}")
    rows = data.get("measurements")
    if not isinstance(rows, list) or not rows:
        raise TagError(f"{path}: field 'measurements' must be a non-empty list")
    seen = set()
    for i, row in enumerate(rows):
        where = f"{path}: measurements[{i}]"
        if not isinstance(row, dict):
            raise TagError(f"{where}: expected an object")
        for key in ("id", "model", "topology", "strategy", "seconds"):
            if key not in row:
                raise TagError(f"{where}: missing field {key!r}")
        if row["id"] in seen:
            raise TagError(f"{where}: duplicate id {row['id']!r}")
        seen.add(row["id"])
        seconds = row["seconds"]
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
            raise TagError(f"{where} ({row['id']}): field 'seconds' must be a positive number, got {seconds!r}")
        if row.get("role", "fit") not in ROLES:
            raise TagError(f"{where} ({row['id']}): field 'role' must be one of {', '.join(ROLES)}")
        if row["strategy"] not in FITTABLE_STRATEGIES:
            raise TagError(f"{where} ({row['id']}): strategy {row['strategy']!r} cannot be simulated for a "
                           f"fit (one of {', '.join(FITTABLE_STRATEGIES)})")
        if "batch" in row and (not isinstance(row["batch"], int) or row["batch"] < 1):
            raise TagError(f"{where} ({row['id']}): field 'batch' must be a positive integer")
    topologies = data.get("topologies") or {}
    if not isinstance(topologies, dict):
        raise TagError(f"{path}: field 'topologies' must map names to presets or topology objects")
    return topologies, rows


class CaseBuilder:
    """Analyses, topologies and nominal simulators, each built once."""

    def __init__(self, topologies: dict[str, Any], groups: int):
        self.topology_specs = topologies
        self.groups = groups
        self._analyses: dict[tuple[str, int | None], Analysis] = {}
        self._topologies: dict[str, Topology] = {}
        self._sims: dict[tuple[str, int | None, str], Simulator] = {}

    def topology(self, name: str) -> Topology:
        from tag_tf.topology.load import load_topology
        from tag_tf.topology.parse import topology_from_dict

        if name not in self._topologies:
            spec = self.topology_specs.get(name, name)
            self._topologies[name] = (topology_from_dict(spec, source=f"measurements topology {name!r}")
                                      if isinstance(spec, dict) else load_topology(spec))
        return self._topologies[name]

    def analysis(self, model: str, batch: int | None) -> Analysis:
        from tag_tf.context import Options, PassContext
        from tag_tf.frontend.loading import analysis_for, load

        key = (model, batch)
        if key not in self._analyses:
            args = argparse.Namespace(model=model, batch=batch, tiny=False, input_size=None, graph=None,
                                      groups=self.groups)
            ctx = PassContext(Options(num_groups=self.groups))
            self._analyses[key] = analysis_for(load(args, dropout=0.0), args, ctx)
        return self._analyses[key]

    def case(self, row: dict[str, Any]) -> Case:
        from tag_tf.search.calibration_fit import Case
        from tag_tf.search.registry import baseline
        from tag_tf.sim.simulator import Simulator

        batch = row.get("batch")
        key = (row["model"], batch, row["topology"])
        if key not in self._sims:
            self._sims[key] = Simulator(self.analysis(row["model"], batch), self.topology(row["topology"]),
                                        calibration=None)
        sim = self._sims[key]
        strategy = baseline(row["strategy"], sim.num_groups, sim.topology)
        return Case(row["id"], sim, strategy, float(row["seconds"]))


def free_parameters(cases: list[Case]) -> list[str]:
    """compute_eff per GPU type present in the fitted figures, and the shared physics."""
    types = sorted({d.type for c in cases for d in c.sim.topology.devices if d.type != "cpu"})
    multi_machine = any(c.sim.topology.num_machines > 1 for c in cases)
    multi_gpu = any(m.num_gpus > 1 for c in cases for m in c.sim.topology.machines)
    names = [f"compute_eff:{t}" for t in types] + ["op_overhead_s"]
    if multi_machine:
        names += ["inter_bw_eff", "inter_latency_s"]
    if multi_gpu:
        names += ["intra_bw_eff"]
    return names


def calibrate(path: str, name: str, groups: int = 60, progress: Callable[[int, float], None] | None = None,
              deadline: Deadline | None = None) -> dict[str, Any]:
    """Fit (until `deadline`, keeping the best values found), predict the held-out figures, and
    return the calibration plus its report."""
    from tag_tf.search.calibration_fit import fit_basins, simulate_cases
    from tag_tf.sim.calibration import REQUIRED, Calibration, parameter_of

    topologies, rows = load_measurements(path)
    builder = CaseBuilder(topologies, groups)
    fit_rows = [r for r in rows if r.get("role", "fit") == "fit"]
    held_rows = [r for r in rows if r.get("role", "fit") == "held_out"]
    if not fit_rows:
        raise TagError(f"{path}: no measurement has role 'fit'")
    fit_cases = [builder.case(r) for r in fit_rows]
    free = free_parameters(fit_cases)
    result, basins = fit_basins(fit_cases, free, _peak_flops(fit_cases, free), name=name, progress=progress,
                                deadline=deadline)
    values = dict(result.calibration.values)
    effs = [values[k] for k in free if k.startswith("compute_eff:")]
    # GPU types outside the fit (the cloud's T4, a user's new card) take the fitted types' typical
    # efficiency: the same TF kernels on another NVIDIA generation.
    values["compute_eff:*"] = float(np.exp(np.mean(np.log(effs)))) if effs else 1.0
    source = os.path.basename(path)
    provenance = {k: f"fitted to {len(fit_rows)} figures of {source}" for k in free}
    provenance["compute_eff:*"] = "derived: geometric mean of the fitted GPU types' compute_eff"
    for key in REQUIRED:
        if key not in values:      # e.g. inter-machine physics from single-machine figures
            values[key] = parameter_of(key).nominal
            provenance[key] = "datasheet (nominal): these figures cannot identify it"
    held_cases = [builder.case(r) for r in held_rows]
    calibration = Calibration(name, values, provenance)
    held_sim = simulate_cases(held_cases, calibration) if held_cases else []
    fitted = {c.label: {"measured_s": c.seconds, "simulated_s": result.simulated[c.label],
                        "error": result.residuals[c.label]} for c in fit_cases}
    held = {c.label: {"measured_s": c.seconds, "simulated_s": s, "error": s / c.seconds - 1}
            for c, s in zip(held_cases, held_sim)}
    nominal_sim = simulate_cases(fit_cases + held_cases, None)
    nominal = {c.label: {"simulated_s": s, "error": s / c.seconds - 1}
               for c, s in zip(fit_cases + held_cases, nominal_sim)}
    report = {"against": source, "fitted": fitted, "held_out": held, "nominal": nominal,
              "mape_fitted": _mape(fitted), "mape_held_out": _mape(held) if held else None,
              "iterations": result.iterations, "simulations": result.evaluations * len(fit_cases),
              "basins": basins,
              "free_parameters": free}
    return {"calibration": Calibration(name, values, provenance, report), "report": report}


def _peak_flops(cases: list[Case], free: list[str]) -> dict[str, float]:
    """Datasheet peak FLOP/s of every fitted GPU type (from the first topology that has it)."""
    out: dict[str, float] = {}
    for case in cases:
        for d in case.sim.topology.devices:
            if f"compute_eff:{d.type}" in free and d.type not in out:
                out[d.type] = float(case.sim.topology.gpu_type(d.type).peak_flops)
    return out


def _mape(rows: dict[str, dict[str, float]]) -> float:
    return float(np.mean([abs(r["error"]) for r in rows.values()])) if rows else 0.0


def run(args) -> int:
    name = args.name or os.path.splitext(os.path.basename(args.out))[0]
    if args.budget is not None and not args.budget > 0:
        raise TagError(f"--budget-s must be positive, got {args.budget}")
    out = calibrate(args.against, name, args.groups,
                    deadline=None if args.budget is None else Deadline.after(args.budget))
    calibration, report = out["calibration"], out["report"]
    calibration.save(args.out)
    if args.json:
        json.dump({"calibration": calibration.to_dict(), "out": args.out}, sys.stdout)
        print()
        return 0
    print(f"calibration {name!r} -> {args.out} (fitted to {len(report['fitted'])} figures of {report['against']}, "
          f"{report['iterations']} iterations; simulated)")
    for key, value in calibration.values.items():
        print(f"  {key:28s} {value:.4g}  ({calibration.provenance.get(key, '')})")
    for title, rows in (("fitted", report["fitted"]), ("held out", report["held_out"])):
        if rows:
            print(f"{title}: MAPE {_mape(rows) * 100:.1f}%")
            for label, r in rows.items():
                print(f"  {label:32s} measured {r['measured_s']:.4f} s  simulated {r['simulated_s']:.4f} s  "
                      f"{r['error'] * 100:+.1f}%")
    return 0
