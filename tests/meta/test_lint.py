"""ruff (errors, sorted imports, bugbear, simplify, pyupgrade) over the whole repository and mypy over
tag_tf, with the pinned versions and the configuration in pyproject.toml; `make test` runs them with
the suite."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff():
    p = run("ruff", "check", "--output-format", "concise", ".")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_mypy():
    p = run("mypy", "--no-error-summary")           # files and options: pyproject.toml [tool.mypy]
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
