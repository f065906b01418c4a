"""benchmarks/calibration.py's `render`: the calibration section of RESULTS.md from
results/calibration.json alone, its summary figures agreeing with the rows they summarise."""
from __future__ import annotations

import json
import os

from benchmarks.calibration import render
from benchmarks.report import RESULTS, measured_when


def _data() -> dict:
    with open(os.path.join(RESULTS, "calibration.json")) as f:
        return json.load(f)


def test_mape_line_and_tables_follow_the_rows():
    data = _data()
    text = render(data)
    fit = data["calibration"]["fit"]
    fitted = sum(abs(r["error"]) for r in fit["fitted"].values()) / len(fit["fitted"])
    held = sum(abs(r["error"]) for r in fit["held_out"].values()) / len(fit["held_out"])
    nominal = sum(abs(fit["nominal"][k]["error"]) for k in fit["held_out"]) / len(fit["held_out"])
    assert f"MAPE: fitted {fitted:.1%} " in text
    assert f"held out {held:.1%} (datasheet {nominal:.1%})." in text
    assert f"calibrated, {fitted:.1%} and {held:.1%}" in text          # the reading states the same figures
    rows = [line for line in text.splitlines() if line.startswith(("| fig-iter/", "| tab-sfb/"))]
    assert len(rows) == len(fit["fitted"]) + len(fit["held_out"])
    vgg = data["auto"]["testbed/vgg19"]
    assert f"| testbed | vgg19 | {vgg['dp_s'] * 1e3:.1f} | {vgg['auto_s'] * 1e3:.1f} | " in text
    assert measured_when(data) in text


def test_a_changed_figure_changes_the_section():
    data = _data()
    data["calibration"]["fit"]["fitted"]["fig-iter/dp/vgg19"]["error"] = 0.5
    data["date"], data["commit"] = "2026-01-02", "abc1234"
    text = render(data)
    assert "| fig-iter/dp/vgg19 | fit | 1.4561 | 0.2766 | -81% | 1.3715 | +50.0% |" in text
    assert "measured 2026-01-02 on code abc1234" in text
