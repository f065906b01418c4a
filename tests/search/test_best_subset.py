"""The best-subset baseline (what a user tries first on a mixed cluster: Horovod-P on the fastest
machines only): subsets ordered by speed, the best count chosen by the simulator, among the
baselines every search reports and beats."""
from __future__ import annotations

import pytest
from conftest import analysis_of

from tag_tf.search.baselines import BEST_SUBSET, best_subset, machine_subsets
from tag_tf.search.mcts import MctsOptions, mcts_search
from tag_tf.search.moves import Evaluator
from tag_tf.search.registry import baseline
from tag_tf.sim.simulator import Simulator
from tag_tf.topology.load import load_topology


def test_machine_subsets_grow_from_the_fastest_machine():
    topo = load_topology("testbed")
    subsets = machine_subsets(topo)
    assert len(subsets) == topo.num_machines and subsets[-1] == tuple(range(topo.num_devices))
    assert {topo.devices[d].type for d in subsets[0]} == {"V100-32GB"}       # the V100 machine first
    assert all(set(a) < set(b) for a, b in zip(subsets, subsets[1:]))
    assert {topo.devices[d].type for d in subsets[4]} == {"V100-32GB", "GTX1080Ti"}   # P100s come last


def test_best_subset_is_never_slower_than_horovod_p_and_auto_beats_it():
    _, a = analysis_of("mlp")
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    cost = Evaluator(sim)
    plan, t = best_subset(cost, sim.num_groups, topo)
    assert plan.name == BEST_SUBSET and plan.fusion_bytes and t == pytest.approx(cost(plan))
    assert t <= cost(baseline("horovod-p", sim.num_groups, topo)) * (1 + 1e-9)   # all machines is one subset
    used = {d for g in plan.groups for d in g.devices}
    assert used in [set(s) for s in machine_subsets(topo)]
    result = mcts_search(sim, topo, MctsOptions(budget_s=5, seed=0), prior="uniform")
    assert result.baselines[BEST_SUBSET] == pytest.approx(t)
    assert result.iteration_time_s <= t * (1 + 1e-9)
