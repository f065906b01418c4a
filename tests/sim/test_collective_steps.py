"""How long each step of an all-reduce between machines waits for a member that computes
(Machine.collective_step_s; discovery measures it: measure.links.measure_collective_steps): a ring's
steps take at least its slowest member's, beside the link's latency."""
from __future__ import annotations

import pytest
from conftest import analysis_of

from tag_tf.search.registry import baseline
from tag_tf.sim.simulator import Simulator
from tag_tf.topology import load_topology

LATENCY_S = 100e-6


def _three(step: str | None = None, on: int = 2):
    machines = [{"name": f"m{i}", "gpus": "1x cpu", "intra": "local",
                 **({"collective": step} if step and i == on else {})} for i in range(3)]
    return load_topology({"name": "three", "machines": machines,
                          "inter": {"switch": "1Gbps", "latency": f"{LATENCY_S * 1e6:g}us"}})


def test_the_field_round_trips_and_leaves_other_topologies_as_they_were():
    plain, slow = _three(), _three("2ms")
    assert plain.machines[2].collective_step_s == 0 and "collective" not in plain.to_dict()["machines"][2]
    assert slow.machines[2].collective_step_s == pytest.approx(2e-3)
    assert load_topology(slow.to_dict()).machines[2].collective_step_s == pytest.approx(2e-3)
    assert slow.fingerprint != plain.fingerprint and "per all-reduce step" in slow.describe()
    with pytest.raises(Exception, match="collective"):
        _three("2s")


def test_every_all_reduce_step_waits_for_the_slowest_member():
    """dp's unfused all-reduces over three machines: 2(n-1) = 4 steps each; a member whose steps take
    2 ms makes each all-reduce 4 x (2 ms - the link's latency) longer; a step shorter than the
    latency changes nothing."""
    _, a = analysis_of("mlp", num_groups=4)
    dp = baseline("dp", len(a.grouping.groups), _three())
    plain = Simulator(a, _three()).simulate(dp)
    slow = Simulator(a, _three("2ms")).simulate(dp)
    quick = Simulator(a, _three("50us")).simulate(dp)
    allreduces = plain.conversions["allreduce"]
    assert quick.iteration_time_s == pytest.approx(plain.iteration_time_s)
    added = slow.iteration_time_s - plain.iteration_time_s
    assert allreduces >= 2 and added == pytest.approx(allreduces * 4 * (2e-3 - LATENCY_S), rel=0.1)
    # the same member on a machine of its own: no step between machines, nothing added
    one = load_topology({"name": "one", "machines": [{"name": "m0", "gpus": "1x cpu", "intra": "local",
                                                      "collective": "2ms"}]})
    plain_one = load_topology({"name": "one", "machines": [{"name": "m0", "gpus": "1x cpu", "intra": "local"}]})
    alone = baseline("dp", len(a.grouping.groups), one)
    assert Simulator(a, one).simulate(alone).iteration_time_s == pytest.approx(
        Simulator(a, plain_one).simulate(alone).iteration_time_s)
