"""The elastic section of RESULTS.md (benchmarks/elastic.py) is rendered from its JSON: every cluster's
recovery, step times and totals as measured, and the summary recomputed from the rows."""
from __future__ import annotations

import json
import os

import pytest

from benchmarks.report import RESULTS


@pytest.fixture(scope="module")
def data() -> dict:
    with open(os.path.join(RESULTS, "elastic.json")) as f:
        return json.load(f)


def test_every_cluster_is_rendered_from_its_rows(data):
    from benchmarks.elastic import render, summary

    text = render(data)
    assert data["clusters"]
    for name, c in data["clusters"].items():
        s = summary(c)
        assert s == c["summary"]
        assert f"| {name} ({len(c['hosts'])} hosts) | {s['recovery_median_s']:.2f} s over {s['recoveries']} |" in text
        assert f"| {s['before_ms']:.1f} ms | {s['after_ms']:.1f} ms | {s['fresh_ms']:.1f} ms |" in text
        assert f"{s['elastic_total_s']:.1f} s | {s['restart_total_s']['50']:.1f} s | {s['restart_total_s']['200']:.1f} s" \
            in text
        assert s["steps_lost"] == 0 and s["steps_twice"] == 0
        assert "after the loss, on 2 hosts: auto (" in text      # each plan labelled as the chief logged it


def test_a_run_that_lost_steps_shows_it(data):
    import copy

    from benchmarks.elastic import render, summary

    broken = copy.deepcopy(data)
    name, c = next(iter(broken["clusters"].items()))
    c["elastic"][0]["steps_lost"] = 3
    c["summary"] = summary(c)
    assert f"| {c['summary']['steps_lost']} / " in render(broken)
