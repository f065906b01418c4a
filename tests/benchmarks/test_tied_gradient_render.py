"""The tied-gradient study's section of RESULTS.md (benchmarks/tied_gradient.py) is rendered from its
JSON, its verdicts recomputed from the rows, and pieces are never kept where they simulate slower."""
from __future__ import annotations

import copy
import json
import os

import pytest

from benchmarks.report import RESULTS


@pytest.fixture(scope="module")
def data() -> dict:
    with open(os.path.join(RESULTS, "tied_gradient.json")) as f:
        return json.load(f)


def test_every_plan_of_every_row_is_rendered_from_the_json(data):
    from benchmarks.tied_gradient import render, verdicts

    assert verdicts(data["rows"]) == data["verdicts"]
    text = render(data)
    for key, r in data["rows"].items():
        for name, c in r["plans"].items():
            if "error" in c:
                assert f"| {key} | {r['batch']} | {name} | - | - | - | - | cannot run: {c['error']} |" in text
                continue
            label = f"{name} ({'one device' if c['devices'] == 1 else str(c['devices']) + ' devices'})"
            assert (f"| {key} | {r['batch']} | {label} | {c['before_ms']:.1f} | {c['whole_ms']:.1f} | "
                    f"{c['pieces_ms']:.1f} | {c['speedup']:.3f}x |") in text
            assert c["pieces_ms"] <= c["whole_ms"] * (1 + 1e-9) and c["whole_ms"] <= c["before_ms"] * (1 + 1e-9)
            assert bool(c["allreduced"]) == c["kept"]


def test_a_row_slower_in_pieces_fails_the_verdict(data):
    from benchmarks.tied_gradient import render, verdicts

    rows = copy.deepcopy(data["rows"])
    key = next(iter(rows))
    cell = next(c for c in rows[key]["plans"].values() if "error" not in c)
    cell["pieces_ms"] = cell["whole_ms"] * 1.1
    v = verdicts(rows)
    assert v["never_slower"] is False
    assert "never slower: NO." in render(dict(data, rows=rows, verdicts=v))
