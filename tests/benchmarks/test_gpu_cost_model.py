"""The GPU cost model's benchmark and measurement tool: figures from the shipped table, a GPU profile
that only covers kernels mixing with the model, and the tool's dry run on this machine's CPU."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from benchmarks import costmodel_gpu, gpu_ops

RESULTS = os.path.join(os.path.dirname(costmodel_gpu.__file__), "results", "costmodel_gpu.json")


@pytest.fixture(scope="module")
def cases():
    with open(costmodel_gpu.shared_path(), encoding="utf-8") as fh:
        return costmodel_gpu.Cases(json.load(fh)["ops"])


def test_the_shipped_figures_come_from_the_shipped_table(cases):
    from tag_tf.profile import kernels

    with open(RESULTS, encoding="utf-8") as fh:
        shipped = json.load(fh)
    table = kernels.default_table()
    assert shipped["table"] == json.loads(json.dumps(table.to_dict()))
    fresh = costmodel_gpu.evaluate(cases, table, loo=False)
    for key, mode in fresh["modes"].items():
        for which in ("new", "old"):
            for stat, value in mode[which].items():
                assert shipped["modes"][key][which][stat] == pytest.approx(value, rel=1e-9), (key, which, stat)
        # The kernel model beats the roofline it replaced in every math mode.
        assert mode["new"]["within_20pct"] > mode["old"]["within_20pct"]
        assert mode["new"]["max_off_x"] < mode["old"]["max_off_x"]
    assert "| tf32_on (tf32) | 32 |" in costmodel_gpu.render(shipped)


def test_a_fit_lowers_its_own_cost(cases):
    start = costmodel_gpu._start()
    use = np.ones(len(cases.ops), dtype=bool)
    fitted = costmodel_gpu.fit_mode(cases, "tf32_on", start, use, quick=True)
    from tag_tf.profile.kernels import MODES, KernelTable

    def within(params):
        model = costmodel_gpu._model(KernelTable({m: params for m in MODES}))
        total = cases.predict("tf32_on", model, harness=params)[1]
        return np.mean(np.abs(total / cases.measured("tf32_on", "fwd_bwd") - 1) <= 0.2)

    assert within(fitted) > within(start)


def test_the_measurement_tool_stores_kernel_profiles_the_simulator_mixes_with_the_model(tmp_path):
    from tag_tf.models import build_model
    from tag_tf.profile.costs import op_costs
    from tag_tf.profile.db import ProfileDB

    db = tmp_path / "db"
    assert gpu_ops.main(["--model", "cnn", "--tiny", "--device", "cpu", "--backend", "torch", "--repeats", "2",
                         "--warmup", "1", "--batch-sizes", "8,16", "--profile-db", str(db),
                         "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    g8, g16 = (build_model("cnn", batch_size=b, tiny=True).ir() for b in (8, 16))
    kernel_ops = [n for n in g8.order if g8.op(n).type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                                                           "MatMul")]
    assert report["kernels"] == len(kernel_ops) > 4 and report["fingerprint"] == g8.fingerprint
    stored = ProfileDB(str(db))
    prof = stored.get_op_profile(g8.fingerprint, "cpu", (8, 16))
    assert prof is not None and set(prof.op_names) == set(kernel_ops)
    assert (prof.times > 0).all() and prof.info["backend"] == "torch"
    # The same kernels measured on a GPU type: op costs take them from the profile, the rest from the model.
    as_gpu = type(prof)(**{**prof.__dict__, "device_type": "A10G"})
    names = list(g8.order)
    costs = op_costs(g8, g16, 8, 16, names, ("A10G",), profile=as_gpu)
    assert costs.source["A10G"].startswith(f"profile ({len(kernel_ops)} ops")
    assert "model (" in costs.source["A10G"] and costs.modes["A10G"]["matmul"] == "tf32"
    i = names.index(kernel_ops[0])
    assert costs.fixed[0, i] == prof.fixed[prof.index()[kernel_ops[0]]]


def test_the_tensorflow_backend_times_the_graph_s_own_kernels(tmp_path):
    backend = gpu_ops.backend_for("tensorflow", "cpu")
    report = gpu_ops.measure("cnn", (4, 8), tiny=True, backend=backend, repeats=1, warmup=0, progress=lambda s: None)
    assert report["backend"] == "tensorflow" and report["kernels"] > 4
    assert (report["profile"].times > 0).all()
