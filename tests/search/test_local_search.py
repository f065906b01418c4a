"""The simulator-driven local search behind strategy="auto" (until MCTS)."""
from __future__ import annotations

import math

import numpy as np
from conftest import analysis_of, batches

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.runtime.equivalence import check_equivalence
from tag_tf.search.local_search import candidate_device_sets, coupled_blocks, describe, local_search
from tag_tf.sim.simulator import Simulator
from tag_tf.topology.load import load_topology


def test_search_never_loses_to_the_baselines_and_respects_the_budget():
    """Searches bounded by passes, not by the clock (an unbounded budget): the outcome does not
    depend on how fast this machine is."""
    _, a = analysis_of("cnn", batch_size=32)
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    result = local_search(sim, topo, budget_s=math.inf, max_passes=1)
    assert result.iteration_time_s <= min(result.baselines.values()) + 1e-12
    assert result.speedup_over_dp >= 1.0
    assert sim.simulate(result.strategy).iteration_time_s == result.iteration_time_s   # re-simulates alike
    # Block moves only add candidates: never worse than single-group moves alone.
    singles = local_search(sim, topo, budget_s=math.inf, max_passes=1, blocks=False)
    assert result.iteration_time_s <= singles.iteration_time_s
    assert result.iteration_time_s <= result.baselines["heterog"] <= result.baselines["horovod"]
    quick = local_search(sim, topo, budget_s=0.0)       # the baselines only: 4 fixed, best-subset's k machines
    assert quick.evaluations <= 5 + topo.num_machines and quick.iteration_time_s == min(quick.baselines.values())
    assert result.iteration_time_s <= result.baselines["best-subset"]
    rows = describe(result.strategy, topo, a.grouping.groups)
    assert len(rows) == sim.num_groups and sum(r["compute_share"] for r in rows) > 0.99


def test_candidate_sets_follow_gpu_speed_and_machines():
    topo = load_topology("testbed")           # 4x V100, 8x 1080Ti, 4x P100
    sets = candidate_device_sets(topo)
    assert sets[0] == tuple(range(16))
    assert (0, 1, 2, 3) in sets               # the fastest type alone (also the V100 machine)
    assert all(len(s) >= 1 for s in sets) and len(set(sets)) == len(sets)


def test_searched_strategy_trains_equivalently():
    """Whatever the search picks compiles to a graph that trains like the original."""
    model, a = analysis_of("mlp")
    topo = load_topology("local:3")
    result = local_search(Simulator(a, topo), topo, budget_s=5.0)
    compiled = compile_strategy(PassContext(), a, result.strategy, DeviceMap.local_cpus(3), check=True)
    check = check_equivalence(a, compiled, batches(model, 2), 2)
    assert check.ok, check.max_rel_diff


def test_coupled_blocks_join_groups_by_their_heaviest_exchange():
    # Groups 0..3: group 1 (weights) sends 100 to group 0 and 60 to group 2 and gets 90 back from
    # group 2; group 3 exchanges 1 with group 0 in each direction.
    traffic = np.zeros((4, 4))
    traffic[1, 0], traffic[1, 2], traffic[2, 1], traffic[3, 0], traffic[0, 3] = 100, 60, 90, 1, 1
    blocks = coupled_blocks(traffic)
    # Group 1: 100 with 0 and 150 with 2 -> both (>= half of 150); group 2: only 1 (150); group 0:
    # 100 with 1, 2 with 3 -> only 1; group 3: only 0. Heaviest internal exchange first.
    assert blocks == [(0, 1, 2), (1, 2), (0, 1), (0, 3)]
    assert coupled_blocks(traffic, most=2) == [(1, 2), (0, 1), (0, 3)]
    assert coupled_blocks(np.zeros((1, 1))) == []


def test_group_traffic_sums_the_bytes_crossing_groups():
    _, a = analysis_of("cnn")
    sim = Simulator(a, load_topology("local:2"))
    traffic = sim.group_traffic()
    G = sim.num_groups
    assert traffic.shape == (G, G) and np.all(np.diag(traffic) == 0) and traffic.sum() > 0
    edges, group = sim.op_edges(), sim.op_group
    cross = group[edges.src] != group[edges.dst]
    assert traffic.sum() == float(edges.nbytes[cross].sum())


def test_search_starts_from_a_smaller_device_set_when_dp_cannot_run(capsys, tmp_path):
    """8 samples cannot be split over the testbed's 16 GPUs: DP does not run, the plan still does."""
    import json

    from tag_tf.frontend.cli import main

    _, a = analysis_of("mlp", batch_size=8)
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    result = local_search(sim, topo, budget_s=5.0)
    assert result.baselines["dp"] == float("inf") and result.speedup_over_dp is None
    assert np.isfinite(result.iteration_time_s)
    assert max(len(p.devices) for p in result.strategy.groups) <= 8
    code = main(["plan", "--model", "mlp", "--tiny", "--batch", "8", "--topology", "testbed", "--budget", "2",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    # Every baseline over all 16 GPUs fails; best-subset (the fastest machines only) and pipeline
    # stages (a machine or a few per stage) can run.
    assert code == 0 and out["speedup_vs_dp"] is None
    assert {k for k, v in out["baselines"].items() if v is not None} <= {"best-subset", "pipeline"}
    assert set(out["baselines"]) == {"dp", "dp-p", "horovod", "horovod-p", "heterog", "best-subset", "pipeline", "dp+sfb",
                                       "dp-p+sfb", "horovod+sfb", "horovod-p+sfb"} and out["lower_bound_s"] > 0
    assert out["iteration_time_s"] > 0
    # Nothing fits 1 KiB GPUs: one clear line, non-zero exit.
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({"name": "tiny", "machines": [
        {"name": "m", "gpus": [{"type": "V100-32GB", "count": 2, "memory": "1KiB"}]}]}))
    code = main(["plan", "--model", "mlp", "--tiny", "--topology", str(tiny), "--budget", "1", "--json"])
    err = capsys.readouterr().err
    assert code != 0 and "no plan found" in err and "out of device memory" in err
