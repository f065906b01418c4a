"""The cost-model, communication and SFB sections of RESULTS.md are rendered from their results JSON
alone (`render` in costmodel_calibrate.py, comm_profile.py and sfb_real.py): each figure checked here
is recomputed from the JSON, never typed."""
from __future__ import annotations

import json
import os

import pytest

from benchmarks.markdown import measured_when
from benchmarks.report import RESULTS


def load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def costmodel() -> dict:
    return load("costmodel.json")


@pytest.fixture(scope="module")
def comm() -> dict:
    return load("comm_local.json")


@pytest.fixture(scope="module")
def sfb() -> dict:
    return load("sfb_real.json")


def test_costmodel_section_has_the_left_out_errors_and_the_op_count(costmodel):
    from benchmarks.costmodel_calibrate import _ms, render

    text = render(costmodel)
    assert measured_when(costmodel) in text and "MEASURED" in text and "SIMULATED" in text
    cal = costmodel["calibration"]
    assert f"{cal['samples']:,} measured op times" in text
    for name, entry in cal["leave_one_model_out"].items():
        ops = costmodel["profiles"]["models"][name]["ops_profiled"]
        assert f"| {name} | {ops} | {entry['per_op']['median_ape'] * 100:.0f}% |" in text
    errs = [t["rel_err"] for e in cal["leave_one_model_out"].values() for t in e["totals"].values()]
    assert f"{sum(abs(x) <= 0.3 for x in errs)} of {len(errs)} (model, batch size)" in text
    h100 = costmodel["predictions"]["matmul_8192x8192x8192_fp32_s"]["H100"]
    assert f"| H100 | model (datasheet defaults) | {_ms(h100)} |" in text


def test_comm_section_has_each_fit_and_marks_the_ones_the_simulator_uses(comm):
    from benchmarks.comm_profile import _ms, _us, render

    text = render(comm)
    assert measured_when(comm) in text and "MEASURED" in text
    fit = comm["series"]["p2p_grpc_2proc"]["fit"]
    assert f"| {_us(fit['intercepts'][0])} | {1 / fit['slopes'][0] / 1e9:.2f} | {fit['error']:.1%} |" in text
    assert "| p2p, gRPC between 2 server processes* |" in text           # the local simulator's p2p fit
    assert "| all-reduce, 2 server processes (gRPC) |" in text           # measured, not used
    # The fitted time at 1 MiB, from the segment it falls in (a breakpoint starts its segment).
    nbytes = 1 << 20
    seg = sum(b <= nbytes for b in fit["breakpoints"])
    fitted = fit["intercepts"][seg] + fit["slopes"][seg] * nbytes
    p2p = comm["series"]["p2p_grpc_2proc"]
    measured = p2p["seconds"][p2p["sizes"].index(nbytes)]
    assert f"| 1 MiB | {_ms(measured)} ({_ms(fitted)}) |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) <= 20


def test_sfb_section_has_speedups_and_the_exactness_check(sfb):
    from benchmarks.sfb_real import render

    text = render(sfb)
    assert measured_when(sfb) in text and "MEASURED" in text
    assert "Sufficient factor broadcasting" in text
    for model, m in sfb["models"].items():
        rows = m["rows"]
        speedup = rows["dp"]["median_ms"] / rows["dp+sfb"]["median_ms"]
        assert f"| {model} | dp+sfb | {rows['dp+sfb']['median_ms']:.2f} |" in text
        assert f"| {speedup:.2f}x |" in text
        ok = "yes" if rows["dp+sfb"]["exact"]["ok"] else "NO"
        assert f"| {ok} ({rows['dp+sfb']['exact']['max_rel_diff']:.1e}) |" in text


@pytest.mark.parametrize("module,name", [("costmodel_calibrate", "costmodel.json"), ("comm_profile", "comm_local.json"),
                                         ("sfb_real", "sfb_real.json")])
def test_a_stamped_json_says_its_date_and_code(module, name):
    import importlib

    data = dict(load(name), date="2026-01-02", commit="abc1234")
    text = importlib.import_module(f"benchmarks.{module}").render(data)
    assert "measured 2026-01-02 on code abc1234" in text and "not recorded" not in text
