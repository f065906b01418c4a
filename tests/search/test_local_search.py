"""The simulator-driven local search behind strategy="auto" (until MCTS)."""
from __future__ import annotations

import numpy as np

from conftest import analysis_of, batches
from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.runtime.equivalence import check_equivalence
from tag_tf.search.local_search import candidate_device_sets, describe, local_search
from tag_tf.sim.simulator import Simulator
from tag_tf.topology.parse import load_topology


def test_search_never_loses_to_the_baselines_and_respects_the_budget():
    _, a = analysis_of("cnn", batch_size=32)
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    result = local_search(sim, topo, budget_s=20.0)
    assert result.iteration_time_s <= min(result.baselines.values()) + 1e-12
    assert result.speedup_over_dp >= 1.0
    assert sim.simulate(result.strategy).iteration_time_s == result.iteration_time_s   # re-simulates alike
    quick = local_search(sim, topo, budget_s=0.0)
    assert quick.evaluations <= 3 and quick.iteration_time_s == min(quick.baselines.values())
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
