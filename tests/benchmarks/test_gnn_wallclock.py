"""The equal-wall-clock GNN comparison: its verdict, its table, and its large clusters."""
from pathlib import Path

from benchmarks import gnn_wallclock


def _row(kind: str, budget: float, gnn: float, uniform: float) -> dict:
    return {"kind": kind, "topology": f"{kind}-x", "devices": 64, "model": "resnet101", "batch": 256,
            "budget_s": budget, "gnn": {"iteration_time_s": gnn, "simulations": 10},
            "uniform": {"iteration_time_s": uniform, "simulations": 20}, "gnn_over_uniform": gnn / uniform}


def test_the_gnn_is_the_verdict_only_where_it_is_faster_at_every_budget():
    rows = [_row("small", 5, 0.9, 1.0), _row("large", 5, 0.8, 1.0), _row("small", 15, 1.0, 1.0),
            _row("large", 15, 1.1, 1.0)]
    summary = gnn_wallclock.summarize(rows)
    assert summary["5s/all"]["gnn_faster"] == 2 and summary["15s/all"]["ties"] == 1
    assert summary["15s/large"]["uniform_faster"] == 1
    assert summary["verdict"] == "uniform"           # at 15 s the GNN is not ahead
    assert gnn_wallclock.summarize(rows[:2])["verdict"] == "gnn"
    text = gnn_wallclock.render({"rows": rows, "summary": summary, "seconds": 12.0})
    assert "| 5s/all | 2 | 0.849 | 2 | 0 | 0 |" in text and "Verdict: `uniform`" in text


def test_a_large_cluster_is_eight_gpu_machines_of_three_types_with_every_pair_linked():
    from tag_tf.topology.load import load_topology

    topo = load_topology(gnn_wallclock.large_topology(64, 64))
    assert topo.num_devices == 64 and topo.num_machines == 8
    assert {d.type for d in topo.devices} == {"H100", "A100-40GB", "V100-32GB"}
    bw = topo.inter_bandwidth
    assert all(100e9 / 8 * 0.99 <= bw[i][j] <= 200e9 / 8 * 1.01 for i in range(8) for j in range(8) if i != j)


def test_auto_s_default_prior_is_the_shipped_benchmark_s_verdict():
    import json
    import os

    from tag_tf.search.priors import DEFAULT_PRIOR

    path = os.path.join(os.path.dirname(gnn_wallclock.__file__), "results", "gnn_wallclock.json")
    assert json.loads(Path(path).read_text())["summary"]["verdict"] == DEFAULT_PRIOR
