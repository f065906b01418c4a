"""The strategy creator: PUCT, MCTS on a problem small enough to enumerate, the GNN prior's shapes on
different topologies and graphs, and plans that round-trip through the CLI."""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys

import numpy as np
import pytest
from conftest import analysis_of

from tag_tf.search.mcts import MctsOptions, candidate_actions, mcts_search, mix_prior, puct_scores
from tag_tf.search.registry import baseline, baseline_names
from tag_tf.sim.simulator import Simulator
from tag_tf.strategy import Option, Strategy
from tag_tf.topology.load import load_topology
from tag_tf.topology.parse import topology_from_dict

TWO_MACHINES = {"name": "two", "machines": [
    {"name": "a", "gpus": "2x V100-32GB", "intra": "nvlink 50GB/s"},
    {"name": "b", "gpus": "1x T4", "intra": "pcie 15.75GB/s"}], "inter": {"switch": "10Gbps", "latency": "50us"}}


def test_puct_arithmetic():
    q = np.array([0.5, 0.0, 1.0])
    n = np.array([3.0, 0.0, 1.0])
    prior = np.array([0.2, 0.5, 0.3])
    got = puct_scores(q, n, prior, 2.0)
    want = q + 2.0 * prior * np.sqrt(4.0) / (1.0 + n)
    np.testing.assert_allclose(got, want)
    # Before any visit the prior alone decides; a visited action's bonus shrinks with its count.
    assert np.argmax(puct_scores(np.zeros(3), np.zeros(3), prior, 1.0)) == 1
    assert puct_scores(q, n + np.array([0, 0, 9]), prior, 1.0)[2] < puct_scores(q, n, prior, 1.0)[2]


def test_mcts_finds_the_enumerated_optimum_of_a_small_problem():
    """Three op groups on a 2+1-GPU cluster: every plan of the search space (actions^groups, the
    leaf rule's fills included) is simulated; pure MCTS without the polish reaches the best one."""
    _, a = analysis_of("mlp", num_groups=3)
    topo = topology_from_dict(TWO_MACHINES)
    sim = Simulator(a, topo)
    assert sim.num_groups == 3
    result = mcts_search(sim, topo, MctsOptions(budget_s=120, iterations=1500, seed=3, polish=False), prior="uniform")
    actions = candidate_actions(topo)
    rates = np.asarray(sim.device_rates())
    template = dataclasses.replace(baseline("horovod-p", 3, topo), shares=tuple(rates / rates.sum()))
    reports = [sim.simulate(dataclasses.replace(template, groups=tuple(p))) for p in itertools.product(actions, repeat=3)]
    best = min(r.iteration_time_s for r in reports if not r.oom)
    baselines = min(result.baselines.values())
    assert result.iteration_time_s == pytest.approx(min(best, baselines), rel=1e-9)
    assert result.iterations_to_beat_dp is not None and result.iterations <= 1500


def test_the_root_is_swept_in_the_priors_order():
    """Each root action (a whole-model plan: it fills every undecided group) is simulated once, the
    prior's favourite first, before any is revisited; without the sweep a confident prior keeps
    revisiting its favourite."""
    _, a = analysis_of("mlp", num_groups=3)
    topo = topology_from_dict(TWO_MACHINES)
    sim = Simulator(a, topo)
    k = len(candidate_actions(topo))
    ranking = [int(i) for i in np.random.default_rng(5).permutation(k)]     # ranking[i]: i-th highest prior
    p = np.empty(k)
    p[ranking] = np.geomspace(1.0, 1e-6, k)

    def roots_expanded(sweep: bool) -> list[int]:
        expanded: list[tuple[int, ...]] = []

        def prior(prefix, group, leaf):
            expanded.append(prefix)
            return p
        mcts_search(sim, topo, MctsOptions(budget_s=60, iterations=k, seed=0, polish=False, heterog=False,
                                           sweep_root=sweep), prior=prior)
        return [pre[0] for pre in expanded if len(pre) == 1]

    assert roots_expanded(True) == ranking
    assert len(set(roots_expanded(False))) < k


def test_pure_mcts_plans_by_default_and_the_gnn_never_plans_cpus(monkeypatch):
    """The default follows benchmarks/gnn_wallclock.py's verdict (uniform); were it the GNN, a cluster of
    CPUs would still be planned by pure MCTS (the GNN never saw one)."""
    from tag_tf.search import priors

    assert priors.DEFAULT_PRIOR == "uniform"
    assert priors.default_prior(["cpu", "cpu"]) == "uniform" and priors.default_prior(["V100-32GB"]) == "uniform"
    monkeypatch.setattr(priors, "DEFAULT_PRIOR", "gnn")
    assert priors.default_prior(["cpu", "cpu"]) == "uniform" and priors.default_prior(["cpu", "V100-32GB"]) == "gnn"
    _, a = analysis_of("mlp", num_groups=3)
    for topology, prior in (("local:2", "uniform"), (TWO_MACHINES, "gnn")):
        topo = load_topology(topology) if isinstance(topology, str) else topology_from_dict(topology)
        result = mcts_search(Simulator(a, topo), topo, MctsOptions(budget_s=30, iterations=5, polish=False,
                                                                  heterog=False))
        assert result.prior == prior


def test_a_learned_prior_keeps_a_uniform_share():
    np.testing.assert_allclose(mix_prior(np.array([2.0, 0.0, 0.0, 0.0]), 0.5), [0.625, 0.125, 0.125, 0.125])
    np.testing.assert_allclose(mix_prior(np.array([1.0, 3.0]), 0.0), [0.25, 0.75])


def test_a_converged_search_ends_before_its_budget():
    """With patience the tree stops once its best plan has not improved for that long (or for as
    long as finding it took), far inside a 120 s budget; without, only the budget or the iteration
    cap ends it."""
    _, a = analysis_of("mlp", num_groups=3)
    topo = topology_from_dict(TWO_MACHINES)
    sim = Simulator(a, topo)
    early = mcts_search(sim, topo, MctsOptions(budget_s=120, seed=3, polish=False, patience_s=0.2), prior="uniform")
    assert early.converged and early.iteration_time_s <= min(early.baselines.values())
    capped = mcts_search(sim, topo, MctsOptions(budget_s=120, iterations=300, seed=3, polish=False), prior="uniform")
    assert not capped.converged and capped.iterations == 300


def test_never_slower_than_the_best_baseline_and_says_when_it_falls_back():
    _, a = analysis_of("cnn")
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    result = mcts_search(sim, topo, MctsOptions(budget_s=5, seed=1))
    assert set(result.baselines) == set(baseline_names())
    assert result.iteration_time_s <= min(result.baselines.values())
    none = mcts_search(sim, topo, MctsOptions(budget_s=0, seed=1))      # no search at all
    assert none.fell_back and none.iteration_time_s == min(none.baselines.values())
    assert none.strategy.name == "auto"


@pytest.mark.parametrize("model, topology", [("mlp", "local:4"), ("transformer", "testbed"), ("bert-small", "cloud")])
def test_gnn_priors_fit_any_topology_and_graph(model, topology):
    """One untrained network scores every candidate action for graphs and clusters of any size."""
    from tag_tf.search.gnn import GnnPrior, GraphFeatures, untrained

    _, a = analysis_of(model)
    topo = load_topology(topology)
    sim = Simulator(a, topo)
    actions = candidate_actions(topo)
    order = list(range(sim.num_groups))
    features = GraphFeatures(sim, topo, actions, order)
    prior = GnnPrior(untrained(0), features)
    root = prior((), 0, None)
    assert root.shape == (len(actions),) and np.all(root > 0) and root.sum() == pytest.approx(1.0)
    report = sim.simulate(Strategy.uniform(sim.num_groups, (0, 1), Option.ALLREDUCE))
    later = prior((0, 1), 2, report)              # two decisions and the feedback of a leaf plan
    assert later.shape == root.shape and not np.allclose(later, root)
    data = features.data((0, 1), report)
    assert data["op"].x.shape[0] == sim.num_groups and data["dev"].x.shape[0] == len(topo.groups)
    assert data["op", "placed", "dev"].edge_index.shape[1] >= 2


def test_gnn_prior_drives_the_search():
    _, a = analysis_of("mlp")
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    result = mcts_search(sim, topo, MctsOptions(budget_s=3, iterations=200, seed=0), prior="gnn")
    assert result.prior == "gnn" and result.iteration_time_s <= min(result.baselines.values())
    with pytest.raises(ValueError, match="unknown MCTS prior"):
        mcts_search(sim, topo, MctsOptions(budget_s=1), prior="learned")


def test_plan_cli_json_and_round_trip(tmp_path, capsys):
    from tag_tf.frontend.cli import main

    out = tmp_path / "plan.json"
    code = main(["plan", "--model", "cnn", "--tiny", "--batch", "64", "--topology", "testbed", "--budget-s", "3",
                 "--search", "mcts", "--prior", "uniform", "--seed", "2", "--iterations", "300",
                 "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "lower_bound_s", "baselines", "best_baseline", "speedup_vs_dp",
                "speedup_vs_best_baseline", "iterations_to_beat_dp", "time_to_beat_dp_s", "planning_time_s",
                "simulations", "oom", "cost_sources"):
        assert key in report, key
    assert report["search"] == "mcts" and report["iterations"] <= 300 and report["prior"] == "uniform"
    assert report["iteration_time_s"] <= min(v for v in report["baselines"].values() if v is not None)
    plan = Strategy.load(str(out))
    assert plan == Strategy.from_dict(report["strategy"])
    code = main(["simulate", "--model", "cnn", "--tiny", "--batch", "64", "--topology", "testbed", "--strategy", str(out), "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == pytest.approx(report["iteration_time_s"])
    # Without --prior, pure MCTS (the default gnn_wallclock chose); --prior gnn asks for the shipped GNN.
    assert main(["plan", "--model", "cnn", "--tiny", "--batch", "64", "--topology", "testbed", "--budget-s", "3",
                 "--iterations", "40", "--no-sfb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prior"] == "uniform"
    assert main(["plan", "--model", "cnn", "--tiny", "--batch", "64", "--topology", "testbed", "--budget-s", "3",
                 "--iterations", "40", "--no-sfb", "--prior", "gnn", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prior"] == "gnn"
    assert main(["plan", "--model", "cnn", "--tiny", "--batch", "64", "--topology", "testbed", "--prior", "uniform",
                 "--weights", str(tmp_path / "w.pt"), "--json"]) != 0
    assert "--weights is for the GNN prior" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["transformer", "bert-small"])
def test_mcts_plans_compile_to_equivalent_graphs(name):
    """What MCTS picks trains exactly like the original on 4 local devices, and so does a plan
    mixing random actions of its space (device sets x AllReduce/PS/Duplicate/Model-parallel) with
    its per-plan shares and buckets."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "compiler"))
    from test_equivalence import verify

    _, a = analysis_of(name)
    topo = load_topology("local:4")
    sim = Simulator(a, topo)
    result = mcts_search(sim, topo, MctsOptions(budget_s=3, iterations=60, seed=4))
    verify(name, result.strategy, 4)
    rng = np.random.default_rng(0)
    actions = candidate_actions(topo)
    mixed = dataclasses.replace(result.strategy, groups=tuple(actions[int(rng.integers(len(actions)))]
                                                              for _ in range(sim.num_groups)))
    verify(name, mixed, 4)
