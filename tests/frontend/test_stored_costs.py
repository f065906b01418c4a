"""Measured profiles reach the planner: `tag-tf profile` (here or on a cluster's servers) stores op
times that `plan`, `simulate` and `distribute(strategy="auto")` then use, and say so."""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from tag_tf.frontend.cli import main
from tag_tf.profile.db import ProfileDB


def run_json(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def plan(capsys, db, *extra, topology="local:2"):
    # Bounded by iterations, not by the clock: two plans of one setup are the same plan however busy
    # the machine is.
    return run_json(capsys, "plan", "--model", "mlp", "--tiny", "--topology", topology, "--budget-s", "120",
                    "--iterations", "150", "--profile-db", str(db), "--json", *extra)


def two_cpu_machines(tmp_path):
    """Two machines of one CPU device each (virtual CPU devices of one machine share its cores)."""
    import yaml

    from tag_tf.runtime.cluster import cpu_topology

    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(cpu_topology(2, 1).to_dict()))
    return str(path)


def used_devices(out):
    return {d for g in out["strategy"]["groups"] for d in g["devices"]}


def test_a_profile_measured_at_other_batch_sizes_reaches_plan_and_simulate(capsys, tmp_path):
    db = tmp_path / "profiles"
    before = plan(capsys, db)
    assert before["cost_sources"]["cpu"].startswith("model") and before["profiles"] == {}

    prof = run_json(capsys, "profile", "--model", "mlp", "--tiny", "--batch-sizes", "2,4", "--repeats", "2",
                    "--db", str(db), "--json")
    assert prof["device_type"] == "cpu" and prof["ops_profiled"] > 0
    # Whole steps measured both ways: how compiled graphs of this program will run, and the op scale.
    assert set(prof["rewritten_step_wall_s"]) == {"2", "4"} and prof["runtime"]["op_time_scale"] > 0
    after = plan(capsys, db)
    # The plan's graph (batch 32) is matched to the profile measured at batch 2 and 4 by rebuilding.
    assert after["cost_sources"]["cpu"].startswith("profile (")
    assert after["profiles"] == {"cpu": prof["db"]}
    # (Not: a lower bound unlike the model's. The measured profile can land within 0.1% of the model's
    # estimate of this tiny graph: seen once in three full runs, 0.26154 against 0.26156 ms.)
    assert 0 < after["lower_bound_s"] < float("inf")
    sim = run_json(capsys, "simulate", "--model", "mlp", "--tiny", "--topology", "local:2", "--profile-db", str(db),
                   "--json")
    assert sim["cost_sources"]["cpu"].startswith("profile (")
    ignored = plan(capsys, db, "--no-profiles")
    assert ignored["cost_sources"]["cpu"].startswith("model") and ignored["profiles"] == {}


def test_profile_costs_change_the_plan_when_they_should(capsys, tmp_path):
    """On a device whose op times grow with the batch (each op's measured time at batch 4, all of it
    per sample, 10^4 times over; optimizer updates, which run once per step, as measured) the tiny
    MLP is compute-bound: the plan then splits the batch over both devices. A profile of another
    graph changes nothing."""
    from tag_tf.frontend.loading import model_ir
    from tag_tf.measure.ops import profile_model
    from tag_tf.models import build_model

    db = ProfileDB(tmp_path / "profiles")
    topology = two_cpu_machines(tmp_path)
    light = plan(capsys, db.path, topology=topology)
    other = profile_model("cnn", (2, 4), repeats=1, warmup=0, tiny=True, device="cpu")
    db.put_op_profile(other, model_ir(build_model("cnn", tiny=True, batch_size=2)).fingerprint)
    unrelated = plan(capsys, db.path, topology=topology)
    assert unrelated["cost_sources"] == light["cost_sources"] and unrelated["strategy"] == light["strategy"]

    measured = profile_model("mlp", (2, 4), repeats=1, warmup=0, tiny=True, device="cpu")
    update = np.array(["Apply" in t for t in measured.op_types])
    at4 = measured.fixed + 4 * measured.per_sample
    # Made-up op times: without the whole steps they would add up to (no runtime fit to scale them).
    slow = dataclasses.replace(measured, fixed=np.where(update, measured.fixed, 0.0),
                               per_sample=np.where(update, measured.per_sample, at4 / 4 * 1e4),
                               rewritten_step_times=None)
    db.put_op_profile(slow, model_ir(build_model("mlp", tiny=True, batch_size=2)).fingerprint)
    heavy = plan(capsys, db.path, topology=topology)
    assert heavy["cost_sources"]["cpu"].startswith("profile (")
    assert heavy["iteration_time_s"] > 100 * light["iteration_time_s"]
    assert len(used_devices(light)) == 1 or light["strategy"] != heavy["strategy"]
    assert used_devices(heavy) == {0, 1}


def test_plans_cached_under_other_costs_are_other_plans(tmp_path):
    from conftest import analysis_of

    from tag_tf.frontend.planning import PlanCache, resolve_strategy, stored_costs_for
    from tag_tf.measure.ops import profile_model
    from tag_tf.topology.load import load_topology

    _, analysis = analysis_of("mlp")
    topology = load_topology("local:2")
    db = ProfileDB(tmp_path / "profiles")
    calls = []

    def planner(a, t, request, budget):
        calls.append(request)
        from tag_tf.search.registry import baseline
        return baseline("dp", len(a.grouping.groups), t)

    first = resolve_strategy(analysis, topology, "auto", cache_dir=str(tmp_path), planner=planner,
                             costs=stored_costs_for(analysis, topology, db))
    prof = profile_model("mlp", (2, 4), repeats=1, warmup=0, tiny=True, device="cpu", dropout=0.0)
    db.put_op_profile(prof, analysis.graph_b1.fingerprint)
    costs = stored_costs_for(analysis, topology, db)
    assert costs.files and not costs.empty
    second = resolve_strategy(analysis, topology, "auto", cache_dir=str(tmp_path), planner=planner, costs=costs)
    assert not first.cache_hit and not second.cache_hit and first.cache_path != second.cache_path
    assert resolve_strategy(analysis, topology, "auto", cache_dir=str(tmp_path), planner=planner,
                            costs=costs).cache_hit
    assert len(calls) == 2 and PlanCache(str(tmp_path)).root


def test_profile_each_device_type_of_a_cluster(capsys, tmp_path):
    from tag_tf.runtime.cluster import local_cluster

    db = tmp_path / "profiles"
    with local_cluster(2, 1, timeout_ms=20_000) as (spec, _):
        path = tmp_path / "cluster.json"
        spec.save(str(path))
        out = run_json(capsys, "profile", "--model", "mlp", "--tiny", "--batch-sizes", "2,4", "--repeats", "1",
                       "--warmup", "0", "--cluster", str(path), "--db", str(db), "--json")
        # A topology naming a GPU the server does not have is refused (soft placement would run the
        # ops on the CPU and store those times as the GPU's).
        import yaml

        mixed = tmp_path / "mixed.yaml"
        mixed.write_text(yaml.safe_dump({"name": "mixed", "machines": [{"gpus": "1x cpu", "intra": "local"},
                                                                         {"gpus": "1x V100"}],
                                         "inter": {"switch": "10Gbps"}}))
        code = main(["profile", "--model", "mlp", "--tiny", "--cluster", str(path), "--topology", str(mixed),
                     "--db", str(db), "--json"])
        assert code != 0 and "task 1" in capsys.readouterr().err
    assert out["device_types"] == ["cpu"]
    (report,) = out["profiles"]
    assert report["server"] == f"grpc://{spec.tasks[0]}" and report["device"].endswith("task:0/device:CPU:0")
    assert report["ops_profiled"] > 0
    after = plan(capsys, db)
    assert after["profiles"] == {"cpu": report["db"]}


def test_profile_cluster_errors_name_the_problem(capsys, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"tasks": ["127.0.0.1:1"]}))
    code = main(["profile", "--model", "mlp", "--tiny", "--cluster", str(path), "--json"])
    assert code != 0 and "task 0 (127.0.0.1:1) unreachable" in capsys.readouterr().err
    code = main(["profile", "--model", "mlp", "--tiny", "--topology", "local:2", "--json"])
    assert code != 0 and "--topology is for --cluster" in capsys.readouterr().err
