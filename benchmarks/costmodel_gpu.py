"""The GPU cost model against a real H100: predicted vs measured single-op times, per math mode.

    .venv/bin/python benchmarks/costmodel_gpu.py [--fit] [--out benchmarks/results/costmodel_gpu.json]

Measurements: benchmarks/data/h100_ops.json, a copy of ../shared/gpu/h100_ops.json (the zoo models' largest matmuls and convolutions, tag_tf's
own shapes, timed on one H100 in PyTorch on cuBLAS/cuDNN: forward, and forward plus the gradients
tag_tf's graph computes; "tf32_off" = FP32, "tf32_on" = TF32 tensor cores, TensorFlow's default on
Ampere and Hopper; "amp_bf16" = bfloat16 inputs). For every op this builds the TensorFlow graph of the
op and its gradients at those shapes (NHWC, as the zoo runs them), imports it into tag_tf's IR and
predicts each kernel with the cost model on an H100 -- the same path `simulate` takes:

* `new`: the kernel model (tag_tf/profile/kernels.py) with the shipped table;
* `old`: the plain roofline (datasheet FP32 peak x class efficiency), what tag_tf used before;
* `loo`: the kernel model re-fitted without the op it predicts (leave-one-op-out: how it does on a
  shape it was not fitted on).

`--fit` re-fits the table on all ops and writes tag_tf/profile/data/gpu_kernels.json first. The fit:
per math mode, coordinate descent over the mode's parameters (log-spaced grids within physical bounds:
no kernel family above its datasheet rate except through the Winograd gain, no matmul family above the
card's measured 8192^3 matmul rate in that mode), then Nelder-Mead in log
space, then coordinate descent again, minimising a robust cost of the log errors of forward+backward
times plus a fifth of the forward ones (`_robust`), with a weak pull of mem_eff towards 0.8 and of
the transposed and Winograd factors towards 1. Writes
benchmarks/results/costmodel_gpu.json; RESULTS.md's "GPU cost model" section renders it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

# A copy of ../shared/gpu/h100_ops.json (the shared folder is not part of a clone).
SHARED = os.path.join(HERE, "data", "h100_ops.json")
MODES = {"tf32_off": "fp32", "tf32_on": "tf32", "amp_bf16": "half"}   # measurement key -> math mode
DEVICE = "H100"
_GRID = 48
_NM_ITERATIONS = 3000
_SCALE = math.log(1.2)
_BOUNDS = {"eff": (0.02, 1.0), "harness": (1e-6, 500e-6), "mem_eff": (0.3, 1.0), "k0": (1.0, 2048.0),
           "p": (1.0, 8.0), "p_mm": (1.0, 8.0), "harness_q": (1.0, 16.0), "ramp_s": (1e-7, 50e-6), "transposed": (0.2, 1.0), "n0": (0.5, 1024.0), "winograd": (0.5, 4.0),
           "convert": (0.01, 4.0)}


def shared_path() -> str:
    return os.environ.get("TAG_TF_H100_OPS", SHARED)


# ---------------------------------------------------------------------------------------------
# The ops as tag_tf sees them
# ---------------------------------------------------------------------------------------------
def op_graph(op: dict, dtype: str = "float32"):
    """(IR graph, forward kernel names, backward kernel names) of one measured op and its gradients."""
    import tensorflow as tf

    from tag_tf.ir import from_graph_def

    tf1 = tf.compat.v1
    s = op["spec"]
    dt = tf.bfloat16 if dtype == "bfloat16" else tf.float32
    g = tf.Graph()
    with g.as_default():
        if op["kind"] == "conv":
            x = tf1.placeholder(dt, [s["N"], s["H"], s["W"], s["Cin"]], name="x")
            w = tf1.placeholder(dt, [s["kh"], s["kw"], s["Cin"], s["Cout"]], name="w")
            y = tf.nn.conv2d(x, w, strides=[1, *s["stride"], 1], padding=s.get("padding", "SAME"),
                             dilations=[1, *s.get("dilation", [1, 1]), 1], name="fwd")
            wrt = [x, w] if s.get("grad_input", True) else [w]
        else:
            a = tf1.placeholder(dt, s["a_shape"], name="a")
            b = tf1.placeholder(dt, s["b_shape"], name="b")
            y = tf.linalg.matmul(a, b, transpose_a=s["transpose_a"], transpose_b=s["transpose_b"], name="fwd")
            wrt = [a, b]
        dy = tf1.placeholder(dt, y.shape, name="dy")
        tf.gradients(y, wrt, grad_ys=dy)
    ir = from_graph_def(g.as_graph_def(), require_train_op=False, inputs=())
    kinds = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul", "BatchMatMulV2", "BatchMatMul")
    fwd = [n for n in ir.order if ir.op(n).type in kinds and n.startswith("fwd")]
    bwd = [n for n in ir.order if ir.op(n).type in kinds and n.startswith("gradients")]
    if len(fwd) != 1 or not bwd:
        raise SystemExit(f"op {op['model']}/{op['id']}: expected one forward kernel and its gradients, got {fwd} {bwd}")
    return ir, fwd, bwd


class Cases:
    """Every op's kernels as one concatenated GraphWork per math mode, and the measured times."""

    def __init__(self, ops: list[dict], ceilings: dict | None = None):
        from tag_tf.profile.flops import graph_work_detail

        self.ops = ops
        self.ceilings = ceilings or {}
        self.works = {}
        self.owner = {}
        self.backward = {}
        for key, mode in MODES.items():
            parts, owner, back = [], [], []
            for i, op in enumerate(ops):
                ir, fwd, bwd = op_graph(op, "bfloat16" if mode == "half" else "float32")
                w = graph_work_detail(ir, fwd + bwd)
                parts.append(w)
                owner += [i] * (len(fwd) + len(bwd))
                back += [False] * len(fwd) + [True] * len(bwd)
            self.works[key] = _concat(parts)
            self.owner[key] = np.array(owner)
            self.backward[key] = np.array(back)

    def measured(self, key: str, part: str) -> np.ndarray:
        return np.array([op[key][f"{part}_ms"] * 1e-3 for op in self.ops])

    def predict(self, key: str, model, kernels: bool = True, harness=None) -> tuple[np.ndarray, np.ndarray]:
        """(forward, forward+backward) seconds per op under `model` (a CostModel); `kernels` False:
        the plain roofline (no GEMM views); `harness` (ModeParams) adds single-op timing's dispatch
        costs (see tag_tf/profile/kernels.py)."""
        from tag_tf.profile.kernels import timed

        w = self.works[key]
        t = model.times(w.flops, w.bytes, DEVICE, w.classes, w.kernels if kernels else None)
        owner, back = self.owner[key], self.backward[key]
        n = len(self.ops)
        fwd = np.bincount(owner[~back], weights=t[~back], minlength=n)
        bwd = np.bincount(owner[back], weights=t[back], minlength=n)
        if harness is not None:
            fwd_h, bwd_h = self.dispatch(harness)
            fwd, bwd = timed(fwd, fwd_h, harness.harness_q), timed(bwd, bwd_h, harness.harness_q)
        return fwd, fwd + bwd

    def dispatch(self, params) -> tuple[np.ndarray, np.ndarray]:
        """Single-op timing's dispatch per op (forward call, backward pass) under `params`."""
        bmm = np.array([bool(op["spec"].get("batch")) for op in self.ops]) * params.harness_bmm_s
        return params.harness_s[0] + bmm, params.harness_s[1] + bmm


def _concat(parts):
    from tag_tf.profile.flops import GraphWork, KernelShapes

    def cat(attr, sub=None):
        return np.concatenate([getattr(getattr(p, sub), attr) if sub else getattr(p, attr) for p in parts])

    kernels = KernelShapes(*(cat(f.name, "kernels") for f in dataclasses.fields(KernelShapes)))
    names = tuple(f"{i}:{n}" for i, p in enumerate(parts) for n in p.op_names)
    return GraphWork(names, cat("flops"), cat("bytes_read"), cat("bytes_written"), cat("classes"), kernels)


def _model(table=None, tf32: bool = True):
    from tag_tf.profile.costmodel import CostModel

    return CostModel(tf32=tf32, kernel_table=table)


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------
def _flat(params) -> dict[str, float]:
    from tag_tf.profile.kernels import FAMILIES

    out = {}
    for f in FAMILIES:
        out[f"eff:{f}:fwd"], out[f"eff:{f}:bwd"] = params.eff[f]
    out["harness:fwd"], out["harness:bwd"] = params.harness_s
    out["harness:bmm"] = params.harness_bmm_s
    for k in ("mem_eff", "k0", "p", "transposed", "n0", "convert"):
        out[k] = getattr(params, k)
    out["p_mm"] = params.p_mm or params.p
    out["harness_q"] = params.harness_q
    out["ramp_s"] = max(params.ramp_s, 1e-7)
    out["winograd:fwd"], out["winograd:bwd"] = params.winograd
    return out


def _unflat(v: dict[str, float]):
    from tag_tf.profile.kernels import FAMILIES, ModeParams

    return ModeParams(eff={f: (v[f"eff:{f}:fwd"], v[f"eff:{f}:bwd"]) for f in FAMILIES},
                      harness_s=(v["harness:fwd"], v["harness:bwd"]), harness_bmm_s=v["harness:bmm"],
                      mem_eff=v["mem_eff"], k0=v["k0"], p=v["p"], transposed=v["transposed"], n0=v["n0"],
                      winograd=(v["winograd:fwd"], v["winograd:bwd"]), convert=v["convert"], p_mm=v["p_mm"],
                      harness_q=v["harness_q"], ramp_s=v["ramp_s"])


def _nelder_mead(loss, values: dict[str, float], names: list[str], iterations: int, cap: float = 1.0
                 ) -> dict[str, float]:
    """Nelder-Mead over the log of `names` (within their bounds), from `values`: coordinate descent
    alone stalls where two parameters trade off (a dispatch cost against an efficiency)."""
    lo = np.log([_bounds(n, cap)[0] for n in names])
    hi = np.log([_bounds(n, cap)[1] for n in names])

    def f(x: np.ndarray) -> float:
        x = np.clip(x, lo, hi)
        return loss({**values, **{n: float(math.exp(v)) for n, v in zip(names, x)}})

    x0 = np.log([values[n] for n in names])
    dim = len(names)
    simplex = [x0] + [x0 + np.eye(dim)[i] * 0.3 for i in range(dim)]
    costs = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(costs)
        simplex = [simplex[i] for i in order]
        costs = [costs[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < costs[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], costs[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < costs[-2]:
            simplex[-1], costs[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < costs[-1]:
                simplex[-1], costs[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                costs = [costs[0]] + [f(x) for x in simplex[1:]]
    best = np.clip(simplex[int(np.argmin(costs))], lo, hi)
    return {n: float(math.exp(v)) for n, v in zip(names, best)}


def _robust(e: np.ndarray) -> np.ndarray:
    """A log error's cost: ~e^2 below 20%, levelling off beyond (one odd op does not drag the rest),
    and steep past 1.8x (no op may end up off by 2x)."""
    return e ** 2 / (e ** 2 + _SCALE ** 2) + 10.0 * np.maximum(np.abs(e) - math.log(1.8), 0.0) ** 2


def _bounds(name: str, cap: float = 1.0) -> tuple[float, float]:
    lo, hi = _BOUNDS[name.split(":")[0]]
    if name.startswith(("eff:mm:", "eff:bmm:")):
        hi = min(hi, cap)
    return lo, hi


def matmul_cap(cases: Cases, key: str) -> float:
    """The largest matmul efficiency the card showed in `key`'s math mode: its measured 8192^3 matmul
    rate over the datasheet rate (no GEMM family may beat what the card's best GEMM did)."""
    from tag_tf.topology.gpus import gpu_type

    measured = (cases.ceilings.get(key) or {}).get("matmul_tflops")
    return 1.0 if not measured else min(1.0, measured * 1e12 / gpu_type(DEVICE).rate(MODES[key]))


def fit_mode(cases: Cases, key: str, start, use: np.ndarray, quick: bool = False):
    """One mode's parameters fitted on the ops `use` (bool mask), from `start`; `quick` (the
    leave-one-out re-fits, which start from the full fit): shorter searches."""
    from tag_tf.profile.kernels import KERNEL_FAMILIES, KernelTable
    from tag_tf.profile.kernels import MODES as KMODES

    mode = MODES[key]
    meas_fwd, meas_all = cases.measured(key, "fwd"), cases.measured(key, "fwd_bwd")
    present = {KERNEL_FAMILIES[i] for i in np.unique(cases.works[key].kernels.family[np.isin(cases.owner[key],
                                                                                             np.flatnonzero(use))])}
    values = _flat(start)
    cap = matmul_cap(cases, key)
    for name in values:
        values[name] = min(max(values[name], _bounds(name, cap)[0]), _bounds(name, cap)[1])
    tf32 = mode == "tf32"

    def loss(v: dict[str, float]) -> float:
        params = _unflat(v)   # the ops of `key` all run in `mode`: the other modes' entries are unused
        fwd, total = cases.predict(key, _model(KernelTable({m: params for m in KMODES}), tf32=tf32), harness=params)
        err = _robust(np.log(total[use] / meas_all[use])) + 0.2 * _robust(np.log(fwd[use] / meas_fwd[use]))
        pull = sum(math.log(v[k]) ** 2 for k in ("transposed", "winograd:fwd", "winograd:bwd"))
        return float(err.sum() + 0.05 * math.log(v["mem_eff"] / 0.8) ** 2 + 0.05 * pull)

    names = [n for n in values if not (n.startswith("eff:") and n.split(":")[1] not in present)]

    def sweep(rounds: int) -> None:
        for _ in range(rounds):
            for name in names:
                lo, hi = _bounds(name, cap)
                best = (loss(values), values[name])
                for x in np.geomspace(lo, hi, _GRID):
                    cost = loss({**values, name: float(x)})
                    if cost < best[0]:
                        best = (cost, float(x))
                values[name] = best[1]

    def descend(v: dict[str, float]) -> dict[str, float]:
        values.clear()
        values.update(v)
        sweep(1 if quick else 3)
        values.update(_nelder_mead(loss, values, names, _NM_ITERATIONS // 4 if quick else _NM_ITERATIONS, cap))
        sweep(1 if quick else 2)
        return dict(values)

    # the dispatch's overlap with the kernels (harness_q) trades off against the small ops'
    # efficiencies: a full fit also starts from overlapping dispatch (q = 8), matmul loads that overlap
    # their math (p_mm = 8) and a ramp of 10 us per kernel, and keeps the fit with the lower loss
    starts = [dict(values)] + ([] if quick else [{**values, "harness_q": 8.0, "p_mm": 8.0, "ramp_s": 10e-6}])
    fits = [descend(v) for v in starts]
    return _unflat(min(fits, key=loss))


def _start():
    from tag_tf.profile.kernels import FAMILIES, ModeParams

    return ModeParams(eff={f: (0.6, 0.6) for f in FAMILIES}, harness_s=(1e-5, 1e-5), harness_bmm_s=1e-5,
                      mem_eff=0.8, k0=64.0, p=4.0, transposed=1.0, n0=1.0, winograd=(1.0, 1.0), convert=0.01,
                      p_mm=4.0, harness_q=4.0)


def fit_table(cases: Cases, use: np.ndarray | None = None, start_table=None):
    from tag_tf.profile.kernels import KernelTable

    use = np.ones(len(cases.ops), dtype=bool) if use is None else use
    modes = {}
    for key, mode in MODES.items():
        start = start_table.modes[mode] if start_table is not None else _start()
        modes[mode] = fit_mode(cases, key, start, use)
    return KernelTable(modes, {"fitted_on": os.path.basename(shared_path()), "device": DEVICE,
                               "by": "benchmarks/costmodel_gpu.py --fit"})


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def _stats(pred: np.ndarray, meas: np.ndarray) -> dict:
    ratio = pred / meas
    off = np.maximum(ratio, 1 / ratio)
    return {"n": int(len(meas)), "within_20pct": float(np.mean(np.abs(ratio - 1) <= 0.2)),
            "max_off_x": float(off.max()), "median_abs_err": float(np.median(np.abs(ratio - 1))),
            "geomean_ratio": float(np.exp(np.mean(np.log(ratio))))}


def evaluate(cases: Cases, table, loo: bool) -> dict:
    out: dict = {"modes": {}}
    for key, mode in MODES.items():
        tf32 = mode == "tf32"
        meas_fwd, meas_all = cases.measured(key, "fwd"), cases.measured(key, "fwd_bwd")
        harness = table.modes[mode]
        new_fwd, new_all = cases.predict(key, _model(table, tf32=tf32), harness=harness)
        old_all = cases.predict(key, _model(table, tf32=tf32), kernels=False)[1]
        rows = []
        loo_all = np.full(len(cases.ops), np.nan)
        if loo:
            for i in range(len(cases.ops)):
                use = np.ones(len(cases.ops), dtype=bool)
                use[i] = False
                from tag_tf.profile.kernels import KernelTable

                params = fit_mode(cases, key, table.modes[mode], use, quick=True)
                modes = dict(table.modes)
                modes[mode] = params
                loo_all[i] = cases.predict(key, _model(KernelTable(modes), tf32=tf32), harness=params)[1][i]
        for i, op in enumerate(cases.ops):
            rows.append({"model": op["model"], "id": op["id"], "kind": op["kind"], "fwd_op": op["fwd_op"],
                         "measured_fwd_ms": meas_fwd[i] * 1e3, "measured_fwd_bwd_ms": meas_all[i] * 1e3,
                         "new_fwd_ms": new_fwd[i] * 1e3, "new_fwd_bwd_ms": new_all[i] * 1e3,
                         "old_fwd_bwd_ms": old_all[i] * 1e3,
                         "loo_fwd_bwd_ms": None if math.isnan(loo_all[i]) else loo_all[i] * 1e3})
        out["modes"][key] = {"math_mode": mode, "new": _stats(new_all, meas_all), "old": _stats(old_all, meas_all),
                             "new_forward": _stats(new_fwd, meas_fwd),
                             "loo": _stats(loo_all, meas_all) if loo else None, "ops": rows}
    return out


# ---------------------------------------------------------------------------------------------
# Whole training steps on one H100
# ---------------------------------------------------------------------------------------------
PAPER_MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small", "bert-large")
ONE_H100 = {"name": "one-h100", "machines": [{"name": "h", "gpus": "1x h100"}]}


def _kernel_key(kernels, i: int) -> tuple:
    return (int(kernels.family[i]), bool(kernels.backward[i]), int(kernels.batch[i]), int(kernels.m[i]),
            int(kernels.n[i]), int(kernels.k[i]))


def measured_kernels(cases: Cases, table, key: str = "tf32_on") -> dict[tuple, float]:
    """Each measured op's kernels (GEMM-view key -> seconds): the forward kernel gets the measured
    forward time, the gradient kernels the measured backward time split as the model splits it, both
    less the single-op timing's dispatch (the fitted harness costs, `untimed`).

    A dispatch-bound timing says only that the kernels took at most that long: the model's time,
    capped there, stands in for it. Dispatch-bound: no longer than the fitted dispatch, or, in TF32,
    a phase the TF32 math should have sped up at least 2x (the model's FP32 and TF32 kernel times)
    that timed at least 3/4 of its FP32 timing: the GPU finished before the CPU had dispatched it
    (BERT-Large's 2048x1024x1024 matmul and gradients: 0.37 ms with TF32 on and off alike), and the
    session's dispatch is longer than the fitted one."""
    from tag_tf.profile.kernels import untimed

    mode = MODES[key]
    params = table.modes[mode]
    w = cases.works[key]
    t = _model(table, tf32=mode == "tf32").times(w.flops, w.bytes, DEVICE, w.classes, w.kernels)
    fp32_key = "tf32_off" if mode == "tf32" else None
    t_fp32 = None
    if fp32_key is not None:
        wf = cases.works[fp32_key]
        t_fp32 = _model(table, tf32=False).times(wf.flops, wf.bytes, DEVICE, wf.classes, wf.kernels)
    owner, back = cases.owner[key], cases.backward[key]
    out: dict[tuple, float] = {}
    fwd_h, bwd_h = cases.dispatch(params)
    for i, op in enumerate(cases.ops):
        rows = np.flatnonzero(owner == i)
        grads = rows[back[rows]]
        forward = rows[~back[rows]]
        phases = {}
        for phase, sel, dispatch in (("fwd", forward, fwd_h[i]), ("bwd", grads, bwd_h[i])):
            meas = op[key][f"{phase}_ms"] * 1e-3
            kernels_s = float(untimed(meas, dispatch, params.harness_q))
            if t_fp32 is not None and fp32_key in op and not math.isnan(kernels_s):
                fp32_meas = op[fp32_key][f"{phase}_ms"] * 1e-3
                if t[sel].sum() <= 0.5 * t_fp32[sel].sum() and meas >= 0.75 * fp32_meas:
                    kernels_s = math.nan
            phases[phase] = min(t[sel].sum(), meas) if math.isnan(kernels_s) else kernels_s
        for r in rows:
            share = phases["fwd"] if not back[r] else phases["bwd"] * t[r] / t[grads].sum()
            out[_kernel_key(w.kernels, r)] = share
    return out


def whole_steps(cases: Cases, table, models=PAPER_MODELS, progress=print) -> dict:
    """`simulate`'s one-H100 training step of each model at the zoo's batch size (data parallel on one
    device: the step itself): TF32 on (TensorFlow's default) and off with the kernel model, and the old
    roofline; and an estimate of what the H100 would measure: the TF32 prediction with every kernel
    whose shape was measured replaced by its measured time."""
    from tag_tf.analysis import analyze
    from tag_tf.analysis.simplify import training_ops
    from tag_tf.context import Options, PassContext
    from tag_tf.models import build_model
    from tag_tf.profile.costmodel import CostModel
    from tag_tf.profile.flops import graph_work_detail
    from tag_tf.profile.weights import reference_weights
    from tag_tf.search.registry import baseline
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    topo = load_topology(ONE_H100)
    measured = measured_kernels(cases, table)
    out = {}
    for name in models:
        t0 = time.perf_counter()
        model = build_model(name)
        ctx = PassContext(Options(num_groups=60))

        def rebuild(batch: int, name=name):
            return build_model(name, batch_size=batch).ir()

        analysis = analyze(ctx, model.ir(), rebuild=rebuild, batch_size=model.batch_size, weight_fn=reference_weights)
        row: dict = {"batch": model.batch_size}
        for label, cm in (("tf32", CostModel(tf32=True, kernel_table=table)),
                          ("fp32", CostModel(tf32=False, kernel_table=table)),
                          ("old", CostModel(kernel_model=False))):
            sim = Simulator(analysis, topo, cost_model=cm)
            row[f"{label}_step_s"] = sim.simulate(baseline("dp", sim.num_groups, topo)).iteration_time_s
        g = model.ir()
        train = training_ops(g)
        names = [n for n in g.order if n in train]
        w = graph_work_detail(g, names)
        cm = CostModel(tf32=True, kernel_table=table)
        t = cm.times(w.flops, w.bytes, DEVICE, w.classes, w.kernels)
        launch = cm.launch_times(w.classes, DEVICE)
        subst = t.copy()
        hit = np.zeros(len(names), dtype=bool)
        for i in np.flatnonzero(w.kernels.family > 0):
            key = _kernel_key(w.kernels, i)
            if key in measured:
                subst[i] = launch[i] + measured[key]
                hit[i] = True
        row.update({"kernels": int((w.kernels.family > 0).sum()), "kernels_measured": int(hit.sum()),
                    "predicted_share_measured": float(t[hit].sum() / t.sum()),
                    "kernel_share_of_step": float(t[w.kernels.family > 0].sum() / t.sum()),
                    "estimate_step_s": row["tf32_step_s"] * float(subst.sum() / t.sum())})
        row["tf32_over_estimate"] = row["tf32_step_s"] / row["estimate_step_s"]
        out[name] = row
        progress(f"{name}: batch {row['batch']}, TF32 {row['tf32_step_s'] * 1e3:.1f} ms, FP32 {row['fp32_step_s'] * 1e3:.1f} "
                 f"ms, old {row['old_step_s'] * 1e3:.1f} ms; with measured kernels {row['estimate_step_s'] * 1e3:.1f} ms "
                 f"({row['kernels_measured']}/{row['kernels']} kernels, {time.perf_counter() - t0:.0f} s)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true", help="re-fit tag_tf/profile/data/gpu_kernels.json first")
    ap.add_argument("--fresh", action="store_true", help="with --fit: start from neutral values, not the shipped table")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-op-out re-fits")
    ap.add_argument("--no-steps", action="store_true", help="skip the whole-step simulations of the paper models")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "costmodel_gpu.json"))
    args = ap.parse_args(argv)
    from benchmarks.markdown import stamp
    from tag_tf.profile import kernels

    t0 = time.perf_counter()
    with open(shared_path(), encoding="utf-8") as fh:
        shared = json.load(fh)
    cases = Cases(shared["ops"], shared.get("ceilings"))
    if args.fit:
        start = kernels.default_table() if os.path.exists(kernels.TABLE_PATH) and not args.fresh else None
        table = fit_table(cases, start_table=start)
        with open(kernels.TABLE_PATH, "w", encoding="utf-8") as fh:
            json.dump(table.to_dict(), fh, indent=1, sort_keys=True)
            fh.write("\n")
        kernels._TABLE = None
        print(f"wrote {kernels.TABLE_PATH}")
    table = kernels.default_table()
    result = evaluate(cases, table, loo=not args.no_loo)
    if not args.no_steps:
        result["whole_steps"] = whole_steps(cases, table)
    doc = stamp({"what": "GPU cost model vs single-op timings on a real H100 (MEASURED there; predictions made here)",
                 "measurements": os.path.basename(shared_path()), "measured_on": shared["environment"].get("device"),
                 "measured_date": "2026-11-26", "device_type": DEVICE, "table": table.to_dict(), **result,
                 "seconds": time.perf_counter() - t0})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    for key, m in doc["modes"].items():
        loo = m["loo"]
        print(f"{key:9s} new: {m['new']['within_20pct']:.0%} within 20%, worst {m['new']['max_off_x']:.2f}x | "
              f"old: {m['old']['within_20pct']:.0%}, worst {m['old']['max_off_x']:.2f}x"
              + (f" | leave-one-out: {loo['within_20pct']:.0%}, worst {loo['max_off_x']:.2f}x" if loo else ""))
    print(f"wrote {args.out} ({doc['seconds']:.0f} s)")
    return 0


def render(data: dict) -> str:
    """RESULTS.md's section (benchmarks/report.py)."""
    from benchmarks.markdown import measured_when

    lines = [f"Measured on a real {data['measured_on']} ({data['measurements']}, {data['measured_date']}, PyTorch on "
             f"cuBLAS/cuDNN); predictions {measured_when(data)}. Forward+backward time of each op "
             "(the forward kernel and the gradient kernels of tag_tf's graph, costed on an H100 as `simulate` costs "
             "them). `new`: the kernel model (math modes, waves of tiles, per-family efficiencies fitted on these ops); "
             "`leave-one-out`: re-fitted without the op it predicts; `old`: the FP32 roofline used before.", "",
             "| math mode | ops | new: within 20% | new: worst | leave-one-out: within 20% | leave-one-out: worst | "
             "old: within 20% | old: worst |", "|---|---|---|---|---|---|---|---|"]
    for key, m in data["modes"].items():
        loo = m.get("loo") or {}
        lines.append(f"| {key} ({m['math_mode']}) | {m['new']['n']} | {m['new']['within_20pct']:.0%} | "
                     f"{m['new']['max_off_x']:.2f}x | "
                     + (f"{loo['within_20pct']:.0%} | {loo['max_off_x']:.2f}x | " if loo else "n/a | n/a | ")
                     + f"{m['old']['within_20pct']:.0%} | {m['old']['max_off_x']:.2f}x |")
    lines += ["", "Per op, predicted / measured forward+backward (new model; leave-one-out in brackets):", "",
              "| op | kind | " + " | ".join(data["modes"]) + " |", "|---|---|" + "---|" * len(data["modes"])]
    keys = list(data["modes"])
    for i, op in enumerate(data["modes"][keys[0]]["ops"]):
        cells = []
        for key in keys:
            r = data["modes"][key]["ops"][i]
            loo = f" ({r['loo_fwd_bwd_ms'] / r['measured_fwd_bwd_ms']:.2f})" if r.get("loo_fwd_bwd_ms") else ""
            cells.append(f"{r['new_fwd_bwd_ms'] / r['measured_fwd_bwd_ms']:.2f}{loo}")
        lines.append(f"| {op['model']} `{'/'.join(op['fwd_op'].split('/')[-3:])}` | {op['kind']} | "
                     + " | ".join(cells) + " |")
    steps = data.get("whole_steps")
    if steps:
        lines += ["", "Whole training steps on one H100 (SIMULATED: `tag-tf simulate` physics, data parallel on one device, "
                  "the zoo's batch sizes and Adam). No whole step was measured on the H100; the estimate of what it would "
                  "measure is the TF32 prediction with every kernel whose shape was timed there replaced by its time "
                  "(less the timing harness's dispatch; a dispatch-bound timing -- no longer than the dispatch, or a TF32 "
                  "timing no faster than the same op's FP32 one where the math should have doubled its speed -- bounds the "
                  "kernels from above and only caps the model's time), so it is only as good as the coverage column, and "
                  "where the timed kernels are small (BERT-Large's: 2048 rows), the session's dispatch, longer than the "
                  "fitted one, still leaks into it:", "",
                  "| model | batch | TF32 (default) ms | FP32 ms | old roofline ms | estimate with measured kernels ms | "
                  "TF32 / estimate | kernels timed on the H100 | their share of the predicted step |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, r in steps.items():
            lines.append(f"| {name} | {r['batch']} | {r['tf32_step_s'] * 1e3:.1f} | {r['fp32_step_s'] * 1e3:.1f} | "
                         f"{r['old_step_s'] * 1e3:.1f} | {r['estimate_step_s'] * 1e3:.1f} | {r['tf32_over_estimate']:.2f} | "
                         f"{r['kernels_measured']} of {r['kernels']} | {r['predicted_share_measured']:.0%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
