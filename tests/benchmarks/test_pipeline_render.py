"""The pipelining study's section of RESULTS.md (benchmarks/pipeline.py) is rendered from its JSON,
its verdicts recomputed from the rows, and a target no plan can reach under the op costs is named."""
from __future__ import annotations

import copy
import json
import os

import pytest

from benchmarks.report import RESULTS


@pytest.fixture(scope="module")
def data() -> dict:
    with open(os.path.join(RESULTS, "pipeline.json")) as f:
        return json.load(f)


def test_every_row_and_verdict_is_rendered_from_the_json(data):
    from benchmarks.pipeline import render, verdicts

    assert verdicts(data["rows"]) == data["verdicts"]
    text = render(data)
    for key, r in data["rows"].items():
        assert f"| {key} | {r['batch']} | {r['without']['ms']:.1f} | {r['with']['ms']:.1f} | {r['speedup']:.2f}x |" in text
        if "split_floor_ms" in r:
            assert r["split_floor_ms"] <= r["without"]["ms"] and r["split_floor_ms"] <= r["with"]["ms"] * 1.0001
            assert f"| {r['split_floor_ms']:.1f} | {r['ceiling']:.2f}x |" in text
        if "sweep" in r:
            sw = r["sweep"]
            assert (f"| {sw['pipeline_ms']:.1f} ({sw['machines']}, {sw['stages']}, {sw['microbatches']}) | "
                    f"{sw['dp_ms']:.1f} |") in text
    for key, x in data["verdicts"].get("targets_sweep", {}).items():
        assert f"{key} {x:.2f}x" in text


def test_a_target_row_within_the_target_of_its_split_floor_is_out_of_reach(data):
    from benchmarks.pipeline import TARGET_SPEEDUP, render, verdicts

    rows = copy.deepcopy(data["rows"])
    key = next(k for k in rows if k.endswith("/bert-large"))
    r = rows[key]
    r.update(lower_bound_ms=10.0, split_floor_ms=r["without"]["ms"] / (TARGET_SPEEDUP - 0.1))
    r["ceiling"] = r["without"]["ms"] / r["split_floor_ms"]
    v = verdicts(rows)
    assert v["targets_out_of_reach"][key] == pytest.approx(TARGET_SPEEDUP - 0.1)
    text = render(dict(data, rows=rows, verdicts=v))
    assert f"{key} (at most {TARGET_SPEEDUP - 0.1:.2f}x)" in text
