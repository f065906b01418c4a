"""RESULTS.md sections the benchmark scripts regenerate between their own markers, and the stamp
(date and code) every results JSON carries."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def replace_section(path: str, begin: str, end: str, body: str) -> None:
    """Put `body` between the `begin` and `end` markers of `path` (the rest untouched; written to a
    temporary file, then moved into place). A file without both markers is an error."""
    text = Path(path).read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no {begin} ... {end} section to regenerate")
    head, rest = text.split(begin, 1)
    with open(path + ".tmp", "w") as f:
        f.write(head + begin + "\n" + body + end + rest.split(end, 1)[1])
    os.replace(path + ".tmp", path)


def stamp(doc: dict) -> dict:
    """`doc` with the date and the code (short commit) of this run: every section says when and on
    which code it was measured (`measured_when`)."""
    import subprocess
    import time

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return {**doc, "date": time.strftime("%Y-%m-%d"), "commit": commit or "unknown"}


def measured_when(data: dict) -> str:
    """"measured 2026-11-27 on code abc1234", or what an older JSON without the stamp does not say."""
    if data.get("date") and data.get("commit"):
        return f"measured {data['date']} on code {data['commit']}"
    return "date and code not recorded (an older run, before runs recorded them)"


def add_section(path: str, title: str, begin: str, end: str) -> None:
    """Add a section's heading and markers to RESULTS.md if missing, then regenerate every generated
    section from its JSON (benchmarks/report.py)."""
    from benchmarks import report

    text = Path(path).read_text()
    if begin not in text:
        Path(path).write_text(text.rstrip("\n") + f"\n\n## {title}\n\n{begin}\n{end}\n")
    report.report(path)


def simulated_study(doc: str, *, models: tuple[str, ...], presets: tuple[str, ...], out: str, title: str,
                    markers: tuple[str, str], run_row: Callable[[str, str, float], dict],
                    verdicts: Callable[[dict], dict], line: Callable[[dict], str]) -> None:
    """The command line of a simulated study over models x presets (pipeline.py, tied_gradient.py):
    `run_row(model, preset, budget)` per row ("preset/model"), printed with `line(row)`; the JSON
    stamped, with its `verdicts(rows)`, and the RESULTS.md section regenerated (`--render`: from the
    JSON alone)."""
    import argparse
    import json
    import platform

    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--models", default=",".join(models))
    ap.add_argument("--presets", default=",".join(presets))
    ap.add_argument("--out", default=out)
    ap.add_argument("--markdown", default=os.path.join(here, "RESULTS.md"))
    ap.add_argument("--render", action="store_true", help="only rewrite the RESULTS.md section from the JSON")
    args = ap.parse_args()
    if args.render:
        with open(args.out) as f:
            data = json.load(f)
    else:
        rows: dict[str, dict] = {}
        for preset in args.presets.split(","):
            for model in args.models.split(","):
                rows[f"{preset}/{model}"] = row = run_row(model, preset, args.budget)
                print(f"{preset}/{model}: {line(row)}", flush=True)
        data = stamp({"machine": platform.machine(), "budget_s": args.budget, "simulated": True, "rows": rows})
        data["verdicts"] = verdicts(rows)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(data, f, indent=1, default=float)       # numpy scalars
    if args.markdown:
        add_section(args.markdown, title, *markers)
    print(json.dumps(data["verdicts"], indent=1))
