"""`tag-tf plan --calibration local`: plans judged by the local machine model (this machine's CPUs as
measured: op profile, transfers, collectives, per-step cost), the model benchmarks/real_execution.py
checks against real runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tag_tf.frontend.cli import main
from tag_tf.localmachine.runtime import RUNTIME_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plan_and_resimulate(tmp_path, attempt: int) -> tuple[dict, float]:
    db, out = tmp_path / f"profiles{attempt}", tmp_path / f"plan{attempt}.json"
    # Its own process: the local runtime is set before TensorFlow is imported.
    proc = subprocess.run([sys.executable, "-m", "tag_tf.frontend.cli", "plan", "--model", "mlp", "--tiny",
                           "--topology", "local:2", "--calibration", "local", "--budget-s", "2", "--profile-db",
                           str(db), "--out", str(out), "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["calibration"] == "local" and got["cost_sources"]["cpu"].startswith("profile (")
    assert got["local_runtime"] == "tfdefault" and got["between_graph"] is False     # what a program runs
    assert got["iteration_time_s"] <= min(v for v in got["baselines"].values() if v is not None)

    # The same model, read back from the database the command filled, predicts that very figure.
    from tag_tf.frontend.loading import analysis_for, load
    from tag_tf.frontend.planning import local_machine_simulator
    from tag_tf.strategy import Strategy
    from tag_tf.topology.load import load_topology

    class Args:
        model, graph, tiny, batch, input_size, groups = "mlp", None, True, None, None, 60

    loaded = load(Args)
    analysis = analysis_for(loaded, Args)
    sim = local_machine_simulator(analysis, load_topology("local:2"), "mlp", {"tiny": True}, str(db),
                                  runtime="tfdefault")
    assert sim.machine.step_fixed_s > 0 and sim.profile.num_ops > 0
    _regrouped_and_fed_alike(sim, analysis)
    return got, sim.simulate(Strategy.load(str(out))).iteration_time_s


def _regrouped_and_fed_alike(sim, analysis):
    """A plan of refined groups is priced alike by the local simulator and by the simulator of its
    groups that SFB and the share solver use (`for_strategy`), and a client keeps the local costs:
    once, the regrouped simulator was a plain one without the per-step costs, and a search's SFB
    step reported a refined plan 40% faster than it simulates (the plan then re-simulated to
    another figure than `plan --json` printed)."""
    import numpy as np

    from tag_tf.localmachine.model import LocalSimulator
    from tag_tf.search.baselines import random_strategy
    from tag_tf.search.refine import dominant_groups, split_groups
    from tag_tf.sim.client import Client

    base = random_strategy(len(analysis.grouping.groups), 2, np.random.default_rng(0))
    _, refined = split_groups(analysis, base, dominant_groups(analysis))
    assert refined.op_groups is not None
    regrouped = sim.for_strategy(refined)
    assert isinstance(regrouped, LocalSimulator) and regrouped.step_overhead_s == sim.step_overhead_s
    assert regrouped.simulate(refined).iteration_time_s == pytest.approx(sim.simulate(refined).iteration_time_s)
    fed = sim.with_client(Client(0, 0.0, between_graph=False))
    assert isinstance(fed, LocalSimulator) and fed.simulate(base).iteration_time_s >= sim.simulate(base).iteration_time_s


def test_a_local_plan_is_judged_by_the_local_machine_model(tmp_path):
    got, again = _plan_and_resimulate(tmp_path, 0)
    assert again == pytest.approx(got["iteration_time_s"], rel=1e-9)


def test_no_profiles_measures_the_local_machine_and_stores_nothing(tmp_path):
    db, cache = tmp_path / "profiles", tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "tag_tf.frontend.cli", "plan", "--model", "mlp", "--tiny",
                           "--topology", "local:2", "--calibration", "local", "--budget-s", "1", "--no-profiles",
                           "--profile-db", str(db), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TAG_TF_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["calibration"] == "local" and got["cost_sources"]["cpu"].startswith("profile (")
    assert not db.exists() and not cache.exists()        # neither the given nor the default database


def test_local_calibration_errors_name_the_problem(capsys, monkeypatch, tmp_path):
    for key in RUNTIME_ENV:          # the command sets these for its process: restored after the test
        monkeypatch.delenv(key, raising=False)
    assert main(["plan", "--model", "mlp", "--tiny", "--topology", "testbed", "--calibration", "local"]) != 0
    assert "topology 'testbed' is not this machine's CPU devices" in capsys.readouterr().err
    graph = tmp_path / "g.pbtxt"
    graph.write_text("")
    assert main(["plan", "--graph", str(graph), "--topology", "local:2", "--calibration", "local"]) != 0
    assert "--calibration local: needs --model" in capsys.readouterr().err
    # The local model's own options need it, and between-graph tasks need several processes.
    assert main(["plan", "--model", "mlp", "--tiny", "--topology", "local:2", "--between-graph"]) != 0
    assert "they need --calibration local" in capsys.readouterr().err
    assert main(["plan", "--model", "mlp", "--tiny", "--topology", "local:2", "--calibration", "local",
                 "--between-graph"]) != 0
    assert "topology 'local:2' is one process" in capsys.readouterr().err
