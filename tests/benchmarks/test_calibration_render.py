"""benchmarks/calibration.py's `render`: the calibration section of RESULTS.md from
results/calibration.json alone, its summary figures agreeing with the rows they summarise."""
from __future__ import annotations

import json
import os

from benchmarks.calibration import render
from benchmarks.markdown import measured_when
from benchmarks.report import RESULTS


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
    fit = data["calibration"]["fit"]
    fit["fitted"]["fig-iter/dp/vgg19"]["error"] = 0.5
    data["date"], data["commit"] = "2026-01-02", "abc1234"
    text = render(data)
    nominal = fit["nominal"]["fig-iter/dp/vgg19"]
    calibrated = fit["fitted"]["fig-iter/dp/vgg19"]["simulated_s"]
    assert (f"| fig-iter/dp/vgg19 | fit | 1.4561 | {nominal['simulated_s']:.4f} | {nominal['error'] * 100:+.0f}% | "
            f"{calibrated:.4f} | +50.0% |") in text
    assert "measured 2026-01-02 on code abc1234" in text


def test_the_shipped_calibration_is_judged_beside_the_re_fit_and_kept_unless_that_is_no_worse():
    from benchmarks.calibration import not_worse

    data = _data()
    order = {m: {"agrees": m != "vgg19"} for m in ("vgg19", "resnet101", "bert-small")}
    data["shipped"] = {"file": "tag_tf/profile/data/calibration_testbed.json", "mape_fitted": 0.123,
                       "mape_held_out": 0.114, "order": order}
    data["in_use"] = "shipped"
    text = render(data)
    assert "| shipped (`tag_tf/profile/data/calibration_testbed.json`) | 12.3% | 11.4% | 2/3 | yes |" in text
    assert f"| this run's re-fit | {data['mape_fitted']:.1%} | {data['mape_held_out']:.1%} |" in text
    assert "The presets keep the shipped calibration: on this code it is 12.3% off the fitted figures" in text
    data["in_use"] = "re-fit"
    assert "This re-fit replaced the shipped calibration" in render(data)
    shipped = {"mape_fitted": 0.123, "mape_held_out": 0.114}
    assert not not_worse({"mape_fitted": 0.112, "mape_held_out": 0.182}, shipped)     # better fitted, worse held out
    assert not_worse({"mape_fitted": 0.12, "mape_held_out": 0.114}, shipped)
