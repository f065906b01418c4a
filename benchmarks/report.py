"""`python -m benchmarks report [--check]`: every generated section of RESULTS.md from its results JSON.

One registry (SECTIONS) names each section's markers, the JSON it is rendered from and its renderer
(the benchmark's own `render`, the one its run writes the section with). `report` rewrites every
section from the JSON on disk; `report --check` rewrites nothing and fails, naming each section,
where RESULTS.md differs from what its JSON renders: a figure typed by hand inside a section, or a
section left behind by a re-run JSON. Text outside the sections is not checked (see the note at the
top of RESULTS.md for what is still written by hand).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
MARKDOWN = os.path.join(HERE, "RESULTS.md")


@dataclasses.dataclass(frozen=True)
class Section:
    """A generated section: its name (`<!-- name:begin -->` ... `<!-- name:end -->`), the results
    JSON it reads (under results/), and how its text is made from the results directory."""

    name: str
    source: str
    render: Callable[[str], str]

    @property
    def begin(self) -> str:
        return f"<!-- {self.name}:begin -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.name}:end -->"


def _from_json(module: str, filename: str) -> Callable[[str], str]:
    def render(results_dir: str) -> str:
        import importlib

        with open(os.path.join(results_dir, filename)) as f:
            data = json.load(f)
        return importlib.import_module(f"benchmarks.{module}").render(data)
    return render


def _studies(results_dir: str) -> str:
    from benchmarks import step_time_studies

    return step_time_studies.render(results_dir)


def _paper(results_dir: str) -> str:
    from benchmarks import paper

    return paper.render(results_dir, HERE)


SECTIONS: tuple[Section, ...] = (
    Section("models", "models.json", _from_json("models_table", "models.json")),
    Section("compile-time", "compile.json", _from_json("compile_time", "compile.json")),
    Section("simulator-speed", "simulator_speed.json", _from_json("simulator_speed", "simulator_speed.json")),
    Section("scale", "scale.json", _from_json("scale", "scale.json")),
    Section("pipeline", "pipeline.json", _from_json("pipeline", "pipeline.json")),
    Section("tied-gradient", "tied_gradient.json", _from_json("tied_gradient", "tied_gradient.json")),
    Section("elastic", "elastic.json", _from_json("elastic", "elastic.json")),
    Section("plan-quality", "plan_quality.json", _from_json("plan_quality", "plan_quality.json")),
    Section("calibration", "calibration.json", _from_json("calibration", "calibration.json")),
    Section("strategy-creator", "strategy_creator.json", _from_json("strategy_creator", "strategy_creator.json")),
    Section("search-convergence", "search_convergence.json", _from_json("search_convergence", "search_convergence.json")),
    Section("gnn-wallclock", "gnn_wallclock.json", _from_json("gnn_wallclock", "gnn_wallclock.json")),
    Section("hetero_real", "hetero_real.json", _from_json("hetero_real", "hetero_real.json")),
    Section("step-time", "step_time.json", _from_json("step_time", "step_time.json")),
    Section("step-time-studies", "step_time_*.json, remote_step.json", _studies),
    Section("simulator-accuracy", "simulator_accuracy.json", _from_json("simulator_accuracy", "simulator_accuracy.json")),
    Section("costmodel", "costmodel.json", _from_json("costmodel_calibrate", "costmodel.json")),
    Section("costmodel-gpu", "costmodel_gpu.json", _from_json("costmodel_gpu", "costmodel_gpu.json")),
    Section("communication", "comm_local.json", _from_json("comm_profile", "comm_local.json")),
    Section("sfb-real", "sfb_real.json", _from_json("sfb_real", "sfb_real.json")),
    Section("paper-evaluation", "paper_*.json", _paper),
)


def _split(text: str, section: Section) -> tuple[str, str, str]:
    if section.begin not in text or section.end not in text:
        raise SystemExit(f"RESULTS.md has no {section.begin} ... {section.end} section")
    head, rest = text.split(section.begin, 1)
    body, tail = rest.split(section.end, 1)
    return head, body, tail


def report(markdown: str = MARKDOWN, results_dir: str = RESULTS, check: bool = False) -> list[str]:
    """Regenerate (or, `check`, compare) every section; returns the names of sections that differ
    from their JSON (with `check`, each with a short diff printed)."""
    with open(markdown) as f:
        text = f.read()
    differ = []
    for section in SECTIONS:
        head, body, tail = _split(text, section)
        fresh = "\n" + section.render(results_dir)
        if fresh == body:
            continue
        differ.append(section.name)
        if check:
            diff = difflib.unified_diff(body.splitlines(), fresh.splitlines(), "RESULTS.md", section.source,
                                        lineterm="", n=0)
            print(f"section {section.name!r} differs from what {section.source} renders:")
            print("\n".join(list(diff)[:20]))
        text = head + section.begin + fresh + section.end + tail
    if not check and differ:
        with open(markdown + ".tmp", "w") as f:
            f.write(text)
        os.replace(markdown + ".tmp", markdown)
    return differ


__all__ = ["SECTIONS", "Section", "report"]
