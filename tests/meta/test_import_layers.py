"""The import structure, checked: no circles among tag_tf's modules, lazy (in-function) imports
included; passes import only downward (the pipeline's order: import-linter's contract in
pyproject.toml); no private helper used across packages."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tag_tf")

def modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                found[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return found


def imports(path: str, known: set[str]) -> set[str]:
    """tag_tf modules a file imports, anywhere in it (`from pkg import sub` names the submodule)."""
    out = set()
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in known:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            out.update(subs or {node.module})
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the tag_tf modules it imports; a package's __init__ re-exporting its own submodules
    is not an edge (it is their public face, not a dependency of theirs)."""
    mods = modules()
    known = set(mods)
    return {m: {t for t in imports(p, known) if t != m and not t.startswith(m + ".")} for m, p in mods.items()}


def test_no_import_circles():
    g = graph()
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:               # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert circles == [], f"import circles: {circles}"


def test_imports_run_down_the_pipeline():
    """import-linter's layers contract in pyproject.toml: ir -> models -> analysis -> topology -> profile ->
    strategy -> placement -> compiler/sim -> runtime -> measure -> search/localmachine -> frontend."""
    linter = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    run = subprocess.run([linter, "--no-cache", "--config", os.path.join(os.path.dirname(ROOT), "pyproject.toml")],
                         cwd=os.path.dirname(ROOT), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"modules importing a later stage:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"


def test_every_package_is_a_layer():
    """A new package must take its place in the contract (else import-linter ignores its imports' direction)."""
    import tomllib

    with open(os.path.join(os.path.dirname(ROOT), "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {name.strip().split(".")[1] for layer in layers for name in layer.split("|")}
    packages = {m.split(".")[1] for m in modules() if m.count(".") >= 1}
    assert packages - named == set(), f"packages missing from the layers contract: {sorted(packages - named)}"


def private_imports(path: str, module: str) -> list[str]:
    """`_name`s this file imports from another tag_tf package (a private helper used as if public)."""
    package = module.split(".")[1] if module.count(".") >= 1 else ""
    found = []
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("tag_tf."):
            if node.module.split(".")[1] == package:
                continue
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_helper_crosses_a_package():
    bad = {m: found for m, p in sorted(modules().items()) if (found := private_imports(p, m))}
    assert bad == {}, f"private names imported from another package (make them public there): {bad}"
