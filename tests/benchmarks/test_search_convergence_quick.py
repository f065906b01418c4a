"""The search-convergence benchmark end to end in a small size: a longer MCTS beside a previous
run's 60 s figures, the local search's headroom over the best plan known, and RESULTS' table."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_search_convergence_quick(tmp_path):
    short = tmp_path / "short.json"       # a strategy-creator run's figures (hand-made: a slow local plan)
    short.write_text(json.dumps({"budget_s": 60, "rows": {"testbed/mlp": {
        "local": {"iteration_time_s": 10.0}, "mcts": {"iteration_time_s": 9.0}}}}))
    md = tmp_path / "RESULTS.md"
    md.write_text("before\n<!-- search-convergence:begin -->\nold\n<!-- search-convergence:end -->\nafter\n")
    out = tmp_path / "conv.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "search_convergence.py"), "--budget", "3",
                        "--pairs", "testbed/mlp", "--short", str(short), "--out", str(out), "--markdown", str(md)],
                       cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    row = data["rows"]["testbed/mlp"]
    best = row["mcts_long"]["iteration_time_s"]
    assert 0 < best < 9.0 and row["best_known_s"] == best       # any real plan beats the made-up 9 s
    assert row["local_headroom"] == 10.0 / best and row["long_over_60s"] == 9.0 / best
    assert data["local_at_least_10pct_off_best_known"] == ["testbed/mlp"]
    text = md.read_text()
    assert "old" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "| testbed | mlp |" in text
