"""The local machine model under TensorFlow's default runtime: runtimes and setups, the CPU executor
modes of the simulator, the correction and blend arithmetic, replicas measured side by side (real
helper processes), and a between-graph setup's step cost. No timing assertions: how well it
predicts real steps is benchmarks/step_time.py --predict."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import analysis_of

from tag_tf.errors import ProfileError
from tag_tf.localmachine import model as lm
from tag_tf.localmachine.corun import corun_walls
from tag_tf.profile.op_profile import OpProfile
from tag_tf.search.baselines import data_parallel
from tag_tf.sim.simulator import Simulator


def test_runtimes_name_their_environment_and_setups_round_trip():
    assert lm.PINNED.env == {"TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
                             "TF_ENABLE_ONEDNN_OPTS": "0"}
    assert lm.PINNED.server_env()["TF_NUM_INTEROP_THREADS"] == "2"
    assert lm.TF_DEFAULTS.env == {} and lm.TF_DEFAULTS.server_env() == {}
    assert lm.PINNED.one_op_at_a_time and not lm.TF_DEFAULTS.one_op_at_a_time
    setup = lm.LocalSetup(2, 1, lm.TF_DEFAULTS, between_graph=True)
    assert setup.name == "2proc-1cpu-tasks" and lm.LocalSetup.from_dict(setup.to_dict()) == setup
    assert lm.LocalSetup.from_dict({"processes": 1, "devices_per_process": 2}) == lm.LocalSetup(1, 2)
    with pytest.raises(ProfileError, match="between-graph needs >= 2 processes"):
        lm.LocalSetup(1, 2, between_graph=True)
    with pytest.raises(ProfileError, match="unknown runtime 'nope'"):
        lm.LocalSetup.from_dict({"processes": 1, "devices_per_process": 1, "runtime": "nope"})
    assert lm.device_type_key(lm.TF_DEFAULTS) != lm.device_type_key(lm.PINNED)


def test_cpu_executor_modes_order_a_data_parallel_step():
    """Two CPU processes with one device each: their own executors overlap the replicas, one
    executor for both runs every op one after the other (about twice the compute)."""
    from tag_tf.runtime.cluster import cpu_topology

    _, a = analysis_of("mlp")
    topo = cpu_topology(2, 1)
    dp = data_parallel(len(a.grouping.groups), 2)
    times = {mode: Simulator(a, topo, cpu_executor=mode).simulate(dp).iteration_time_s
             for mode in ("per-process", "per-device", "one")}
    assert times["per-process"] == pytest.approx(times["per-device"], rel=0.05)   # transfers use the executor too
    assert times["one"] > 1.3 * times["per-device"]
    with pytest.raises(ValueError, match="cpu_executor 'both'"):
        Simulator(a, topo, cpu_executor="both")


def _profile(step_times):
    # Two ops: 1 ms fixed, and 0.1 ms per sample: total(b) = 1e-3 + 1e-4 b.
    return OpProfile("cpu", ("a", "b"), np.array([1e-3, 0.0]), np.array([0.0, 1e-4]), (2, 4),
                     np.array([[1e-3, 1e-3], [2e-4, 4e-4]]), np.full((2, 1, 2), np.nan),
                     step_times=np.asarray(step_times))


class _Machine:
    def single_step_overhead(self, feed_bytes):
        return 5e-5


def test_step_correction_fits_a_shift_per_op_and_a_per_sample_factor():
    # Walls: 2e-5 more per step (1e-5 per op) and twice the per-sample time, plus the step's own cost.
    walls = {b: 1e-3 + 2e-5 + 2 * 1e-4 * b + 5e-5 for b in (2, 4)}
    per_op, scale = lm.step_correction(_profile([0, 0]), _Machine(), walls, {})
    assert per_op == pytest.approx(1e-5, rel=1e-6) and scale == pytest.approx(2.0, rel=1e-6)
    assert lm.step_correction(_profile([0, 0]), _Machine(), {}, {}) == (0.0, 1.0)


def test_serial_share_reads_the_overlap_of_replicas():
    alone = {8: 1.0, 16: 2.0}
    assert lm.serial_share(alone, {8: 1.0, 16: 2.0}, 2, 16) == 0.0        # full overlap
    assert lm.serial_share(alone, {8: 2.0, 16: 4.0}, 2, 16) == 1.0        # one after the other
    assert lm.serial_share(alone, {8: 1.0, 16: 3.0}, 2, 15) == pytest.approx(0.5)
    assert lm.serial_share(alone, {8: 9.0, 16: 9.0}, 4, 8) == 1.0         # clipped
    assert lm.serial_share(alone, {8: 2.0}, 1, 8) == 0.0                  # one device: nothing to blend


def test_replicas_side_by_side_in_two_processes():
    """A helper process runs the second replica while this one times its own."""
    kwargs = dict(tiny=True, dynamic_batch=True, dropout=0.0)
    walls = corun_walls("mlp", kwargs, lm.LocalSetup(2, 1, lm.TF_DEFAULTS), (4, 8), repeats=3)
    assert sorted(walls) == [4, 8] and all(0 < t < 5.0 for t in walls.values())


@pytest.mark.parametrize("between_graph", [True, False])
def test_a_task_steps_own_cost_with_its_meeting(between_graph):
    """Two TF_CONFIG-like tasks (this process and a helper, each with its own server): every task
    drives its own part, or this one drives both; 2 T1 - T2 is a finite cost per fed size."""
    from tag_tf.localmachine.tasksteps import measure_task_steps

    setup = lm.LocalSetup(2, 1, lm.TF_DEFAULTS, between_graph)
    samples = measure_task_steps(setup, (4, 1 << 16), repeats=15)
    assert [b for b, _ in samples] == [4, 1 << 16] and all(0.0 <= t < 1.0 for _, t in samples)
    # A step that meets the other task costs more than a chained collective more: 2 T1 - T2 > 0
    # (clipped at 0 otherwise, which a sound measurement of a real session run never is).
    assert samples[0][1] > 0


def test_between_graph_tasks_under_tf_defaults(tmp_path):
    """A TF_CONFIG-like setup: the step's own cost is measured through an in-process server, each
    task pays it for the batch it is fed, and the simulator blends side-by-side and one-at-a-time runs."""
    from tag_tf.profile.db import ProfileDB

    db = ProfileDB(tmp_path)
    _, a = analysis_of("mlp")
    zoo = lm.ZooModel.of("mlp", tiny=True, dropout=0.0)
    setup = lm.LocalSetup(2, 1, lm.TF_DEFAULTS, between_graph=True)
    machine = lm.local_machine(setup, db, sizes=(256, 1 << 16), repeats=2)
    with pytest.raises(ProfileError, match="measured for"):      # a machine of another setup is refused
        lm.local_simulator(a, 2, 2, db=db, model=zoo, machine=machine, runtime=lm.TF_DEFAULTS)
    assert machine.setup == setup and set(machine.allreduce) == {"inter:2"} and machine.step_fixed_s >= 0
    sim = lm.local_simulator(a, 2, 2, db=db, model=zoo, runtime=lm.TF_DEFAULTS, between_graph=True,
                             profile_repeats=2)
    # One device per process: its executor is the process's (a collective across processes holds both).
    assert sim.machine == machine and sim.cpu_executor == "per-process" and 0.0 <= sim.serial <= 1.0
    assert sim.step_overhead_s == pytest.approx(machine.step_overhead(lm.feed_bytes_of(a.graph_b1)))
    dp = sim.simulate(data_parallel(sim.num_groups, 2))
    assert dp.iteration_time_s > sim.step_overhead_s and dp.conversions["allreduce"] > 0
    # The blend: `serial` of the way from the side-by-side run to the one-executor run.
    side = Simulator.simulate(sim, data_parallel(sim.num_groups, 2)).iteration_time_s

    class OneExecutor:
        def simulate(self, strategy):
            return type("Report", (), {"iteration_time_s": side + 1.0})()

    sim.serial, sim._serial = 0.25, OneExecutor()
    blended = sim.simulate(data_parallel(sim.num_groups, 2)).iteration_time_s
    assert blended == pytest.approx(side + 0.25 + sim.step_overhead_s)
    sim.serial, sim._serial = 0.0, None
    # Stored: the profile under its runtime's key, and both side-by-side measurements.
    assert any(p["device_type"] == lm.device_type_key(lm.TF_DEFAULTS) for p in db.list_op_profiles())
    again = lm.local_simulator(a, 2, 2, db=db, runtime=lm.TF_DEFAULTS, between_graph=True)
    assert again.simulate(data_parallel(sim.num_groups, 2)).iteration_time_s == pytest.approx(dp.iteration_time_s)
