"""The front end and the search stay small functions: none over MAX_LINES lines (ruff holds them to
15 branches, complexity 15 and 50 statements: pyproject.toml)."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
HELD = ("tag_tf/frontend", "tag_tf/search", "tag_tf/estimator.py")
MAX_LINES = 60


def long_functions(max_lines: int = MAX_LINES) -> list[str]:
    found = []
    for place in HELD:
        path = ROOT / place
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > max_lines:
                        found.append(f"{source.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_front_end_or_the_search_is_long():
    assert long_functions() == []


def test_the_check_sees_a_long_function():
    assert any(" run (" in f for f in long_functions(max_lines=20))      # the CLI commands' run functions
