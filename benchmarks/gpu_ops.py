"""Time a model's matmuls and convolutions on the GPU at hand and store them in the profile database.

    .venv/bin/python benchmarks/gpu_ops.py --model resnet101 [--tiny] [--batch-sizes 16,32]
        [--backend auto|tensorflow|torch] [--device cuda|cpu] [--repeats 20] [--warmup 5]
        [--profile-db PATH] [--json OUT] [--max-ops N]

For users with one card of each type: every matmul and 2-D convolution kernel of the training graph
(forward and gradients, at two batch sizes) is timed alone on this machine's GPU -- with TensorFlow
when it sees a GPU, else with PyTorch, which calls the same cuBLAS/cuDNN -- and stored as that GPU
type's op profile of the program (the key `tag-tf profile` uses: the IR fingerprint at the smaller
batch size). `tag-tf simulate` / `plan` / `distribute` then take those ops' times from the profile
("profile (N ops) + model (M ops)") and the kernel model for the rest, so the cost model is
calibrated for the cards of the cluster in minutes. The report prints each kernel's measured time
beside what the kernel model predicts (profile/kernels.py), which checks the model on this card.

Identical kernels (same type, shapes, attributes, dtype) are timed once. Each timing runs the kernel
`--inner` times back to back and divides (so the framework's per-call dispatch overlaps the GPU's
work, as it does inside a training step); times are medians of `--repeats` such timings after
`--warmup` calls (CUDA events around the PyTorch launches; with TensorFlow, wall clock around the
calls and one device sync). Kernels with EXPLICIT padding are left to the model. A profile stored
by `tag-tf profile` (every op of the graph) at the same key is not replaced without `--force`. A strided SAME convolution pads
asymmetrically in TensorFlow; PyTorch's gradient functions take symmetric padding, so its backprop
kernels are timed with the nearest symmetric padding (the same work within a row of pixels).
`--device cpu` with PyTorch is the dry run (what CI runs: the tool on a machine without a GPU).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

KERNEL_TYPES = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv2DBackpropInput",
                "Conv2DBackpropFilter")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel to time: its op type, input shapes (the data inputs that are tensors) and attributes."""

    op_type: str
    shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    attrs: tuple[tuple[str, object], ...]
    itemsize: int
    dtype: str = "float32"

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)


def kernels_of(graph, names) -> dict[str, Kernel]:
    """The timeable kernels among `names` of an IR graph (known static shapes only)."""
    out = {}
    for name in names:
        op = graph.op(name)
        if op.type not in KERNEL_TYPES or not op.outputs or op.outputs[0].shape is None:
            continue
        ins = [graph.op(r.op).outputs[r.index] for r in op.inputs]
        shapes = tuple(tuple(t.shape) if t.shape is not None else None for t in ins)
        if any(s is None or any(d < 0 for d in s) for s in shapes) or any(d < 0 for d in op.outputs[0].shape):
            continue
        if op.outputs[0].base_dtype not in ("float32", "float", "float16", "half", "bfloat16"):
            continue
        if graph.attr(name, "padding", None) in (b"EXPLICIT", "EXPLICIT"):
            continue
        keys = ("transpose_a", "transpose_b", "adj_x", "adj_y", "strides", "padding", "dilations", "data_format")
        attrs = []
        for k in keys:
            v = graph.attr(name, k, None)
            if v is not None:
                attrs.append((k, v.decode() if isinstance(v, bytes) else (tuple(v) if isinstance(v, (list, tuple)) else v)))
        dtype = {"float": "float32", "half": "float16"}.get(op.outputs[0].base_dtype, op.outputs[0].base_dtype)
        out[name] = Kernel(op.type, shapes, tuple(op.outputs[0].shape), tuple(attrs), int(op.outputs[0].itemsize), dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------
def _same_padding(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class TorchBackend:
    name = "torch"

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        torch.backends.cuda.matmul.allow_tf32 = True     # TensorFlow's default on Ampere and later
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    def device_name(self) -> str:
        if self.cuda:
            return self.torch.cuda.get_device_name(self.device)
        return "cpu"

    def _rand(self, shape, dtype: str):
        return self.torch.randn(*shape, device=self.device, dtype=getattr(self.torch, dtype))

    def runner(self, k: Kernel):
        torch = self.torch
        F = torch.nn.functional
        if k.op_type == "MatMul" or k.op_type.startswith("BatchMatMul"):
            a, b = (self._rand(s, k.dtype) for s in k.shapes[:2])
            ta = k.attr("transpose_a", False) or k.attr("adj_x", False)
            tb = k.attr("transpose_b", False) or k.attr("adj_y", False)
            a = a.transpose(-1, -2) if ta else a
            b = b.transpose(-1, -2) if tb else b
            return lambda: torch.matmul(a, b)
        fmt = k.attr("data_format", "NHWC")
        strides = tuple(k.attr("strides", (1, 1, 1, 1)))
        dil = tuple(k.attr("dilations", (1, 1, 1, 1)))
        sh, sw = (strides[2], strides[3]) if fmt == "NCHW" else (strides[1], strides[2])
        dh, dw = (dil[2], dil[3]) if fmt == "NCHW" else (dil[1], dil[2])

        def nchw(shape):
            return shape if fmt == "NCHW" else (shape[0], shape[3], shape[1], shape[2])

        if k.op_type == "Conv2D":
            x_shape, f_shape = nchw(k.shapes[0]), k.shapes[1]
        elif k.op_type == "Conv2DBackpropInput":
            x_shape, f_shape = nchw(k.out_shape), k.shapes[1]
        else:
            x_shape, f_shape = nchw(k.shapes[0]), k.out_shape
        kh, kw, cin, cout = f_shape
        w = self._rand((cout, cin, kh, kw), k.dtype)
        x = self._rand(x_shape, k.dtype)
        if k.attr("padding", "VALID") == "SAME":
            ph, pw = _same_padding(x_shape[2], kh, sh, dh), _same_padding(x_shape[3], kw, sw, dw)
        else:
            ph, pw = (0, 0), (0, 0)
        if k.op_type == "Conv2D":
            padded = F.pad(x, (pw[0], pw[1], ph[0], ph[1])) if (ph[0] != ph[1] or pw[0] != pw[1]) else x
            pad = 0 if padded is not x else (ph[0], pw[0])
            return lambda: F.conv2d(padded, w, stride=(sh, sw), padding=pad, dilation=(dh, dw))
        y = F.conv2d(x, w, stride=(sh, sw), padding=(ph[0], pw[0]), dilation=(dh, dw))
        dy = self._rand(tuple(y.shape), k.dtype)
        pad = (ph[0], pw[0])
        if k.op_type == "Conv2DBackpropInput":
            return lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride=(sh, sw), padding=pad, dilation=(dh, dw))
        return lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=(sh, sw), padding=pad, dilation=(dh, dw))

    def time(self, fn, repeats: int, warmup: int, inner: int = 10) -> float:
        torch = self.torch
        with torch.no_grad():
            for _ in range(warmup):
                fn()
            out = []
            if self.cuda:
                torch.cuda.synchronize(self.device)
                for _ in range(repeats):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(inner):
                        fn()
                    end.record()
                    end.synchronize()
                    out.append(start.elapsed_time(end) * 1e-3 / inner)
            else:
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        fn()
                    out.append((time.perf_counter() - t0) / inner)
        return statistics.median(out)


class TensorFlowBackend:
    name = "tensorflow"

    def __init__(self, device: str):
        import tensorflow as tf

        self.tf = tf
        self.device = "/GPU:0" if device == "cuda" else "/CPU:0"

    def device_name(self) -> str:
        if self.device == "/CPU:0":
            return "cpu"
        details = self.tf.config.experimental.get_device_details(self.tf.config.list_physical_devices("GPU")[0])
        return str(details.get("device_name", "GPU"))

    def runner(self, k: Kernel):
        tf = self.tf
        dtype = getattr(tf, k.dtype)
        with tf.device(self.device):
            tensors = [tf.random.normal(s, dtype=dtype) for s in k.shapes if len(s) > 1]
            raw = getattr(tf.raw_ops, k.op_type)
            attrs = {key: (list(v) if isinstance(v, tuple) else v) for key, v in k.attrs}
            if k.op_type == "BatchMatMulV3":
                attrs["Tout"] = dtype
            if k.op_type == "Conv2DBackpropInput":
                fn = tf.function(lambda: raw(input_sizes=tf.constant(k.out_shape), filter=tensors[0],
                                             out_backprop=tensors[1], **attrs))
            elif k.op_type == "Conv2DBackpropFilter":
                fn = tf.function(lambda: raw(input=tensors[0], filter_sizes=tf.constant(k.out_shape),
                                             out_backprop=tensors[1], **attrs))
            elif k.op_type == "Conv2D":
                fn = tf.function(lambda: raw(input=tensors[0], filter=tensors[1], **attrs))
            else:
                names = ("a", "b") if k.op_type == "MatMul" else ("x", "y")
                fn = tf.function(lambda: raw(**dict(zip(names, tensors)), **attrs))
        return fn

    def _sync(self, last) -> None:
        sync = getattr(getattr(self.tf.test, "experimental", None), "sync_devices", None)
        if sync is not None and self.device != "/CPU:0":
            sync()
        else:
            last.numpy()      # the CPU (and a TensorFlow without sync_devices): wait for the last result

    def time(self, fn, repeats: int, warmup: int, inner: int = 10) -> float:
        for _ in range(warmup):
            fn()
        self._sync(fn())
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                last = fn()
            self._sync(last)
            out.append((time.perf_counter() - t0) / inner)
        return statistics.median(out)


def backend_for(name: str, device: str):
    if name == "auto":
        import tensorflow as tf

        name = "tensorflow" if (device == "cuda" and tf.config.list_physical_devices("GPU")) else "torch"
    if name == "tensorflow":
        return TensorFlowBackend(device)
    return TorchBackend(device)


# ---------------------------------------------------------------------------------------------
# Measuring a model
# ---------------------------------------------------------------------------------------------
def measure(model_name: str, sizes: tuple[int, int], *, tiny: bool, backend, repeats: int, warmup: int,
            max_ops: int | None = None, inner: int = 10, progress=print) -> dict:
    """Time every GEMM-like kernel of the model at both batch sizes; returns the report (and the
    profile under "profile")."""
    from tag_tf.models import build_model
    from tag_tf.profile.costmodel import CostModel
    from tag_tf.profile.flops import graph_work_detail
    from tag_tf.profile.op_profile import OpProfile, fit_linear
    from tag_tf.topology.gpus import type_from_device_name

    graphs = [build_model(model_name, batch_size=b, tiny=tiny).ir() for b in sizes]
    fingerprint = graphs[0].fingerprint
    per_size = [kernels_of(g, g.order) for g in graphs]
    names = [n for n in per_size[0] if n in per_size[1]]
    if max_ops is not None:
        names = names[:max_ops]
    device_name = backend.device_name()
    device_type = "cpu" if device_name == "cpu" else type_from_device_name(device_name)
    if device_type is None:
        raise SystemExit(f"GPU {device_name!r} is not a type tag_tf knows (tag_tf.topology.gpus); add it there first")
    timed: dict[Kernel, float] = {}
    times = np.zeros((len(names), 2))
    t0 = time.perf_counter()
    for j, kernels in enumerate(per_size):
        for i, name in enumerate(names):
            k = kernels[name]
            if k not in timed:
                fn = backend.runner(k)
                produced = int(np.prod(tuple(fn().shape)))
                if produced != int(np.prod(k.out_shape)):
                    raise SystemExit(f"{name}: the {backend.name} stand-in made {produced} elements, the graph's "
                                     f"{k.op_type} makes {int(np.prod(k.out_shape))}")
                timed[k] = backend.time(fn, repeats, warmup, inner)
            times[i, j] = timed[k]
        progress(f"batch {sizes[j]}: {len(names)} kernels ({len(timed)} distinct so far), {time.perf_counter() - t0:.1f} s")
    fixed, per_sample = fit_linear(sizes, times)
    profile = OpProfile(device_type, tuple(names), fixed, per_sample, tuple(sizes), times,
                        np.full((2, 1, len(names)), np.nan), tuple(graphs[0].op(n).type for n in names),
                        repeats=repeats, fingerprint=fingerprint,
                        info={"measured_by": "benchmarks/gpu_ops.py", "backend": backend.name,
                              "device_name": device_name, "kernels_only": True})
    rows = []
    if device_type != "cpu":
        w = graph_work_detail(graphs[1], names)
        predicted = CostModel().times(w.flops, w.bytes, device_type, w.classes, w.kernels)
        rows = [{"op": n, "type": graphs[1].op(n).type, "measured_s": float(times[i, 1]),
                 "predicted_s": float(predicted[i])} for i, n in enumerate(names)]
    return {"model": model_name, "tiny": tiny, "batch_sizes": list(sizes), "device_name": device_name,
            "device_type": device_type, "backend": backend.name, "fingerprint": fingerprint, "kernels": len(names),
            "distinct_kernels": len(timed), "seconds": time.perf_counter() - t0, "rows": rows, "profile": profile}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch-sizes", default="16,32", help="two batch sizes (default 16,32)")
    ap.add_argument("--backend", choices=("auto", "tensorflow", "torch"), default="auto")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--inner", type=int, default=10, help="kernel runs per timing (default 10)")
    ap.add_argument("--force", action="store_true", help="replace a full profile stored at the same key")
    ap.add_argument("--max-ops", type=int, help="time only the first N kernels (a quick check)")
    ap.add_argument("--profile-db", help="profile database (default: tag-tf's)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    sizes = tuple(int(s) for s in args.batch_sizes.split(","))
    if len(sizes) != 2 or sizes[0] == sizes[1] or min(sizes) < 1:
        raise SystemExit(f"--batch-sizes needs two distinct positive sizes, got {args.batch_sizes!r}")
    from tag_tf.profile.db import ProfileDB, default_db_path

    backend = backend_for(args.backend, args.device)
    report = measure(args.model, (min(sizes), max(sizes)), tiny=args.tiny, backend=backend, repeats=args.repeats,
                     warmup=args.warmup, max_ops=args.max_ops, inner=args.inner)
    profile = report.pop("profile")
    if report["device_type"] == "cpu" and not args.profile_db:
        # A dry run: CPU kernel times would stand in for the local CPU's whole-graph profile.
        report["db"] = "(dry run on the CPU: not stored; give --profile-db to store it anyway)"
    else:
        db = ProfileDB(args.profile_db or default_db_path())
        stored = db.get_op_profile(profile.fingerprint, profile.device_type, profile.batch_sizes)
        if stored is not None and not stored.info.get("kernels_only") and not args.force:
            raise SystemExit(f"{db.op_profile_path(profile.fingerprint, profile.device_type, profile.batch_sizes)} holds "
                             "a profile of every op (`tag-tf profile`); not replaced by this kernels-only one "
                             "(--force replaces it)")
        report["db"] = db.put_op_profile(profile)
    ratios = [r["predicted_s"] / r["measured_s"] for r in report["rows"] if r["measured_s"] > 0]
    if ratios:
        report["kernel_model_vs_measured"] = {"median_ratio": statistics.median(ratios),
                                              "within_20pct": float(np.mean([abs(x - 1) <= 0.2 for x in ratios]))}
    print(f"{report['kernels']} kernels of {args.model} ({report['distinct_kernels']} distinct) timed on "
          f"{report['device_name']} ({report['device_type']}) with {report['backend']} in {report['seconds']:.1f} s; "
          f"stored as {report['db']}")
    if ratios:
        print(f"kernel model / measured: median {report['kernel_model_vs_measured']['median_ratio']:.2f}, "
              f"{report['kernel_model_vs_measured']['within_20pct']:.0%} within 20%")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
