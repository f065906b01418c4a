"""One planning entry point (`planning.plan_for` with a typed `PlanRequest`): what distribute's
cache, the CLI's plan and simulate, and the demo plan with."""
from __future__ import annotations

import math

import pytest
from conftest import analysis_of

from tag_tf.errors import StrategyError
from tag_tf.frontend.planning import PlanCache, PlanRequest, plan_for, simulator
from tag_tf.topology.load import load_topology


@pytest.mark.parametrize("fields, says", [
    (dict(name="nope"), "strategy 'nope': expected one of auto"),
    (dict(iterations=0), "--iterations must be at least 1"),
    (dict(budget_s=-1.0), "--budget-s must not be negative"),
    (dict(patience_s=0.0), "--patience-s must be positive"),
    (dict(method="random"), "expected 'mcts' or 'local'"),
    (dict(weights="w.pt", prior="uniform"), "--weights is for the GNN prior"),
])
def test_a_bad_request_is_refused_before_any_work(fields, says):
    with pytest.raises(StrategyError, match=says):
        PlanRequest(**fields)


def test_auto_and_baselines_plan_through_one_entry(tmp_path):
    _, a = analysis_of("mlp", num_groups=4, batch_size=64)
    topology = load_topology("testbed")
    sim = simulator(a, topology)
    auto = plan_for(a, topology, PlanRequest(budget_s=2.0, progress=False), sim=sim)
    assert auto.search is not None and auto.strategy.name == "auto"
    assert auto.strategy.graph == a.graph.fingerprint and auto.strategy.topology == topology.fingerprint
    assert auto.iteration_time_s == pytest.approx(sim.simulate(auto.strategy).iteration_time_s)
    assert auto.iteration_time_s <= min(auto.search.result.baselines.values()) + 1e-12
    dp = plan_for(a, topology, PlanRequest("dp"))
    assert dp.search is None and math.isnan(dp.iteration_time_s) and dp.strategy.whole_replicas
    with_sfb = plan_for(a, topology, PlanRequest("dp+sfb"), sim=sim)
    assert with_sfb.strategy.name == "dp+sfb"
    # The CLI's cache policy: stored unless the entry there simulates at least as fast.
    cache = PlanCache(str(tmp_path))
    path = cache.path_for(a, topology, "auto")
    assert cache.offer(path, auto.strategy, auto.iteration_time_s, sim)
    assert not cache.offer(path, dp.strategy, sim.simulate(dp.strategy).iteration_time_s + 1.0, sim)
    assert cache.load(path) == auto.strategy
