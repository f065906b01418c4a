"""A network that carries less at once than its links alone (Topology.fabric_bandwidth: an emulated
cluster's links all run through one kernel): a ring over m machines moves each hop at most fabric / m.
Discovery measures it with a ring all-reduce over every task (measure.links.measure_fabric)."""
from __future__ import annotations

import pytest
from conftest import analysis_of

from tag_tf.search.registry import baseline
from tag_tf.sim.simulator import Simulator
from tag_tf.topology import load_topology


def _three(fabric=None):
    inter = {"switch": "1Gbps", "latency": "100us", **({"fabric": fabric} if fabric else {})}
    return load_topology({"name": "three", "machines": [{"name": f"m{i}", "gpus": "1x cpu", "intra": "local"}
                                                         for i in range(3)], "inter": inter})


def test_the_field_round_trips_and_leaves_other_topologies_as_they_were():
    plain, shared = _three(), _three("1.6Gbps")
    assert plain.fabric_bandwidth is None and "fabric" not in plain.to_dict()["inter"]
    assert shared.fabric_bandwidth == pytest.approx(0.2e9)
    assert load_topology(shared.to_dict()).fabric_bandwidth == pytest.approx(0.2e9)
    assert shared.fingerprint != plain.fingerprint and "at once" in shared.describe()


def test_a_ring_over_three_machines_moves_each_hop_at_a_third_of_the_fabric():
    _, a = analysis_of("mlp", num_groups=4)
    n = len(a.grouping.groups)
    horovod = baseline("horovod", n, _three())
    alone = Simulator(a, _three()).simulate(horovod).iteration_time_s
    ample = Simulator(a, _three("3Gbps")).simulate(horovod).iteration_time_s      # 3 x 1 Gbps: no limit
    shared = Simulator(a, _three("1.5Gbps")).simulate(horovod).iteration_time_s   # each hop 0.5 Gbps
    assert ample == pytest.approx(alone)
    assert shared > alone
    one = baseline("horovod", n, load_topology({"name": "one", "machines": [
        {"name": "m0", "gpus": "1x cpu", "intra": "local"}]}))
    assert Simulator(a, load_topology({"name": "one", "machines": [{"name": "m0", "gpus": "1x cpu", "intra": "local"}],
                                       "inter": {"switch": "1Gbps", "fabric": "1Mbps"}})).simulate(one).iteration_time_s \
        == pytest.approx(Simulator(a, load_topology({"name": "one", "machines": [
            {"name": "m0", "gpus": "1x cpu", "intra": "local"}]})).simulate(one).iteration_time_s)   # no hop between machines
