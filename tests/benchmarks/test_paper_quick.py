"""`python -m benchmarks run all --quick`: the paper-evaluation harness end to end (a smoke test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_paper_harness_quick(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\nkept above\n<!-- paper-evaluation:begin -->\nold\n<!-- paper-evaluation:end -->\nkept below\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TAG_TF_GNN_WEIGHTS", None)          # the shipped weights
    env.pop("TAG_TF_GNN_WEIGHTS_MINUS", None)    # TAG--: trained here for 2 searches without the cnn
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "all", "--quick", "--results", str(tmp_path),
                           "--markdown", str(md)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    iteration = json.loads((tmp_path / "paper_iteration.json").read_text())
    assert iteration["quick"] and iteration["simulated"]
    for row in iteration["rows"].values():
        auto, best = row["simulated_s"]["auto"], min(v for v in row["simulated_s"].values() if v is not None)
        assert auto == best and row["lower_bound_s"] > 0          # auto is never beaten by a baseline
        assert "paper_s" not in row                                 # tiny models: no paper figure beside
    strategies = json.loads((tmp_path / "paper_strategies.json").read_text())
    assert set(strategies["rows"]) == {"mlp", "cnn", "transformer"}
    homogeneous = json.loads((tmp_path / "paper_homogeneous.json").read_text())
    relative = homogeneous["relative_to_expert"]
    # auto is never slower than the baselines it searches against (the one-GPU expert is not one)
    assert relative["expert (one GPU)"] == 1.0 and relative["auto"] >= max(relative["dp"] or 0, relative["horovod"] or 0)
    assert homogeneous["paper_relative_to_expert"] is None           # tiny model: no paper figure beside
    overhead = json.loads((tmp_path / "paper_overhead.json").read_text())
    assert set(overhead["rows"]) == {"mlp", "cnn", "transformer"} and overhead["paper_minutes"] is None
    assert all(r["total_s"] >= r["mcts_s"] > 0 for r in overhead["rows"].values())
    sfb = json.loads((tmp_path / "paper_sfb.json").read_text())
    assert all(r["simulated_s"]["dp+sfb"] <= r["simulated_s"]["dp"] for r in sfb["rows"].values())
    generalisation = json.loads((tmp_path / "paper_generalisation.json").read_text())
    assert len(generalisation["cases"]) == 3 and generalisation["per_model"]
    held_out = [int(c["topology"].split(":")[1]) for c in generalisation["cases"]]
    assert min(held_out) >= 10_000                # held-out seeds only (training draws random:0..N-1)
    assert generalisation["weights"].endswith("tag_tf/search/weights/gnn.pt")
    tag_minus = generalisation["held_out_models"]["cnn"]
    assert tag_minus["model"] == "cnn" and tag_minus["weights_minus_meta"]["held_out_model"] == "cnn"
    assert "cnn" not in tag_minus["weights_minus_meta"]["models"]
    for preset in ("testbed", "cloud"):
        row = tag_minus["presets"][preset]
        assert row["tag"]["speedup_over_dp"] >= 1.0 and row["tag--"]["speedup_over_dp"] >= 1.0
    real = json.loads((tmp_path / "paper_real.json").read_text())

    assert real["quick"] and real["measured"] and not real["simulated"]
    assert len(real["rows"]) == 3 * (1 + 2 * 4)         # 3 models: one device, 2 setups x 4 strategies
    for model in ("mlp", "cnn", "transformer"):
        for setup in ("local2", "2proc"):
            rows = {r: real["rows"][f"{model}/{setup}/{r}"] for r in ("dp", "horovod", "auto", "auto-local")}
            assert all(row["equivalent"] for row in rows.values()), (model, setup)
            # planned on the local machine model, auto-local is never predicted slower than the
            # baselines distribute ran (the same model judges both)
            best = min(rows["dp"]["predicted_ms"], rows["horovod"]["predicted_ms"])
            assert rows["auto-local"]["predicted_ms"] <= best * (1 + 1e-6), (model, setup)
    text = md.read_text()
    assert "kept above" in text and "kept below" in text and "\nold\n" not in text
    assert "Homogeneous cluster (QUICK" in text and "Planning overhead on unseen topologies (QUICK" in text
    assert "Sufficient factor broadcasting (QUICK" in text and "Real execution here (QUICK" in text
    assert "Generalisation to unseen topologies (QUICK" in text and "TAG-- (QUICK" in text
    assert "QUICK smoke run" in text and (tmp_path / "plots" / "paper_iteration.png").is_file()
