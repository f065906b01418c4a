"""The local machine model builds, caches in the profile DB, and predicts positive times. No timing
assertions: accuracy targets live in benchmarks/simulator_accuracy.py."""
from __future__ import annotations

import dataclasses

import pytest
from conftest import analysis_of

from tag_tf.errors import ProfileError
from tag_tf.localmachine import model as lm
from tag_tf.profile.db import ProfileDB
from tag_tf.search.baselines import data_parallel
from tag_tf.strategy import Option, Strategy

SIZES = (256, 1 << 16)          # two message sizes keep the measurements short


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    db = ProfileDB(tmp_path_factory.mktemp("db"))
    return db, lm.local_machine(lm.LocalSetup(1, 2), db, sizes=SIZES, repeats=2)


def test_machine_measures_and_round_trips(machine):
    db, m = machine
    assert set(m.p2p) == {"intra"} and set(m.allreduce) == {"intra:2"}
    assert [b for b, _ in m.p2p["intra"]] == list(SIZES)
    assert all(t >= 0 for _, t in m.p2p["intra"] + m.allreduce["intra:2"])
    assert m.step_fixed_s >= 0 and m.single_step_fixed_s >= 0 and m.conversion_bandwidth > 0
    assert lm.LocalMachine.from_dict(m.to_dict()) == m
    # The topology keeps the devices and swaps in the measured "cpu" type.
    topo = m.topology()
    assert topo.num_devices == 2 and topo.gpu_type("cpu").launch_overhead_s == m.conversion_launch_s


def test_machine_is_cached(machine, monkeypatch):
    db, m = machine
    monkeypatch.setattr(lm, "measure_machine", lambda *a, **k: pytest.fail("measured again"))
    assert lm.local_machine(lm.LocalSetup(1, 2), db) == m


def test_local_simulator_predicts_mlp_on_two_devices(machine, monkeypatch):
    db, m = machine
    model, a = analysis_of("mlp")
    zoo = lm.ZooModel.of("mlp", tiny=True, dropout=0.0)
    sim = lm.local_simulator(a, 2, db=db, model=zoo, profile_repeats=2)
    assert isinstance(sim, lm.LocalSimulator) and sim.machine == m
    one = sim.simulate(Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE))
    dp = sim.simulate(data_parallel(sim.num_groups, 2))
    assert one.iteration_time_s > sim.step_overhead_s > 0
    assert dp.iteration_time_s > sim.step_overhead_s and dp.conversions["allreduce"] > 0
    # The profile is stored under the graph's fingerprint: a second simulator measures nothing.
    monkeypatch.setattr("tag_tf.measure.ops.profile_model",
                        lambda *a, **k: pytest.fail("profiled again"))
    again = lm.local_simulator(a, 2, db=db)
    assert again.profile.op_names == sim.profile.op_names
    assert again.simulate(data_parallel(sim.num_groups, 2)).iteration_time_s == pytest.approx(dp.iteration_time_s)


def test_setups_and_errors():
    assert lm.LocalSetup(2, 2).topology().num_machines == 2
    assert lm.LocalSetup(2, 2).device_names()[2] == "/job:worker/replica:0/task:1/device:CPU:0"
    assert lm.LocalSetup(1, 3).topology().num_devices == 3
    with pytest.raises(ProfileError, match="need >= 1 process and device"):
        lm.LocalSetup(0, 1)
    _, a = analysis_of("mlp")
    with pytest.raises(Exception, match="evenly"):
        lm.local_simulator(a, 3, processes=2)
    with pytest.raises(Exception, match="ZooModel"):
        lm.local_profile(a, None, None)


def test_executor_overhead_spreads_the_untraced_remainder(machine):
    _, m = machine
    import numpy as np

    from tag_tf.profile.op_profile import OpProfile

    prof = OpProfile("cpu", ("a", "b"), np.array([1e-3, 0.0]), np.array([0.0, 1e-4]), (2, 4),
                     np.array([[1e-3, 1e-3], [2e-4, 4e-4]]), np.full((2, 1, 2), np.nan),
                     step_times=np.array([1.2e-3 + 2e-5, 1.4e-3 + 2e-5]) + m.single_step_fixed_s)
    per_op = lm.executor_overhead(dataclasses.replace(prof), m, {2: 0.0, 4: 0.0})
    assert per_op == pytest.approx(1e-5, rel=1e-6)


def test_message_cost_between_two_server_processes():
    """The executor time of a cross-process transfer is measured on real servers, and a two-process
    LocalMachine hands it to the simulator's comm model."""
    from tag_tf.localmachine.probes import measure_message_cost

    setup = lm.LocalSetup(2, 1)
    with lm.local_servers(2, 1) as spec:
        cost = measure_message_cost(lm.SetupRunner(setup, spec), 0, 1, repeats=3, messages=8, chain=8)
    assert 0.0 <= cost < 0.05            # seconds per 4-byte message: finite, far below a step
    d = {"setup": {"processes": 2, "devices_per_process": 1}, "p2p": {}, "allreduce": {},
         "conversion_launch_s": 1e-6, "conversion_bandwidth": 1e9, "step_fixed_s": 1e-4,
         "step_per_feed_byte_s": 0.0, "single_step_fixed_s": 1e-4, "single_step_per_feed_byte_s": 0.0,
         "host_message_s": cost}
    machine = lm.LocalMachine.from_dict(d)
    assert machine.comm_model(machine.topology()).host_message_s == cost
    assert lm.LocalMachine.from_dict(machine.to_dict()) == machine
