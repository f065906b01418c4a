"""Batch shares per plan (search/shares.py): the water-filling LP levels each device's compute."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import analysis_of

from tag_tf.search.shares import MIN_SHARE, ShareSolver
from tag_tf.sim.simulator import Simulator
from tag_tf.strategy import GroupPlan, Option, Strategy
from tag_tf.topology.load import load_topology
from tag_tf.topology.parse import topology_from_dict


def predicted_compute(solver: ShareSolver, strategy: Strategy, shares) -> np.ndarray:
    """Each device's compute under `shares`, summed op by op the way the solver models it."""
    s = np.asarray(shares)
    load = np.zeros(len(s))
    for g, plan in enumerate(strategy.groups):
        devs = np.asarray(plan.devices)
        types = solver.dev_type[devs]
        if plan.option in (Option.ALLREDUCE, Option.PS) and len(devs) > 1:
            load[devs] += solver.fixed[g, types] + solver.per_sample[g, types] * solver.batch * s[devs] / s[devs].sum()
        else:
            load[devs] += solver.fixed[g, types] + solver.per_sample[g, types] * solver.batch
    return load


def test_data_parallel_shares_level_heterogeneous_devices():
    _, a = analysis_of("cnn")
    topology = load_topology("testbed")
    sim = Simulator(a, topology)
    solver = ShareSolver(sim)
    dp = Strategy.uniform(sim.num_groups, range(topology.num_devices), Option.ALLREDUCE)
    shares = solver.solve(dp)
    load = predicted_compute(solver, dp, shares)
    # Levelled, except devices whose fixed op times alone exceed the level: they keep the minimum.
    floor = np.asarray(shares) <= 1.01 * MIN_SHARE * sum(shares)
    assert (~floor).sum() >= 4
    level = load[~floor]
    assert level.max() == pytest.approx(level.min(), rel=1e-3)
    assert np.all(load[floor] >= level.max() * (1 - 1e-3))
    even = predicted_compute(solver, dp, np.ones(topology.num_devices))
    assert load.max() < even.max()
    assert sum(shares) == pytest.approx(1.0)


def test_a_device_that_also_holds_an_unreplicated_group_takes_fewer_samples():
    # Big enough that per-sample work outweighs fixed op times (the tiny CNN's does not).
    _, a = analysis_of("cnn", batch_size=64, input_size=32, filters=(32, 64), dense_units=256)
    topology = topology_from_dict({"name": "two", "machines": [{"gpus": "1x V100"}, {"gpus": "1x V100"}],
                                   "inter": {"switch": "100Gbps"}})
    sim = Simulator(a, topology)
    solver = ShareSolver(sim)
    compute = np.array([g.compute for g in a.grouping.groups])
    alone = int(np.argmin(abs(compute - 0.1 * compute.sum())))      # about a tenth of the work
    groups = [GroupPlan((0, 1), Option.ALLREDUCE)] * sim.num_groups
    groups[alone] = GroupPlan((0,), Option.ALLREDUCE)
    plan = Strategy(tuple(groups), shares=(0.5, 0.5))
    shares = solver.solve(plan)
    assert shares[0] < shares[1]
    load = predicted_compute(solver, plan, shares)
    assert load[0] == pytest.approx(load[1], rel=1e-3)
    # Nothing splits a batch: nothing to solve.
    assert solver.solve(Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE)) is None


def test_polish_keeps_levelled_shares_only_where_they_simulate_faster():
    """Data parallelism on the heterogeneous testbed: levelled shares beat speed-proportional ones
    in simulation and the polish keeps them; it never returns a slower plan."""
    import math
    import time

    from tag_tf.deadline import Deadline
    from tag_tf.search.mcts import balance_shares
    from tag_tf.search.moves import Evaluator
    from tag_tf.search.registry import baseline

    _, a = analysis_of("cnn", batch_size=512, input_size=32, filters=(32, 64), dense_units=256)
    topology = load_topology("testbed")
    sim = Simulator(a, topology)
    rates = np.asarray(sim.device_rates())
    plan = dataclasses.replace(baseline("horovod-p", sim.num_groups, topology), shares=tuple(rates / rates.sum()))
    cost = Evaluator(sim)
    start = cost(plan)
    solver = ShareSolver(sim)
    levelled = cost(dataclasses.replace(plan, shares=solver.solve(plan)))
    assert levelled < start
    found, t = balance_shares(cost, plan, start, Deadline(time.perf_counter() + 60), solver, rounds=0)
    assert t == pytest.approx(levelled) and found.shares == solver.solve(plan)
    found, t = balance_shares(cost, plan, start, Deadline(time.perf_counter() + 60), solver)
    assert t <= levelled and math.isclose(t, cost(found))
