"""The scale study's section of RESULTS.md (benchmarks/scale.py) is rendered from its JSON alone, and
its verdicts are recomputed from the rows, never typed."""
from __future__ import annotations

import json
import os

import pytest

from benchmarks.markdown import measured_when
from benchmarks.report import RESULTS


@pytest.fixture(scope="module")
def data() -> dict:
    with open(os.path.join(RESULTS, "scale.json")) as f:
        return json.load(f)


def test_every_row_and_verdict_is_rendered_from_the_json(data):
    from benchmarks.scale import _label, render, verdicts

    text = render(data)
    assert measured_when(data) in text and "SIMULATED" in text
    assert verdicts(data) == data["verdicts"]
    for key, value in data["verdicts"].items():
        assert f"- {key}: {value}" in text
    for model, sizes in data["models"].items():
        for size, row in sizes.items():
            label = _label(model, row, data)
            for name, s in row["simulation"]["strategies"].items():
                assert f"| {label} | {size} | {name} | {s['iteration_ms']:.2f} | {s['call_ms']:.1f} |" in text
            plan = row.get("plan")
            if plan and "error" not in plan:
                floor = f"{plan['x_split_floor']:.2f}" if "x_split_floor" in plan else "-"
                assert f"| {plan['plan_ms']:.2f} | {plan['x_lower_bound']:.2f} | {floor} | {plan['vs_horovod_p']:.2f}x |" in text


def test_collapsed_simulations_agree_with_full_ones_where_both_ran(data):
    ran = [s for sizes in data["models"].values() for row in sizes.values()
           for s in row["simulation"]["strategies"].values() if "difference" in s]
    assert ran and all(s["exact"] and s["difference"] < 1e-9 and s["memory_same"] for s in ran)
    assert all(s["devices_simulated"] < 16 for sizes in data["models"].values() for row in sizes.values()
               for s in row["simulation"]["strategies"].values())


def test_a_verdict_fails_when_its_figure_misses_the_target(data):
    import copy

    from benchmarks.scale import verdicts

    worse = copy.deepcopy(data)
    row = worse["models"]["resnet101"]["256"]["simulation"]["strategies"]["dp"]
    row["call_ms"] = 25.0
    assert verdicts(worse)["resnet101 256: one DP simulation <= 20 ms"] == "25.0 ms: NOT MET"


def test_rows_of_an_earlier_run_say_their_code(data):
    import copy

    from benchmarks.scale import render

    later = copy.deepcopy(data)
    for size, row in later["models"]["resnet101"].items():
        row["when"] = {"commit": data["commit"] if size == "16" else "1111111", "date": data["date"]}
    text = render(later)
    assert "| resnet101 | 16 |" in text
    assert f"| resnet101 (code 1111111, {data['date']}) | 256 |" in text
