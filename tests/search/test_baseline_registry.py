"""One registry of baselines (search/registry.REGISTRY): adding one is a `register` call and the
function that makes its plan; the planner's requests, the search's starting points, `plan --json`,
the demo's table and the paper harness all list it without another edit."""
from __future__ import annotations

import json

import pytest

from tag_tf.search import registry
from tag_tf.search.registry import BaselineSpec, register, unregister
from tag_tf.strategy import Option, Strategy


def _first_device_only(num_groups, topology):
    """The toy baseline's one function: the whole model on device 0."""
    return Strategy.uniform(num_groups, (0,), Option.ALLREDUCE, name="toy")


@pytest.fixture
def toy():
    spec = register(BaselineSpec("toy", "Toy", "the whole model on device 0", rule=_first_device_only))
    try:
        yield spec
    finally:
        unregister("toy")


def test_every_list_follows_the_registry(toy):
    from benchmarks.paper import SYSTEMS
    from tag_tf.frontend.loading import strategy_help
    from tag_tf.frontend.planning import BASELINE_REQUESTS, PLANNED, WHOLE_REPLICA_BASELINES, request_key

    assert "toy" in BASELINE_REQUESTS and "toy" in PLANNED and "toy+sfb" in PLANNED
    assert request_key("toy") == "toy"
    assert "toy" not in WHOLE_REPLICA_BASELINES          # its roles are its spec's
    assert list(SYSTEMS)[-2:] == ["toy", "auto"] and "toy" in strategy_help()
    assert registry.label("toy") == "Toy (toy)" and registry.label("dp") == "DP-NCCL (dp)"


def test_the_registry_refuses_what_would_be_ambiguous():
    with pytest.raises(ValueError, match="taken or reserved"):
        register(BaselineSpec("dp", "again", "", rule=_first_device_only))
    with pytest.raises(ValueError, match="reserved"):
        register(BaselineSpec("auto", "auto", "", rule=_first_device_only))
    with pytest.raises(ValueError, match="exactly one of rule and searched"):
        BaselineSpec("both", "both", "")
    with pytest.raises(ValueError, match="template"):
        register(BaselineSpec("second-template", "t", "", rule=_first_device_only, template=True))
    assert registry.template_baseline() == "horovod-p"
    assert registry.fixed_baselines() == ("dp", "dp-p", "horovod", "horovod-p")
    assert registry.fittable_baselines() == registry.whole_replica_baselines()


def test_a_new_baseline_appears_in_plan_json_the_demo_table_and_the_paper_harness(toy, capsys, tmp_path):
    from conftest import analysis_of

    from benchmarks import paper
    from tag_tf.frontend.cli import main
    from tag_tf.frontend.demo import plan_times_ms
    from tag_tf.search.mcts import MctsOptions, mcts_search
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology import load_topology

    assert main(["plan", "--model", "mlp", "--tiny", "--topology", "testbed", "--budget-s", "1", "--no-sfb",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["baselines"]["toy"] > 0 and out["best_baseline"] is not None

    _, analysis = analysis_of("mlp", num_groups=4)
    topology = load_topology("testbed")
    result = mcts_search(Simulator(analysis, topology), topology, MctsOptions(budget_s=0.5, seed=0))
    assert "Toy (toy)" in plan_times_ms(result)

    paper.run(["iteration"], quick=True, budget=0.3, results_dir=str(tmp_path), markdown=None)
    table = paper.render(str(tmp_path), str(tmp_path))
    header = next(line for line in table.splitlines() if line.startswith("| preset | model |"))
    assert "| toy | auto |" in header
    rows = [line for line in table.splitlines() if line.startswith("| testbed |")]
    assert rows and all(line.count("|") == header.count("|") for line in rows)
