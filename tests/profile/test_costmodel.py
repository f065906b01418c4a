"""Analytical cost model: device ordering, batch monotonicity, calibration, and op_costs mixing."""
from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tag_tf.errors import ProfileError
from tag_tf.ir import from_graph_def
from tag_tf.models import build_model
from tag_tf.profile.costmodel import DEFAULT_GPU_CONSTANTS, CostModel, CostModelConstants, calibrate, load_constants
from tag_tf.profile.costs import OpCosts, model_line, op_costs
from tag_tf.profile.flops import CLASS_INDEX, OP_CLASSES, OpWork, graph_work_detail
from tag_tf.profile.op_profile import OpProfile
from tag_tf.topology.gpus import GPU_TYPES, gpu_type

BIG_MATMUL = OpWork(2.0 * 8192 ** 3, 2 * 4.0 * 8192 ** 2, 4.0 * 8192 ** 2, "matmul")


@pytest.fixture(scope="module")
def mlp_graphs():
    return {b: from_graph_def(build_model("mlp", tiny=True, batch_size=b).graph_def) for b in (2, 4, 8, 32)}


def _cpu_constants(**kw) -> CostModelConstants:
    base = dict(device="cpu", compute_eff={c: 0.5 for c in OP_CLASSES}, mem_eff={c: 0.5 for c in OP_CLASSES},
                launch_overhead_s=2e-6, host_overhead_s=5e-7, calibrated=True)
    base.update(kw)
    return CostModelConstants(**base)


def test_device_ordering_on_a_large_matmul():
    for model in (CostModel(), CostModel(_cpu_constants())):
        t = {name: model.op_time(BIG_MATMUL, gpu_type(name)) for name in ("H100", "V100-32GB", "T4")}
        assert t["H100"] < t["V100-32GB"] < t["T4"]
        # Compute-bound: roughly flops / (peak * efficiency).
        v100 = gpu_type("V100-32GB")
        assert t["V100-32GB"] == pytest.approx(BIG_MATMUL.flops / (v100.peak_flops * 0.7), rel=0.01)
    # Names work as well as GpuType objects.
    assert CostModel().op_time(BIG_MATMUL, "v100") == CostModel().op_time(BIG_MATMUL, gpu_type("V100-32GB"))


def test_monotone_in_batch_size(mlp_graphs):
    names = list(mlp_graphs[2].order)
    model = CostModel()
    for device in ("V100-32GB", "T4", "cpu"):
        prev = None
        for b in sorted(mlp_graphs):
            w = graph_work_detail(mlp_graphs[b], names)
            t = model.times(w.flops, w.bytes, device, w.classes)
            assert (t > 0).all()
            if prev is not None:
                assert (t >= prev - 1e-15).all()
            prev = t


def test_vectorised_times_match_op_time_and_classes():
    works = [OpWork(1e9, 1e6, 1e6, "matmul"), OpWork(1e6, 4e8, 4e8, "elementwise"),
             OpWork(0.0, 0.0, 0.0, "none"), OpWork(5e7, 1e7, 1e5, "reduction")]
    model = CostModel()
    t = model.times(np.array([w.flops for w in works]), np.array([w.bytes for w in works]), "A100-40GB",
                    [w.op_class for w in works])
    for w, ti in zip(works, t):
        assert model.op_time(w, "A100-40GB") == pytest.approx(ti)
    launch, host = model.overheads("A100-40GB")
    assert t[2] == host and launch == gpu_type("A100-40GB").launch_overhead_s
    # Memory-bound element-wise op: bytes / (bandwidth * mem efficiency) + launch.
    a100 = gpu_type("A100-40GB")
    assert t[1] == pytest.approx(launch + 8e8 / (a100.mem_bandwidth * DEFAULT_GPU_CONSTANTS.mem_eff["elementwise"]))


def test_constants_lookup_and_round_trip(tmp_path):
    cpu = _cpu_constants(class_overhead_s={"conv": 1e-4})
    v100 = dataclasses.replace(_cpu_constants(), device="V100-32GB")
    model = CostModel([cpu, v100])
    assert model.constants_for("cpu") is cpu
    assert model.constants_for("V100-32GB") is v100
    assert model.constants_for("H100") is v100          # a calibrated GPU beats the datasheet priors
    assert CostModel([cpu]).constants_for("H100") is DEFAULT_GPU_CONSTANTS   # the CPU's never transfer
    conv = OpWork(0.0, 0.0, 0.0, "conv")
    assert model.op_time(conv, "cpu") == pytest.approx(1e-4)
    assert model.op_time(conv, "V100-32GB") == pytest.approx(2e-6)
    again = CostModelConstants.from_dict(cpu.to_dict())
    assert again.to_dict() == cpu.to_dict()
    path = tmp_path / "c.json"
    import json
    path.write_text(json.dumps({"constants": [cpu.to_dict(), DEFAULT_GPU_CONSTANTS.to_dict()]}))
    loaded = load_constants(str(path))
    assert [c.device for c in loaded] == ["cpu", "datasheet"]
    with pytest.raises(ValueError):
        CostModelConstants("x", {"matmul": 1.0}, DEFAULT_GPU_CONSTANTS.mem_eff)


def _synthetic(truth: CostModelConstants, n: int, rng: np.random.Generator, noise: float):
    cls = rng.integers(0, len(OP_CLASSES), n)
    flops = 10 ** rng.uniform(2, 10, n)
    intensity = 10 ** rng.uniform(-2, 2, n)             # flops per byte, memory- to compute-bound
    nbytes = flops / intensity
    none = cls == CLASS_INDEX["none"]
    flops[none] = 0
    nbytes[none] = 0
    t = CostModel(truth).times(flops, nbytes, "cpu", cls) * np.exp(rng.normal(0, noise, n))
    return t, (flops, nbytes, cls)


def test_calibrate_recovers_synthetic_constants():
    rng = np.random.default_rng(1)
    truth = _cpu_constants(compute_eff={c: v for c, v in zip(OP_CLASSES, (0.8, 0.4, 0.1, 0.2, 0.3, 0.15, 1))},
                           mem_eff={c: v for c, v in zip(OP_CLASSES, (0.5, 0.6, 0.9, 0.7, 0.4, 0.8, 1))},
                           launch_overhead_s=3e-6, host_overhead_s=4e-7)
    t, works = _synthetic(truth, 4000, rng, noise=0.05)
    fitted = calibrate(t, works, "cpu", reg=0.0)     # plain least squares: the search itself
    assert fitted.calibrated and fitted.device == "cpu"
    for c in OP_CLASSES[:-1]:
        assert fitted.compute_eff[c] == pytest.approx(truth.compute_eff[c], rel=0.25), c
        assert fitted.mem_eff[c] == pytest.approx(truth.mem_eff[c], rel=0.25), c
        assert fitted.class_overhead_s[c] == pytest.approx(3e-6, rel=0.35), c
    assert fitted.host_overhead_s == pytest.approx(4e-7, rel=0.05)
    assert fitted.fit["median_ape"] < 0.1 and fitted.fit["log_corr"] > 0.99
    # The default regularisation still fits well; OpWork sequences are accepted too.
    ws = [OpWork(float(f), float(b), 0.0, OP_CLASSES[c]) for f, b, c in zip(*works)][:600]
    again = calibrate(t[:600], ws, gpu_type("cpu"))
    assert again.fit["log_corr"] > 0.95
    with pytest.raises(ValueError):
        calibrate([1e-6], [OpWork(1, 1, 1)], "cpu")


def _fake_profile(graph, names, absorbed=()) -> OpProfile:
    n = len(names)
    fixed = np.arange(1, n + 1) * 1e-6
    per = np.full(n, 1e-7)
    sizes = (2, 4)
    times = fixed[:, None] + per[:, None] * np.array(sizes)[None, :]
    return OpProfile(device_type="cpu", op_names=tuple(names), fixed=fixed, per_sample=per, batch_sizes=sizes,
                     times=times, raw=np.full((2, 1, n), np.nan), info={"absorbed": {a: names[0] for a in absorbed}})


def test_op_costs_mixes_profile_and_model(mlp_graphs):
    g4, g8 = mlp_graphs[4], mlp_graphs[8]
    names = [op.name for op in g4 if op.type in ("MatMul", "ResourceApplyAdam", "Relu", "BiasAdd", "Const")]
    measured = names[:-2]          # the last two are not in the profile...
    fused = names[-1]              # ...and one of them was fused into another kernel at run time
    prof = _fake_profile(g4, measured, absorbed=(fused,))
    model = CostModel()
    costs = op_costs(g4, g8, 4, 8, names, ("cpu", "V100-32GB", "t4"), profile=prof, model=model)
    assert isinstance(costs, OpCosts) and costs.fixed.shape == (3, len(names))
    cpu = costs.device_index("cpu")
    for i, name in enumerate(measured):
        assert costs.fixed[cpu, i] == prof.fixed[prof.index()[name]]
        assert costs.per_sample[cpu, i] == pytest.approx(1e-7)
    assert costs.fixed[cpu, -1] == 0 and costs.per_sample[cpu, -1] == 0          # fused: counted elsewhere
    w4, w8 = graph_work_detail(g4, names), graph_work_detail(g8, names)
    f_cpu, p_cpu = model_line(model, w4, w8, 4, 8, "cpu")
    assert costs.fixed[cpu, -2] == pytest.approx(f_cpu[-2])                    # not profiled: model
    assert "profile" in costs.source["cpu"] and "model (1 ops)" in costs.source["cpu"]
    for dt in ("V100-32GB", "t4"):
        d = costs.device_index(dt)
        f, p = model_line(model, w4, w8, 4, 8, dt)
        np.testing.assert_allclose(costs.fixed[d], f)
        np.testing.assert_allclose(costs.per_sample[d], p)
        assert costs.source[dt] == "model (datasheet defaults)"
    # The model's two-point line reproduces its own times at both batch sizes...
    v = costs.device_index("V100-32GB")
    t8 = model.times(w8.flops, w8.bytes, "V100-32GB", w8.classes, w8.kernels)
    np.testing.assert_allclose(costs.times("V100-32GB", 8), t8, rtol=1e-9)
    # ...batch-dependent ops get per_sample > 0, parameter updates 0.
    types = [g4.op(n).type for n in names]
    assert all(costs.per_sample[v, i] > 0 for i, t in enumerate(types) if t in ("MatMul", "Relu") and
               "gradients" not in names[i] and "_1" not in names[i])
    assert all(costs.per_sample[v, i] == 0 for i, t in enumerate(types) if t == "ResourceApplyAdam")
    assert (costs.fixed >= 0).all() and (costs.per_sample >= 0).all()
    assert costs.time(names[0], "cpu", 3) == pytest.approx(prof.fixed[0] + 3e-7)
    assert OpCosts.from_dict(costs.to_dict()).source == costs.source
    with pytest.raises(ProfileError):
        op_costs(g4, g8, 4, 4, names, ("cpu",))
    with pytest.raises(ProfileError):
        costs.device_index("P100")


def test_all_gpu_types_have_positive_times(mlp_graphs):
    g2, g32 = mlp_graphs[2], mlp_graphs[32]
    names = list(g2.order)
    costs = op_costs(g2, g32, 2, 32, names, tuple(GPU_TYPES))
    totals = {t: float(costs.times(t, 16).sum()) for t in GPU_TYPES}
    assert all(v > 0 for v in totals.values())
    assert totals["cpu"] > totals["V100-32GB"]
