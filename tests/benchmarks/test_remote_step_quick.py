"""benchmarks/remote_step.py end to end (CI smoke test): the layouts of a trivial step (client-driven,
and between-graph with each process driving its own half) run on two real server processes and the
JSON holds their medians. Timings are reported, never asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_remote_step_quick(tmp_path):
    out = tmp_path / "remote_step.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "remote_step.py"), "--steps", "10",
                        "--rounds", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    ways = {"local", "remote-fed", "remote-pulled", "exchange-client", "collective-client", "collective-each"}
    assert data["measured"] and set(data["median_ms"]) == ways
    assert all(v > 0 for v in data["median_ms"].values()) and len(data["rounds_ms"]) == 1
    assert set(data["rounds_ms"][0]) == ways and "between_graph_saves_ms" in data
