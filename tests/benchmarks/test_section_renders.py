"""The strategy-creator and simulator-accuracy sections of RESULTS.md are rendered from their results
JSON alone: the tables come from the rows, and the figures in the prose are computed from them."""
from __future__ import annotations

import json
import os
import statistics

import pytest

from benchmarks.report import RESULTS


def _load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def accuracy():
    """benchmarks.simulator_accuracy, imported without leaving its runtime environment behind (its import
    sets TensorFlow's thread and oneDNN variables for the benchmark's own process)."""
    saved = dict(os.environ)
    try:
        from benchmarks import simulator_accuracy
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return simulator_accuracy


def test_strategy_creator_section_from_its_json():
    from benchmarks.strategy_creator import render

    data = _load("strategy_creator.json")
    text = render(data)
    rows = data["rows"]
    r = rows["testbed/inceptionv3"]
    local, mcts = r["local"]["iteration_time_s"], r["mcts"]["iteration_time_s"]
    assert (f"| testbed | inceptionv3 | {r['groups']} ({r['group_balance']:.2f}) -> "
            f"{r['mcts']['groups_after_refinement']} | ") in text
    assert f"| {local * 1e3:.1f} | {mcts * 1e3:.1f} | {local / mcts:.2f}x |" in text
    # The prose's ranges, recomputed from the rows.
    beat = [x["mcts"]["time_to_beat_dp_s"] for x in rows.values() if x["mcts"]["time_to_beat_dp_s"] is not None]
    assert f"within {min(beat):.1f}-{max(beat):.1f} s of starting" in text
    testbed = [min(v for v in x["baselines_s"].values() if v is not None) / x["mcts"]["iteration_time_s"]
               for k, x in rows.items() if k.startswith("testbed/")]
    assert f"({min(testbed):.1f}-{max(testbed):.1f}x faster on the testbed)" in text
    assert f"{local / mcts - 1:.0%} faster on testbed/inceptionv3" in text
    sims = [x["local"]["sims_per_s"] for x in rows.values()]
    assert f"against {min(sims):.0f}-{max(sims):.0f} for the local search" in text
    assert "date and code not recorded" in text                      # this JSON has no stamp
    assert "previous run" not in text and "68 ms" not in text and "11.6 us" not in text


def test_strategy_creator_section_says_when_and_judges_the_recorded_target():
    from benchmarks.strategy_creator import TARGET, render

    data = {**_load("strategy_creator.json"), "date": "2026-12-01", "commit": "abc1234", "target": TARGET}
    text = render(data)
    assert "measured 2026-12-01 on code abc1234" in text
    count = data["targets"]["mcts_10pct_faster_than_local_models"]
    assert f"the target, 10% on {TARGET['mcts_over_local_models']} models, is " \
           f"{'met' if count >= TARGET['mcts_over_local_models'] else 'NOT met'}" in text


def test_simulator_accuracy_section_from_its_json(accuracy):
    data = _load("simulator_accuracy.json")
    text = accuracy.render(data)
    rows = data["rows"]

    def mape(rs):
        return statistics.mean(abs(r["predicted_s"] / r["measured_s"] - 1) for r in rs)
    one = [r for r in rows if r["setup"] == "1proc-4cpu"]
    two = [r for r in rows if r["setup"] == "2proc-2cpu"]
    assert f"| all | {len(rows)} | {mape(rows):.1%} | {data['summary']['all']['spearman']:.3f} |" in text
    assert f"| one process, 4 devices | {len(one)} | {mape(one):.1%} |" in text
    assert f"| two server processes | {len(two)} | {mape(two):.1%} |" in text
    plain = statistics.mean(abs(r["plain_predicted_s"] / r["measured_s"] - 1) for r in rows)
    assert f"| plain simulator (no local calibration), all | {len(rows)} | {plain:.1%} |" in text
    # The fusion ratios, recomputed from the rows they compare.
    by = {(r["model"], r["strategy"]): r for r in rows}
    dp, fused = by["transformer", "2p-dp4"], by["transformer", "2p-dp4-fused"]
    measured = dp["measured_s"] / fused["measured_s"]
    predicted = dp["predicted_s"] / fused["predicted_s"]
    assert f"| transformer | 2proc-2cpu | 89 → 6 | {measured:.2f} | {predicted:.2f} | yes |" in text
    assert f"{measured:.1f}x measured, {predicted:.1f}x predicted" in text
    mlp = by["mlp", "2p-dp4"]["measured_s"] / by["mlp", "2p-dp4-fused"]["measured_s"]
    assert f"{1 / mlp:.2f}x slower across processes in this run" in text
    assert f"{data['elapsed_s'] / 60:.1f} min" in text
    assert "date and code not recorded" in text
    assert "previous run" not in text and "2026-11-26" not in text and "60 GB/s" not in text


def test_simulator_accuracy_section_says_when_it_was_measured(accuracy):
    data = {**_load("simulator_accuracy.json"), "date": "2026-12-01", "commit": "abc1234"}
    assert "measured 2026-12-01 on code abc1234" in accuracy.render(data)
