"""RESULTS.md's generated sections are what their results JSON renders (`python -m benchmarks report
--check`), and the check fails, naming the section, on a figure edited by hand."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from benchmarks.__main__ import main
from benchmarks.report import MARKDOWN, SECTIONS

HETERO = next(s for s in SECTIONS if s.name == "hetero_real")


def test_results_md_sections_are_their_json(capsys):
    assert main(["report", "--check"]) == 0, capsys.readouterr().out


def test_a_figure_typed_by_hand_fails_the_check_and_report_restores_it(tmp_path, capsys):
    copy = tmp_path / "RESULTS.md"
    shutil.copy(MARKDOWN, copy)
    text = copy.read_text()
    head, rest = text.split(HETERO.begin, 1)
    body, tail = rest.split(HETERO.end, 1)
    # the first model row gains a figure nobody's JSON holds (rows may carry a code/date note)
    edited = re.sub(r"^(\| cnn[^|]*\|)", r"\1 1.0 |", body, count=1, flags=re.M)
    assert edited != body
    copy.write_text(head + HETERO.begin + edited + HETERO.end + tail)
    assert main(["report", "--check", "--markdown", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "section 'hetero_real' differs" in out and "1 section(s) differ" in out
    assert main(["report", "--markdown", str(copy)]) == 0
    assert copy.read_text() == text
    assert os.path.getsize(MARKDOWN) == len(text.encode())      # the real file untouched


def test_real_run_rows_say_whether_they_were_distributed():
    """paper_real: a plan that compiled to the original graph is labelled one device and compared
    with the one-device run only; a row with a split or a collective is compared with the
    distributed baselines too (#34 item 3)."""
    from benchmarks.real_execution import summarize, used_label

    one = {"compiled": {"ops": 10, "original_ops": 10, "allreduce": 0, "split": 0}, "median_ms": 2.0,
           "predicted_ms": 2.0}
    replicas = {"compiled": {"ops": 30, "original_ops": 10, "allreduce": 1, "split": 2}, "median_ms": 1.0,
                "predicted_ms": 1.0}
    recorded = dict(one, devices=2)
    single = {"median_ms": 2.0, "predicted_ms": 2.0}
    dp = {"compiled": {"ops": 30, "original_ops": 10, "allreduce": 1, "split": 2}, "median_ms": 3.0,
          "predicted_ms": 3.0}
    assert used_label(one) == "1 (not distributed)" and used_label(single) == "1"
    assert used_label(replicas) == "several (replicas)" and used_label(recorded) == "2 (model parallel)"
    rows = {"m/single": single, "m/local2/dp": dp, "m/local2/auto": one, "m/2proc/dp": dp, "m/2proc/auto": replicas}
    speedups = summarize(rows)["speedups"]
    assert set(speedups) == {"m/local2/auto_over_single", "m/2proc/auto_over_single", "m/2proc/auto_over_dp"}
    assert speedups["m/2proc/auto_over_dp"]["measured"] == 3.0


def test_text_outside_the_generated_sections_states_no_measured_figure():
    """Every figure lives in a generated section: the hand-written text around them may name a
    method (cores, budgets, layers) but no time, ratio or error."""
    import re

    from benchmarks.report import MARKDOWN

    text = Path(MARKDOWN).read_text()
    outside = re.sub(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", "", text, flags=re.S)
    figures = [line for line in outside.splitlines()
               if re.search(r"\d(\.\d+)?\s?(ms\b|%|x\b|us\b)", line) and not line.startswith("#")]
    assert not figures, figures
