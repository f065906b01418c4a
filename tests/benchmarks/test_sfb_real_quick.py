"""benchmarks/sfb_real.py --quick end to end (CI smoke test): DP and DP+SFB on two real server
processes train exactly like one device. Timings are reported, never asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sfb_real_quick(tmp_path):
    out = tmp_path / "sfb_real.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sfb_real.py"), "--quick", "--models", "mlp",
                        "--out", str(out)], cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["models"]["mlp"]["rows"]
    assert set(rows) == {"dp", "dp+sfb", "dp+sfb-all"} and data["processes"] == 2
    for key, row in rows.items():
        assert row["exact"]["ok"], (key, row["exact"])
        assert row["median_ms"] > 0 and row["timed_steps"] == 5
    # Every gradient SCIP wants rebuilt is gathered instead of reduced.
    assert rows["dp+sfb-all"]["duplicated_gradients"] >= 1
    assert rows["dp+sfb-all"]["collectives"] < rows["dp"]["collectives"]
