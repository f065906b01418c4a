"""GNN training: MCTS visit records, weights files (and their refusals), a loss that goes down, and
`tag-tf train-gnn` end to end in a smoke size, resumed from its checkpoint."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import analysis_of

from tag_tf.errors import WeightsError
from tag_tf.frontend.cli import main
from tag_tf.search.gnn import GnnPrior, GraphFeatures, load_weights, save_weights, shipped_weights, untrained
from tag_tf.search.gnn_training import PAPER_MODELS, loss_on, samples_of, train_step
from tag_tf.search.mcts import MIN_RECORD_VISITS, MctsOptions, candidate_actions, decision_order, mcts_search
from tag_tf.sim.simulator import Simulator
from tag_tf.topology.load import load_topology

FORTY_EIGHT = {"name": "48", "machines": [{"name": "m", "replicas": 6, "gpus": "8x V100-32GB", "intra": "nvlink"}],
               "inter": {"switch": "25Gbps"}}


def records_for(name: str, topology: str | dict, iterations: int = 64):
    _, a = analysis_of(name)
    topo = load_topology(topology)
    sim = Simulator(a, topo)
    records = []
    mcts_search(sim, topo, MctsOptions(budget_s=60, iterations=iterations, polish=False, heterog=False),
                prior="uniform", record=records)
    features = GraphFeatures(sim, topo, candidate_actions(topo), decision_order(a))
    return a, records, features


def test_mcts_records_its_well_visited_vertices():
    a, records, features = records_for("mlp", "random:0", iterations=96)
    assert records and records[0].prefix == ()
    order = decision_order(a)
    for r in records:
        assert r.visits.sum() >= MIN_RECORD_VISITS and r.group == order[len(r.prefix)]
        assert len(r.visits) == len(features.actions) and (r.report is None) == (r.prefix == ())


def test_weights_round_trip_and_refusals(tmp_path):
    net = untrained(3)
    path = str(tmp_path / "w.pt")
    save_weights(net, path, {"seed": 3})
    loaded, meta = load_weights(path)
    assert meta == {"seed": 3}
    for k, v in net.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k])
    with pytest.raises(WeightsError, match="no such GNN weights file"):
        load_weights(str(tmp_path / "missing.pt"))
    (tmp_path / "junk.pt").write_bytes(b"\x00not a torch file" * 10)
    with pytest.raises(WeightsError, match="junk.pt: not a GNN weights file"):
        load_weights(str(tmp_path / "junk.pt"))
    raw = Path(path).read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WeightsError, match="cut.pt: not a GNN weights file"):
        load_weights(str(tmp_path / "cut.pt"))
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(WeightsError, match="not a tag_tf.gnn/1 weights file"):
        load_weights(str(tmp_path / "other.pt"))
    blob = torch.load(path, weights_only=True)
    blob["architecture"] = {**blob["architecture"], "width": 32}
    torch.save(blob, tmp_path / "narrow.pt")
    with pytest.raises(WeightsError, match="architecture"):
        load_weights(str(tmp_path / "narrow.pt"))
    blob = torch.load(path, weights_only=True)
    del blob["state_dict"]["decode.0.weight"]
    torch.save(blob, tmp_path / "partial.pt")
    with pytest.raises(WeightsError, match="do not fit the network"):
        load_weights(str(tmp_path / "partial.pt"))


def test_the_shipped_weights_and_what_made_them(monkeypatch):
    monkeypatch.delenv("TAG_TF_GNN_WEIGHTS", raising=False)
    path = shipped_weights()
    assert path is not None and path.endswith(os.path.join("search", "weights", "gnn.pt"))
    assert os.path.getsize(path) <= 20 * 2**20
    _, meta = load_weights(path)
    with open(os.path.join(os.path.dirname(path), "gnn.json")) as f:
        provenance = json.load(f)
    assert provenance["produced_by"] == meta["command"] and provenance["produced_by"].startswith("tag-tf train-gnn")
    assert provenance["seed"] == meta["seed"] and provenance["data"]["searches"] == meta["searches"]
    assert set(PAPER_MODELS) <= set(meta["models"]) and meta["topologies"] == "random:0..99"
    monkeypatch.setenv("TAG_TF_GNN_WEIGHTS", "/elsewhere/w.pt")
    assert shipped_weights() == "/elsewhere/w.pt"


@pytest.mark.parametrize("topology", ["local:1", FORTY_EIGHT])
def test_the_shipped_weights_give_finite_priors_on_1_and_48_devices(monkeypatch, topology):
    monkeypatch.delenv("TAG_TF_GNN_WEIGHTS", raising=False)
    path = shipped_weights()
    net, _ = load_weights(path)
    _, a = analysis_of("mlp")
    topo = load_topology(topology)
    assert topo.num_devices in (1, 48)
    sim = Simulator(a, topo)
    actions = candidate_actions(topo)
    prior = GnnPrior(net, GraphFeatures(sim, topo, actions, decision_order(a)))
    p = prior((), decision_order(a)[0], None)
    assert p.shape == (len(actions),) and np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0, abs=1e-5)
    result = mcts_search(sim, topo, MctsOptions(budget_s=30, iterations=12, polish=False), prior="gnn", weights=path)
    assert result.found and result.prior == "gnn"


def test_a_training_step_lowers_the_loss_on_a_fixed_batch():
    _, records, features = records_for("mlp", "random:0", iterations=96)
    batch = samples_of(records, features)
    net = untrained(0)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    before = float(loss_on(net, batch))
    for _ in range(10):
        train_step(net, optimizer, batch)
    after = float(loss_on(net, batch))
    assert np.isfinite(before) and after < before


def test_train_gnn_command_end_to_end_and_resumed(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train-gnn", "--models", "mlp,cnn", "--tiny", "--topologies", "2", "--iterations", "16", "--out", str(out),
            "--json"]
    assert main([*args, "--max-searches", "2"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["searches"] == 2 and meta["seed"] == 0 and meta["models"] == ["mlp", "cnn"]
    for name in ("weights.pt", "weights.json", "loss.jsonl", "loss.png", "checkpoint.pt", "checkpoint.json"):
        assert (out / name).is_file(), name
    load_weights(str(out / "weights.pt"))
    assert main([*args, "--max-searches", "3"]) == 0          # resumes: one more search, not three
    meta = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert meta["searches"] == 3 and [r["search"] for r in rows] == [1, 2, 3]
    assert {r["topology"] for r in rows} <= {"random:0", "random:1"}
    assert main(["train-gnn", "--models", "mlp,resnet5000", "--out", str(tmp_path / "x")]) == 2
    assert main(["train-gnn", "--models", "mlp", "--hold-out", "cnn", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "resnet5000" in err and "held-out model 'cnn'" in err
