"""Searching large clusters (#35): device sets that follow the cluster's hierarchy, and a searched
plan judged device by device where the simulator's device classes were not exact."""
from __future__ import annotations

import pytest
from conftest import analysis_of

from tag_tf.search.local_search import local_search
from tag_tf.search.mcts import MctsOptions, candidate_actions, mcts_search
from tag_tf.search.moves import APPROXIMATE_ABOVE, HIERARCHY_MACHINES, Evaluator, candidate_device_sets
from tag_tf.sim.simulator import Simulator
from tag_tf.topology import load_topology
from tag_tf.topology.presets import mixed


def test_large_clusters_get_machine_kinds_and_counts_not_every_machine():
    topology = mixed(256)
    sets = candidate_device_sets(topology)
    sizes = [len(s) for s in sets]
    assert sizes[:3] == [256, 64, 160]                  # all, the fastest type, the two fastest
    assert {8, 16, 32, 96} <= set(sizes) and len(sets) < 20
    for devices in sets:                                   # whole machines only
        machines = {topology.devices[d].machine for d in devices}
        assert len(devices) == 8 * len(machines)
    by_machine = [tuple(g.devices) for g in topology.groups]
    assert sum(1 for s in sets if s in by_machine) == 3    # the first machine of each kind, no more
    # Up to HIERARCHY_MACHINES machines every machine is still its own candidate.
    small = load_topology("testbed")
    assert small.num_machines <= HIERARCHY_MACHINES
    assert all(tuple(g.devices) in candidate_device_sets(small) for g in small.groups)
    assert len(candidate_actions(mixed(1024))) < 4 * 25


@pytest.mark.parametrize("search", ["mcts", "local"])
def test_a_searched_plan_is_judged_in_full(search):
    _, a = analysis_of("mlp", num_groups=12, batch_size=128)
    sim = Simulator(a, mixed(32), calibration=None)
    if search == "mcts":
        result = mcts_search(sim, sim.topology, MctsOptions(budget_s=4.0, heterog=False))
    else:
        result = local_search(sim, sim.topology, budget_s=4.0)
    full = sim.simulate(result.strategy, collapse=False)
    assert result.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)


def test_searches_approximate_only_on_large_clusters():
    _, a = analysis_of("mlp", num_groups=12, batch_size=256)
    assert not Evaluator(Simulator(a, mixed(APPROXIMATE_ABOVE), calibration=None)).approximate
    assert Evaluator(Simulator(a, mixed(2 * APPROXIMATE_ABOVE), calibration=None)).approximate
