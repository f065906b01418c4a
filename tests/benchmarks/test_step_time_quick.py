"""The step-time benchmark's --quick mode runs end to end (CI smoke test): every configuration (tag_tf's
and TensorFlow's own strategies; Horovod where installed), in its own processes, trains the same
losses as one device, the traced-step breakdown is filled, and the local machine model predicts
every tag_tf row on its own setup. Timings are reported, never asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_step_time_quick(tmp_path):
    out = tmp_path / "step_time.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "step_time.py"), "--quick", "--breakdown",
                        "--predict", "--db", str(tmp_path / "profiles"), "--out", str(out)],
                       cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert not [k for k, r in rows.items() if "error" in r], rows
    single = rows["cnn/tf1-single"]
    assert {"cnn/tf2-single", "cnn/mirrored-local2", "cnn/mwms-2proc", "cnn/tag-horovod-2proc-tfconfig"} <= set(rows)
    assert not [k for k in rows if "-auto-" in k]
    for key, row in rows.items():
        if "absent" in row:          # Horovod is an optional extra; CI does not install it
            assert key == "cnn/horovod-2proc", key
            continue
        assert row["median_ms"] > 0 and row["first_step_s"] > 0
        assert row["last_loss"] == pytest.approx(single["last_loss"], rel=1e-4), key
        assert row["breakdown"]["compute"] > 0 and row["breakdown"]["ops"] > 0, key
        # --predict: every tag_tf row's plan predicted by the local machine model on its own setup.
        if "/tag-" in key:
            setup = {"local2": "1proc-2cpu", "tfconfig": "2proc-1cpu-tasks", "chiefdriven": "2proc-1cpu"}
            assert row["predicted_ms"] > 0 and row["predicted_setup"] == setup[key.rsplit("-", 1)[1]], key
    assert data["prediction"]["rows"] == {"all": 5, "local2": 2, "2proc": 3}
    assert set(data["prediction"]["mape"]) == {"all", "local2", "2proc"}

    # RESULTS.md's tables are regenerated from that JSON between their markers, the rest kept.
    sys.path.insert(0, ROOT)
    from benchmarks import step_time

    md = tmp_path / "RESULTS.md"
    md.write_text(f"above\n{step_time.BEGIN}\nold\n{step_time.END}\nbelow\n")
    step_time.write_markdown(json.loads(out.read_text()), str(md))
    text = md.read_text()
    assert text.startswith("above\n") and text.endswith("below\n") and "\nold\n" not in text
    assert f"| cnn | tf1-single | {single['median_ms']:.1f} |" in text
    assert "| cnn | " in text.split("faster of MWMS and Horovod |")[1]      # the best-against-peer row
    assert "| cnn | tag-horovod-2proc-tfconfig |" in text.split("| setup modelled |")[1]
    assert "Prediction error (MAPE): one process" in text


def test_rounds_are_predicted_like_they_are_measured(tmp_path):
    """A row is its median round; its prediction is the median of its rounds' predictions (each from
    the model measured in that round, in that round's own ProfileDB)."""
    sys.path.insert(0, ROOT)
    from benchmarks.step_time import representative, round_db

    found = [{"median_ms": 3.0, "predicted_ms": 2.0, "round": 1}, {"median_ms": 1.0, "predicted_ms": 1.5, "round": 2},
             {"median_ms": 2.0, "predicted_ms": 9.0, "round": 3}]
    row = representative(found)
    assert row["round"] == 3 and row["median_ms"] == 2.0 and row["round_medians_ms"] == [3.0, 1.0, 2.0]
    assert row["predicted_ms"] == 2.0 and row["round_predictions_ms"] == [2.0, 1.5, 9.0]
    assert "predicted_ms" not in representative([{"median_ms": 1.0}, {"median_ms": 2.0}])
    assert representative([{"median_ms": 1.0}, {"error": "boom"}]) == {"error": "boom"}

    class Args:
        db, repeats = str(tmp_path), 3
    assert [round_db(Args, r) for r in range(3)] == [str(tmp_path / f"round{r}") for r in (1, 2, 3)]
    Args.repeats = 1
    assert round_db(Args, 0) == str(tmp_path)
    Args.db = None
    assert round_db(Args, 0) != round_db(Args, 1)
