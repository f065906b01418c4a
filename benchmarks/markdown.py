"""RESULTS.md sections the benchmark scripts regenerate between their own markers, and the stamp
(date and code) every results JSON carries."""
from __future__ import annotations

import os
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
