"""Gantt chart of a simulation as a PNG: one row per resource, bars coloured by task category.

Uses matplotlib's object API with the Agg canvas (no pyplot, so no global backend or figure state)
and draws each row with a single broken_barh call, which keeps charts of thousands of tasks fast.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tag_tf.sim.engine import SimResult, TaskGraph

__all__ = ["plot_gantt"]

_MAX_LEGEND = 20


def plot_gantt(graph: TaskGraph, result: SimResult, path: str | os.PathLike, title: str | None = None,
               categories: tuple[str, ...] | None = None, time_unit: str = "ms", hide_idle: bool = False) -> str:
    """Draw the schedule to `path` (PNG) and return the path.

    Rows: every resource (tasks holding several resources appear on each of their rows) plus a
    "no resource" row when some task holds none; `hide_idle` drops rows no task used (a cluster has
    many links a plan never touches). Colours: `categories` (one per task) if given, else
    graph.categories, else the kind of the task's first resource. time_unit: "s", "ms" or "us".
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[time_unit]
    n = graph.num_tasks
    cats = categories if categories is not None else graph.categories
    if cats is not None and len(cats) != n:
        raise ValueError(f"categories: expected {n} entries, got {len(cats)}")
    kinds = graph.resource_kinds
    nres = np.diff(graph.res_ptr)
    task_of_entry = np.repeat(np.arange(n), nres)
    if cats is None:
        first = np.full(n, -1)
        has = nres > 0
        first[has] = graph.res[graph.res_ptr[:-1][has]]
        cats = tuple((kinds[r] if kinds is not None else "task") if r >= 0 else "no resource" for r in first)
    names = list(dict.fromkeys(cats))
    cmap = _palette(len(names))
    colour_of_cat = {c: cmap[i] for i, c in enumerate(names)}
    task_colour = np.array([colour_of_cat[c] for c in cats]) if n else np.zeros((0, 4))

    ran = np.isfinite(result.start)
    rows: list[tuple[str, np.ndarray]] = [
        (graph.resource_name(r), np.array([], dtype=np.int64)) for r in range(graph.num_resources)]
    if len(graph.res):
        order = np.argsort(graph.res, kind="stable")
        bounds = np.searchsorted(graph.res[order], np.arange(graph.num_resources + 1))
        rows = [(graph.resource_name(r), task_of_entry[order[bounds[r]:bounds[r + 1]]])
                for r in range(graph.num_resources)]
    free_tasks = np.flatnonzero(nres == 0)
    if free_tasks.size:
        rows.append(("no resource", free_tasks))
    if hide_idle:
        rows = [(name, tasks) for name, tasks in rows if tasks.size]

    height = min(0.35 * len(rows) + 1.5, 60.0)
    fig = Figure(figsize=(14, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for y, (_, tasks) in enumerate(rows):
        tasks = tasks[ran[tasks]]
        if tasks.size == 0:
            continue
        spans = np.stack([result.start[tasks] * scale, (result.end[tasks] - result.start[tasks]) * scale], axis=1)
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=task_colour[tasks], linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([name for name, _ in rows], fontsize=max(4, min(9, int(400 / max(len(rows), 1)))))
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(result.makespan * scale, 1e-12))
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_title(title or f"makespan {result.makespan * scale:.4g} {time_unit}, {n} tasks")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    if len(names) > 1 or (len(names) == 1 and names[0]):
        handles = [Patch(facecolor=colour_of_cat[c], label=c or "(none)") for c in names[:_MAX_LEGEND]]
        ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=max(1, len(handles) // 10))
    fig.tight_layout()
    path = os.fspath(path)
    fig.savefig(path, format="png")
    return path


def _palette(k: int) -> list[tuple[float, float, float, float]]:
    from matplotlib import colormaps

    cmap: Any = colormaps["tab20" if k > 10 else "tab10"]     # a ListedColormap: it lists its colors
    base = cmap.colors
    return [to_rgba(base[i % len(base)]) for i in range(max(k, 1))]
