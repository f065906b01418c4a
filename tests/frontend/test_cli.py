"""The `tag-tf` command line: JSON fields promised to users and one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tag_tf.frontend.cli import main


def run_json(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def test_analyze_json_fields(capsys):
    code, out, _ = run_json(capsys, "analyze", "--model", "cnn", "--tiny", "--groups", "8", "--json")
    assert code == 0
    for key in ("ops", "simplified_ops", "groups", "categories", "unclassified", "group_balance"):
        assert key in out
    assert set(out["categories"]) == {"concat", "sum", "other"}
    assert out["unclassified"] == [] and out["groups"] <= 8 and out["simplified_ops"] < out["ops"]


def test_analyze_own_graph_file(capsys, tmp_path):
    from tag_tf.models import build_model

    model = build_model("mlp", tiny=True, dynamic_batch=True)
    path = tmp_path / "mine.meta"
    path.write_bytes(model.meta_graph_def.SerializeToString())
    code, out, _ = run_json(capsys, "analyze", "--graph", str(path), "--batch", "16", "--json")
    assert code == 0 and out["dynamic_batch"] is True and out["batch_size"] == 16


@pytest.mark.parametrize("argv, message", [
    (["analyze", "--model", "resnet5000", "--json"], "resnet5000"),
    (["analyze", "--graph", "/nonexistent/g.pb", "--json"], "no such graph file"),
    (["simulate", "--model", "mlp", "--tiny", "--topology", "nowhere.yaml"], "nowhere.yaml"),
    (["verify", "--model", "mlp", "--tiny", "--devices", "3", "--processes", "2"], "multiple of --processes"),
    (["simulate", "--model", "mlp", "--tiny", "--topology", "local:2", "--fusion", "lots"], "--fusion 'lots'"),
])
def test_bad_input_exits_with_one_line(capsys, argv, message):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_graph_without_train_op(capsys, tmp_path):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.reduce_sum(tf.compat.v1.placeholder(tf.float32, [4, 2], name="x") * 2.0, name="out")
    path = tmp_path / "inference.pbtxt"
    tf.io.write_graph(g.as_graph_def(), str(tmp_path), "inference.pbtxt", as_text=True)
    code = main(["analyze", "--graph", str(path), "--json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "no train op" in err and len(err.splitlines()) == 1


def test_plan_then_simulate_the_plan(capsys, tmp_path):
    plan_file = tmp_path / "plan.json"
    code, out, _ = run_json(capsys, "plan", "--model", "mlp", "--tiny", "--batch", "32", "--topology", "testbed",
                            "--budget", "5", "--patience-s", "1", "--out", str(plan_file), "--json")
    assert code == 0 and out["simulated"] and out["speedup_vs_dp"] >= 1.0
    code, sim, _ = run_json(capsys, "simulate", "--model", "mlp", "--tiny", "--batch", "32", "--topology", "testbed",
                            "--strategy", str(plan_file), "--json")
    assert code == 0 and sim["iteration_time_s"] == pytest.approx(out["iteration_time_s"])
    for key in ("baselines", "best_baseline", "speedup_vs_best_baseline", "lower_bound_s"):
        assert key in out
    assert set(out["baselines"]) == {"dp", "dp-p", "horovod", "horovod-p", "heterog", "best-subset", "pipeline",
                                       "dp+sfb", "dp-p+sfb", "horovod+sfb", "horovod-p+sfb"}
    assert out["speedup_vs_best_subset"] >= 1.0 - 1e-9
    assert out["iteration_time_s"] <= min(out["baselines"].values()) and sim["lower_bound_s"] > 0
    assert 0 < out["lower_bound_s"] < out["split_floor_s"] == pytest.approx(sim["split_floor_s"])


def test_plan_with_and_without_sfb(capsys, tmp_path):
    """SFB after the search: the plan JSON lists each duplicated gradient's ops and predicted saving,
    the solver's time per gradient, and `dp+sfb` as a baseline; --no-sfb leaves the plan alone."""
    topo = tmp_path / "two.json"
    topo.write_text(json.dumps({"machines": [{"name": "a", "gpus": "1x V100-32GB"}, {"name": "b", "gpus": "1x V100-32GB"}],
                                "inter": {"switch": "10Gbps"}}))
    args = ("plan", "--model", "transformer", "--tiny", "--batch", "4", "--topology", str(topo), "--iterations", "30",
            "--budget", "20", "--json")
    code, on, err = run_json(capsys, *args)
    assert code == 0, err
    sfb = on["sfb"]
    assert sfb["enabled"] and sfb["solver"] == "SCIP" and sfb["kept"] <= sfb["proposed"] <= sfb["gradients"]
    assert sfb["after_s"] <= sfb["before_s"] and on["iteration_time_s"] == pytest.approx(sfb["after_s"])
    assert len(on["strategy"].get("sfb", [])) == sfb["kept"] and "solve_ms_per_gradient" in sfb
    assert on["baselines"]["dp+sfb"] < on["baselines"]["dp"]      # small batch, slow link: factors win
    code, dp_sfb, _ = run_json(capsys, "simulate", "--model", "transformer", "--tiny", "--batch", "4", "--topology",
                               str(topo), "--strategy", "dp+sfb", "--json")
    assert dp_sfb["iteration_time_s"] == pytest.approx(on["baselines"]["dp+sfb"])
    cut = dp_sfb["sfb"][0]
    assert cut["ops"] and cut["gradient"].endswith(":0") and cut["saving_s"] > 0
    code, off, _ = run_json(capsys, *args, "--no-sfb")
    assert code == 0 and off["sfb"] == {"enabled": False} and "sfb" not in off["strategy"]
    assert not [k for k in off["baselines"] if k.endswith("+sfb")]


def test_simulate_baselines_and_fusion_caps(capsys):
    args = ("simulate", "--model", "transformer", "--tiny", "--batch", "32", "--topology", "testbed", "--json")
    runs = {}
    for extra in (("--strategy", "dp"), ("--strategy", "horovod"), ("--strategy", "horovod", "--fusion", "none"),
                  ("--strategy", "dp", "--fusion", "1MiB"), ("--strategy", "dp", "--fusion", "auto"),
                  ("--strategy", "heterog")):
        code, out, err = run_json(capsys, *args, *extra)
        assert code == 0, err
        runs[extra] = out
    dp, hvd = runs[("--strategy", "dp")], runs[("--strategy", "horovod")]
    assert hvd["fusion_bytes"] == 64 * 2**20 and dp["fusion_bytes"] is None
    assert hvd["conversions"]["allreduce"] < dp["conversions"]["allreduce"] == dp["conversions"]["allreduce_tensors"]
    # Per-tensor Horovod is DP whose all-reduces overlap the backward pass (DP-NCCL's wait after it).
    assert runs[("--strategy", "horovod", "--fusion", "none")]["iteration_time_s"] < dp["iteration_time_s"]
    assert dp["sync_after_backward"] and not hvd["sync_after_backward"]
    assert runs[("--strategy", "dp", "--fusion", "1MiB")]["fusion_bytes"] == 2**20
    best = runs[("--strategy", "dp", "--fusion", "auto")]["iteration_time_s"]
    assert best <= min(dp["iteration_time_s"], hvd["iteration_time_s"])
    assert runs[("--strategy", "heterog")]["iteration_time_s"] <= hvd["iteration_time_s"]


def test_verify_json(capsys):
    code, out, _ = run_json(capsys, "verify", "--model", "mlp", "--tiny", "--devices", "3", "--strategy", "random",
                            "--steps", "2", "--seed", "4", "--shares", "1,2,1", "--json")
    assert code == 0
    for key in ("max_rel_diff", "steps", "devices", "ok"):
        assert key in out
    assert out["ok"] and out["devices"] == 3 and out["steps"] == 2
    assert 0.0 <= out["noise_floor"] < 1e-5 and out["tolerance"] >= 1e-4


def test_verify_refuses_what_cannot_fit_in_memory(capsys):
    """The full-size transformer (batch 64 x 256 tokens) needs tens of GiB: refused with the estimate
    before any session starts, not ended by the kernel's OOM killer."""
    from tag_tf.frontend.commands.verify import MEMORY_OVERHEAD, available_memory_bytes

    code = main(["verify", "--model", "transformer", "--devices", "2", "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert available_memory_bytes() < 40 * 2**30 * MEMORY_OVERHEAD, "this machine could run it: test needs a bigger model"
    assert code == 2 and len(err.splitlines()) == 1
    assert "needs about" in err and "GiB are available" in err and "--tiny" in err


def test_simulate_names_its_calibration(capsys, tmp_path):
    base = ["simulate", "--model", "cnn", "--tiny", "--batch", "64", "--strategy", "dp", "--json"]
    _, calibrated, _ = run_json(capsys, *base, "--topology", "testbed")
    _, nominal, _ = run_json(capsys, *base, "--topology", "testbed-nominal")
    _, explicit, _ = run_json(capsys, *base, "--topology", "testbed", "--calibration", "nominal")
    assert calibrated["calibration"] == "testbed" and nominal["calibration"] == explicit["calibration"] == "nominal"
    assert nominal["iteration_time_s"] == explicit["iteration_time_s"] != calibrated["iteration_time_s"]
    code = main(base + ["--topology", "testbed", "--calibration", str(tmp_path / "none.json")])
    assert code == 2 and "no such calibration file" in capsys.readouterr().err


def test_simulate_and_plan_name_the_math_mode_and_no_tf32_costs_fp32(capsys, tmp_path):
    import tensorflow as tf

    topo = tmp_path / "one.json"
    topo.write_text(json.dumps({"name": "one", "machines": [{"name": "h", "gpus": "1x a100"},
                                                            {"name": "v", "gpus": "1x v100"}],
                                "inter": {"switch": "100Gbps"}}))
    base = ["simulate", "--model", "cnn", "--tiny", "--batch", "64", "--strategy", "dp", "--json",
            "--topology", str(topo), "--no-profiles"]
    try:
        _, on, _ = run_json(capsys, *base)
        _, off, _ = run_json(capsys, *base, "--no-tf32")
        assert not tf.config.experimental.tensor_float_32_execution_enabled()     # acts on this process
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)
    assert on["math_modes"]["A100-40GB"]["matmul"] == "tf32" and on["math_modes"]["A100-40GB"]["elementwise"] == "fp32"
    assert on["math_modes"]["V100-32GB"]["conv"] == "fp32"                        # no TF32 before Ampere
    assert off["math_modes"]["A100-40GB"]["conv"] == "fp32"
    assert "tf32" in on["cost_sources"]["A100-40GB"] and "tf32" not in off["cost_sources"]["A100-40GB"]
    code, planned, err = run_json(capsys, "plan", "--model", "cnn", "--tiny", "--batch", "64", "--topology", str(topo),
                                  "--no-profiles", "--budget-s", "2", "--json")
    assert code == 0, err
    assert planned["math_modes"]["A100-40GB"]["matmul"] == "tf32"


def test_a_topology_s_own_gpu_type_simulates_with_its_own_numbers(capsys, tmp_path):
    def topo(**extra):
        path = tmp_path / f"custom{len(extra)}.json"
        kind = {"name": "RTX2080Ti", "peak_tflops": 13.4, "mem_bandwidth": "616GB/s", "memory": "11GiB", **extra}
        path.write_text(json.dumps({"name": "c", "machines": [{"name": "x", "gpus": "2x RTX2080Ti"}],
                                    "gpu_types": [kind]}))
        return str(path)
    base = ["simulate", "--model", "cnn", "--tiny", "--batch", "64", "--strategy", "dp", "--json", "--no-profiles"]
    code, plain, err = run_json(capsys, *base, "--topology", topo())
    assert code == 0, err
    assert plain["math_modes"]["RTX2080Ti"]["matmul"] == "fp32"
    _, faster, _ = run_json(capsys, *base, "--topology", topo(peak_tflops=26.8))   # twice the FP32 rate
    assert faster["iteration_time_s"] < plain["iteration_time_s"]
    _, ampere, _ = run_json(capsys, *base, "--topology", topo(tf32_tflops=100, capability=8.6, sm_count=68))
    assert ampere["math_modes"]["RTX2080Ti"]["conv"] == "tf32"


def test_calibrate_fits_and_reports_fitted_and_held_out_apart(capsys, tmp_path):
    """A user's own measurements: VGG-19 DP on two 1080 Ti machines (fit) and Horovod (held out)."""
    two = {"name": "two", "machines": [{"name": "a", "gpus": "1x GTX1080Ti", "intra": "pcie 15.75GB/s"},
                                       {"name": "b", "gpus": "1x GTX1080Ti", "intra": "pcie 15.75GB/s"}],
           "inter": {"switch": "100Gbps", "latency": "25us"}}
    rows = [{"id": f"dp/{b}", "model": "vgg19", "batch": b, "topology": "two", "strategy": "dp", "seconds": s,
             "role": "fit"} for b, s in ((4, 0.1195), (8, 0.15))]
    rows.append({"id": "hvd/4", "model": "vgg19", "batch": 4, "topology": "two", "strategy": "horovod",
                 "seconds": 0.11, "role": "held_out"})
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"format": "tag_tf.measurements/1", "topologies": {"two": two}, "measurements": rows}))
    out = tmp_path / "cal.json"
    code, result, _ = run_json(capsys, "calibrate", "--against", str(path), "--out", str(out), "--json")
    assert code == 0 and out.exists()
    cal = json.loads(out.read_text())
    fit = cal["fit"]
    assert set(fit["fitted"]) == {"dp/4", "dp/8"} and set(fit["held_out"]) == {"hvd/4"}
    nominal_mape = sum(abs(fit["nominal"][k]["error"]) for k in fit["fitted"]) / len(fit["fitted"])
    assert fit["mape_fitted"] < min(0.05, nominal_mape)
    assert "inter_bw_eff" in fit["free_parameters"] and "intra_bw_eff" not in fit["free_parameters"]
    assert cal["provenance"]["intra_bw_eff"].startswith("datasheet")
    # The result plugs into simulate.
    code, sim, _ = run_json(capsys, "simulate", "--model", "vgg19", "--batch", "32", "--topology", "testbed",
                            "--calibration", str(out), "--json")
    assert code == 0 and sim["calibration"] == "cal"


@pytest.mark.parametrize("row, message", [
    ({"model": "vgg19", "topology": "testbed", "strategy": "dp", "seconds": 1.0}, "missing field 'id'"),
    ({"id": "x", "model": "vgg19", "topology": "testbed", "strategy": "dp", "seconds": -1}, "'seconds' must be a positive"),
    ({"id": "x", "model": "vgg19", "topology": "testbed", "strategy": "auto", "seconds": 1.0}, "strategy 'auto' cannot be simulated"),
])
def test_calibrate_names_bad_measurements(capsys, tmp_path, row, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": "tag_tf.measurements/1", "measurements": [row]}))
    code = main(["calibrate", "--against", str(path), "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "measurements[0]" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


def test_a_planned_auto_is_the_plan_distribute_trains_with(capsys, tmp_path, monkeypatch):
    """`tag-tf plan` runs auto's search (one code path, planning.search) and caches its plan under
    auto's key: `resolve_strategy(..., "auto")` then reads that plan instead of searching again."""
    from tag_tf.context import Options, PassContext
    from tag_tf.frontend.loading import model_ir
    from tag_tf.frontend.planning import resolve_strategy
    from tag_tf.models import build_model
    from tag_tf.profile.weights import reference_weights
    from tag_tf.topology.load import load_topology

    monkeypatch.setenv("TAG_TF_CACHE_DIR", str(tmp_path))
    code, out, _ = run_json(capsys, "plan", "--model", "mlp", "--tiny", "--batch", "32", "--topology", "testbed",
                            "--budget", "3", "--groups", "8", "--json")
    assert code == 0 and out["plan_cache"] and out["plan_cache"].startswith(str(tmp_path))
    from tag_tf.analysis import analyze

    model = build_model("mlp", tiny=True, batch_size=32)
    analysis = analyze(PassContext(Options(num_groups=8)), model_ir(model),
                       rebuild=lambda b: model_ir(build_model("mlp", tiny=True, batch_size=b)),
                       weight_fn=reference_weights)
    plan = resolve_strategy(analysis, load_topology("testbed"), "auto", cache_dir=str(tmp_path),
                            planner=lambda *a: pytest.fail("auto searched again instead of reading the planned plan"))
    assert plan.cache_hit and plan.cache_path == out["plan_cache"]
    assert plan.strategy.to_dict()["groups"] == out["strategy"]["groups"]
    code, again, _ = run_json(capsys, "plan", "--model", "mlp", "--tiny", "--batch", "32", "--topology", "testbed",
                              "--budget", "3", "--groups", "8", "--search", "local", "--json")
    assert code == 0 and again["plan_cache"] is None          # another search: not auto's plan


def test_a_planned_auto_never_replaces_a_faster_cached_plan(capsys, tmp_path, monkeypatch):
    """With no budget the plan is the best baseline, the same each time: the first run stores it, the
    second (not faster than the entry) leaves the entry alone and says so (`plan_cache` null)."""
    monkeypatch.setenv("TAG_TF_CACHE_DIR", str(tmp_path))
    argv = ("plan", "--model", "mlp", "--tiny", "--batch", "32", "--topology", "testbed", "--budget", "0",
            "--groups", "8", "--json")
    code, first, _ = run_json(capsys, *argv)
    assert code == 0 and first["plan_cache"]
    entry = Path(first["plan_cache"]).read_text()
    code, second, _ = run_json(capsys, *argv)
    assert code == 0 and second["plan_cache"] is None and second["iteration_time_s"] == first["iteration_time_s"]
    assert Path(first["plan_cache"]).read_text() == entry
