"""The GPU kernel model: math modes, GEMM views of real TensorFlow ops, waves, and its use in op costs."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tag_tf.ir import from_graph_def
from tag_tf.profile import kernels
from tag_tf.profile.costmodel import CostModel
from tag_tf.profile.costs import model_line
from tag_tf.profile.flops import KERNEL_FAMILIES, graph_work_detail
from tag_tf.topology.gpus import GPU_TYPES, gpu_type, type_from_device_name

tf1 = tf.compat.v1


def _graph(build):
    g = tf.Graph()
    with g.as_default():
        build()
    return from_graph_def(g.as_graph_def(), require_train_op=False, inputs=())


def _conv(n=8, h=28, cin=128, cout=256, k=3, stride=1, dtype=tf.float32):
    def build():
        x = tf1.placeholder(dtype, [n, h, h, cin], name="x")
        w = tf1.placeholder(dtype, [k, k, cin, cout], name="w")
        y = tf.nn.conv2d(x, w, strides=[1, stride, stride, 1], padding="SAME", name="fwd")
        tf.gradients(y, [x, w], grad_ys=tf1.placeholder(dtype, y.shape, name="dy"))
    return _graph(build)


def _matmul(m=512, k=256, n=1024, transpose_b=False, batch=(), dtype=tf.float32):
    def build():
        a = tf1.placeholder(dtype, [*batch, m, k], name="a")
        b = tf1.placeholder(dtype, [*batch, n, k] if transpose_b else [*batch, k, n], name="b")
        y = tf.linalg.matmul(a, b, transpose_b=transpose_b, name="fwd")
        tf.gradients(y, [a, b], grad_ys=tf1.placeholder(dtype, y.shape, name="dy"))
    return _graph(build)


def _views(g):
    names = [n for n in g.order if g.op(n).type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                                                      "MatMul", "BatchMatMulV2")]
    w = graph_work_detail(g, names)
    k = w.kernels
    return {g.op(n).type + ("" if not k.backward[i] or "Conv" in g.op(n).type else f":{i}"):
            (KERNEL_FAMILIES[k.family[i]], bool(k.backward[i]), int(k.batch[i]), int(k.m[i]), int(k.n[i]), int(k.k[i]))
            for i, n in enumerate(names)}, w


def test_convolution_gemm_views_in_all_three_directions():
    views, _ = _views(_conv(n=8, h=28, cin=128, cout=256))
    assert views["Conv2D"] == ("conv3x3", False, 1, 8 * 28 * 28, 256, 9 * 128)
    assert views["Conv2DBackpropInput"] == ("conv3x3", True, 1, 8 * 28 * 28, 128, 9 * 256)
    assert views["Conv2DBackpropFilter"] == ("conv3x3", True, 1, 9 * 128, 256, 8 * 28 * 28)
    assert _views(_conv(cin=128, k=1))[0]["Conv2D"][0] == "conv1x1"
    assert _views(_conv(cin=3, cout=64, k=7, stride=2))[0]["Conv2D"][0] == "conv_stem"
    assert _views(_conv(cin=64, cout=64, k=3, stride=2))[0]["Conv2D"][0] == "conv_stem"


def test_matmul_gemm_views_mark_gradients_transposes_and_batches():
    views, w = _views(_matmul(m=512, k=256, n=1024, transpose_b=True))
    fwd = views["MatMul"]
    assert fwd == ("mm", False, 1, 512, 1024, 256)
    grads = [v for key, v in views.items() if key != "MatMul"]
    assert sorted(v[3:] for v in grads) == sorted([(512, 256, 1024), (1024, 256, 512)])   # dA [m,k], dB [n,k]
    assert all(v[1] for v in grads) and w.kernels.transposed[0]
    views, _ = _views(_matmul(m=128, k=64, n=128, batch=(4, 8)))
    assert views["BatchMatMulV2"] == ("bmm", False, 32, 128, 128, 64)


def test_math_modes_follow_capability_dtype_and_the_tf32_switch():
    h100, v100 = gpu_type("H100"), gpu_type("V100-32GB")
    assert kernels.math_mode(h100, 4) == "tf32" and kernels.math_mode(h100, 4, tf32=False) == "fp32"
    assert kernels.math_mode(v100, 4) == "fp32" and kernels.math_mode(v100, 2) == "half"
    assert gpu_type("GTX1080Ti").rate("half") == gpu_type("GTX1080Ti").peak_flops   # no fast FP16 on GP102
    assert CostModel().math_modes("A100-40GB")["matmul"] == "tf32"
    assert CostModel(tf32=False).math_modes("A100-40GB")["conv"] == "fp32"
    assert CostModel().math_modes("cpu")["matmul"] == "fp32"


def test_tf32_speeds_up_big_matmuls_where_the_card_has_it_and_nowhere_else():
    _, w = _views(_matmul(m=8192, k=4096, n=8192))
    def total(model, dev):
        return float(model.times(w.flops, w.bytes, dev, w.classes, w.kernels).sum())
    on, off = CostModel(), CostModel(tf32=False)
    assert total(off, "H100") / total(on, "H100") > 4          # ~8x the rate, less what memory and waves keep
    assert total(off, "V100-32GB") == pytest.approx(total(on, "V100-32GB"))
    # Half precision: a bf16 graph runs on the tensor cores even where float32 cannot (V100).
    _, half = _views(_matmul(m=8192, k=4096, n=8192, dtype=tf.bfloat16))
    t_half = float(on.times(half.flops, half.bytes, "V100-32GB", half.classes, half.kernels).sum())
    assert t_half * 3 < total(on, "V100-32GB")
    # The CPU keeps its calibrated roofline: GEMM views change nothing there.
    assert total(on, "cpu") == pytest.approx(float(on.times(w.flops, w.bytes, "cpu", w.classes).sum()))


def test_fp32_on_cards_before_ampere_keeps_the_roofline_the_paper_s_testbed_fits():
    _, w = _views(_matmul(m=2048, k=1024, n=1024))
    _, half = _views(_matmul(m=2048, k=1024, n=1024, dtype=tf.bfloat16))
    assert not kernels.covered(w.kernels, gpu_type("V100-32GB")).any()
    assert kernels.covered(half.kernels, gpu_type("V100-32GB")).all()
    assert kernels.covered(w.kernels, gpu_type("A100-40GB")).all()
    assert kernels.covered(w.kernels, gpu_type("H100"), tf32=False).all()     # FP32 on Hopper: fitted there


def test_waves_fill_the_sms_and_time_never_drops_as_the_batch_grows():
    one_wave = kernels.waves(np.array([1.0]), np.array([128.0 * 132]), np.array([128.0]), np.array([4096.0]), 132)
    assert one_wave[0] == pytest.approx(1.0)
    # One 128x128 tile more than the SMs: a second, almost empty wave (smaller tiles recover some of it).
    assert kernels.waves(np.array([1.0]), np.array([128.0 * 133]), np.array([128.0]), np.array([64.0]), 132)[0] < 0.75
    times = []
    cm = CostModel()
    for n in (1, 2, 4, 8, 16, 32, 64):
        _, w = _views(_conv(n=n, h=14, cin=256, cout=256))
        times.append(float(cm.times(w.flops, w.bytes, "A100-40GB", w.classes, w.kernels).sum()))
    assert all(b >= a * 0.999 for a, b in zip(times, times[1:])), times


def test_winograd_only_where_cudnn_can_use_it():
    def eligible(mode="fp32", **kw):
        _, w = _views(_conv(**kw))
        e = kernels.winograd_eligible(w.kernels, mode)
        back = np.asarray(w.kernels.backward, bool)
        return bool(e[~back].all()), bool(e[back].all())          # (forward, both gradients)
    assert eligible(n=8, h=28, cin=512, cout=512) == (True, True)
    assert eligible(n=8, h=14, cin=512, cout=512) == (True, False)   # FP32 gradients want >= 28x28
    assert eligible(n=8, h=7, cin=512, cout=512) == (False, False)   # 7x7 outputs: tiles mostly padding
    assert eligible(n=96, h=56, cin=256, cout=256) == (False, True)  # a 308 MB input: over the workspace
    assert eligible(n=8, h=28, cin=64, cout=64) == (False, False)    # too few channels to pay for the transforms
    assert eligible(n=8, h=28, cin=512, cout=512, k=1) == (False, False)
    # tensor-core modes have no Winograd: the factor marks every wide 3x3 convolution
    assert eligible("tf32", n=8, h=7, cin=512, cout=512) == (True, True)
    assert eligible("half", n=96, h=56, cin=256, cout=256) == (True, True)
    assert eligible("tf32", n=8, h=28, cin=64, cout=64) == (False, False)


def test_single_op_timing_reads_about_the_larger_of_dispatch_and_kernels():
    k = np.array([10e-6, 100e-6, 1e-3])
    h = 100e-6
    assert np.allclose(kernels.timed(k, h, 1.0), k + h)
    near_max = kernels.timed(k, h, 16.0)
    assert np.all(near_max >= np.maximum(k, h)) and np.all(near_max <= np.maximum(k, h) * 2 ** (1 / 16) * (1 + 1e-9))
    assert np.allclose(kernels.untimed(kernels.timed(k, h, 4.0), h, 4.0), k)
    assert np.isnan(kernels.untimed(90e-6, h, 4.0))      # dispatch-bound: only a bound on the kernels


def test_a_matmul_s_output_write_adds_to_its_math():
    import dataclasses

    base = kernels.default_table().modes["tf32"]
    ideal = dataclasses.replace(base, eff={f: (1.0, 1.0) for f in kernels.FAMILIES}, k0=0.0, n0=0.0,
                                mem_eff=1.0, p_mm=16.0, ramp_s=0.0, transposed=1.0)
    table = kernels.KernelTable({m: ideal for m in kernels.MODES})
    g = _graph(lambda: tf.linalg.matmul(tf1.placeholder(tf.float32, [8192, 512]),
                                        tf1.placeholder(tf.float32, [512, 8192]), name="mm"))
    w = graph_work_detail(g, ["mm"])
    h100 = gpu_type("H100")
    t = float(kernels.kernel_times(w.kernels, w.flops, w.bytes, h100, table=table)[0][0])
    math_s = float(w.flops[0]) / h100.rate("tf32")          # 0.14 ms at the datasheet rate
    write_s = 8192 * 8192 * 4 / h100.mem_bandwidth          # 0.08 ms to write the 268 MB output
    assert t >= math_s + 0.9 * write_s                      # a max of the two would be ~math_s


def test_the_simulator_s_line_follows_the_kernel_model_between_batch_sizes_a_few_samples_apart():
    """The analysis' two batch sizes are often a few samples apart: the line through the model's
    times there must not turn a wave boundary into a slope (it would make the op flat or steep)."""
    graphs = {n: _conv(n=n, h=28, cin=256, cout=256) for n in (29, 32, 64)}
    names = [n for n in graphs[32].order if graphs[32].op(n).type.startswith("Conv2D")]
    works = {n: graph_work_detail(g, names) for n, g in graphs.items()}
    cm = CostModel()
    fixed, per = model_line(cm, works[29], works[32], 29, 32, "H100")
    np.testing.assert_allclose(fixed, cm.launch_times(works[32].classes, "H100"))
    t64 = cm.times(works[64].flops, works[64].bytes, "H100", works[64].classes, works[64].kernels)
    ratio = (fixed + per * 64) / t64
    assert ((ratio > 0.8) & (ratio < 1.2)).all(), ratio        # twice the batch: about twice the time
    # The plain line through the two points would extrapolate a wave step instead.
    t29, t32 = (cm.times(works[n].flops, works[n].bytes, "H100", works[n].classes, works[n].kernels) for n in (29, 32))
    naive = t32 + (t32 - t29) / 3 * 32
    assert (np.abs(naive / t64 - 1) > np.abs(ratio - 1)).any()


def test_a_matmul_the_table_was_not_fitted_on_matches_the_h100_s_measured_ceiling():
    """Held out: the shared file's 8192^3 matmul (its ceilings; not one of the 32 fitted ops), measured
    in every math mode on the same H100."""
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "data", "h100_ops.json")
    with open(path, encoding="utf-8") as fh:
        ceilings = json.load(fh)["ceilings"]
    for mode, key, dtype in (("fp32", "tf32_off", tf.float32), ("tf32", "tf32_on", tf.float32),
                             ("half", "amp_bf16", tf.bfloat16)):
        g = _graph(lambda dtype=dtype: tf.linalg.matmul(tf1.placeholder(dtype, [8192, 8192]),
                                                         tf1.placeholder(dtype, [8192, 8192]), name="mm"))
        w = graph_work_detail(g, ["mm"])
        t = float(CostModel(tf32=mode == "tf32").times(w.flops, w.bytes, "H100", w.classes, w.kernels)[0])
        measured = ceilings[key]["matmul_8192_ms"] * 1e-3
        # TF32 predicts this square, deep GEMM 1.32x slow: the fitted ops' reductions are shallow
        # (K = 512-4096), and their efficiency is what the table holds (RESULTS.md's GPU section).
        assert 0.8 < t / measured < 1.35, (mode, t, measured)


def test_float64_integers_and_empty_products_keep_the_roofline():
    g = _graph(lambda: tf.linalg.matmul(tf1.placeholder(tf.float64, [512, 512]), tf1.placeholder(tf.float64, [512, 512]),
                                        name="mm"))
    w = graph_work_detail(g, ["mm"])
    assert w.kernels.family[0] > 0 and w.kernels.itemsize[0] == 8
    assert not kernels.covered(w.kernels, gpu_type("H100")).any()
    cm = CostModel()
    assert cm.times(w.flops, w.bytes, "H100", w.classes, w.kernels)[0] == cm.times(w.flops, w.bytes, "H100", w.classes)[0]
    _, half = _views(_matmul(m=512, k=256, n=512, dtype=tf.float16))
    assert not kernels.covered(half.kernels, gpu_type("P100")).any()          # no tensor cores
    assert not kernels.covered(half.kernels, gpu_type("GTX1080Ti")).any()


def test_the_gpu_types_users_own_are_known_with_their_rates():
    for name in ("L4", "A10G", "L40S", "RTX3090", "RTX4090", "A100-PCIe", "H100-PCIe", "H200"):
        t = GPU_TYPES[name]
        assert t.peak_flops > 0 and t.tf32_flops >= t.peak_flops and t.half_flops >= t.tf32_flops
        assert t.sm_count > 0 and t.capability >= 8.0 and t.source
    for cuda_name, expected in (("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 80GB HBM3", "H100"),
                                ("NVIDIA A100 80GB PCIe", "A100-PCIe"), ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
                                ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA GeForce RTX 3090", "RTX3090"),
                                ("NVIDIA A10G", "A10G"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"),
                                ("NVIDIA H200", "H200"), ("Tesla T4", "T4"), ("Quadro RTX 4000", None),
                                ("NVIDIA A100-PCIE-40GB", "A100-40GB"), ("NVIDIA GH200 480GB", None)):
        assert type_from_device_name(cuda_name) == expected, cuda_name
