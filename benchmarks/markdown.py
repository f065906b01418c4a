"""RESULTS.md sections the benchmark scripts regenerate between their own markers."""
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
