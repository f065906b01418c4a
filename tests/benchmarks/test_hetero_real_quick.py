"""benchmarks/hetero_real.py end to end (CI smoke test, root): on the compute-heterogeneous emulated
cluster, the cnn trains plain on the fastest host, under every tag_tf row and under
MultiWorkerMirroredStrategy; every row's losses are the plain run's, and each tag_tf row names its
plan and its predicted step. Timings are reported, never asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tag_tf.emulate import system

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISSING = system.requirements_missing()


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_hetero_real_quick(tmp_path):
    out = tmp_path / "hetero.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "hetero_real.py"), "--quick", "--out",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["clusters"]["compute"]["models"]["cnn"]
    assert [h["name"] for h in data["clusters"]["compute"]["measured"]["hosts"]] == ["fast", "half", "quarter"]
    for name in ("plain", "plain-as-written", "tag-auto", "tag-dp", "tag-dp-p", "tag-horovod", "tag-horovod-p",
                 "tag-best-subset", "mwms"):
        assert "median_ms" in rows[name], (name, rows[name])
        assert abs(rows[name]["last_loss"] - rows["plain"]["last_loss"]) <= 1e-4 * abs(rows["plain"]["last_loss"]), name
    assert "absent" in rows["horovod"] or "median_ms" in rows["horovod"]
    for name in ("tag-auto", "tag-dp", "tag-dp-p", "tag-horovod", "tag-horovod-p", "tag-best-subset"):
        assert rows[name]["predicted_ms"] > 0 and rows[name]["plan"]["hosts"], name
    auto = rows["tag-auto"]
    if auto["plan"]["one_device"] and auto["plan"]["hosts"] == ["fast"]:     # the chief's host alone: its own session
        assert any("runs in this process's own session" in line for line in auto["log"]), auto["log"]
    shares = rows["tag-dp-p"]["plan"]["shares"]
    assert shares[0] > shares[1] > shares[2], shares          # discovery saw 1 : 0.5 : 0.25
    assert rows["tag-dp"]["plan"]["shares"] is None
    verdict = data["verdicts"]["compute/cnn"]
    assert verdict["best_baseline"] in ("plain", "plain-as-written", "tag-dp", "tag-dp-p", "tag-horovod",
                                        "tag-horovod-p", "tag-best-subset")
