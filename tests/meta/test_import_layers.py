"""The import structure, checked: no circles among tag_tf's modules, lazy (in-function) imports
included, and passes import only downward (the pipeline's order, README "How it works")."""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tag_tf")

# Packages from the bottom up: a package may import its own modules and those of lower layers only.
LAYERS = (
    ("errors", "datafiles", "context", "strategy", "ir", "topology", "models"),
    ("analysis",),
    ("compiler", "runtime"),
    ("profile",),
    ("sim",),
    ("localmachine",),
    ("search",),
    ("frontend", "estimator"),
)

# Named exceptions, each with its reason. The analyzer's METIS vertex weights are op compute times
# (the paper's), estimated by the static work counts and roofline model of `profile` (pure functions
# of the graph; a caller may pass its own `weight_fn` instead).
ALLOWED_UPWARD = {("tag_tf.analysis.analyzer", "tag_tf.profile.costmodel"),
                  ("tag_tf.analysis.analyzer", "tag_tf.profile.flops")}


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
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
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


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None                           # tag_tf/__init__.py: the public surface, above all
    for k, names in enumerate(LAYERS):
        if parts[1] in names:
            return k
    return None


def test_imports_run_down_the_pipeline():
    bad = {}
    for module, targets in sorted(graph().items()):
        mine = layer_of(module)
        if mine is None:
            continue
        upward = [m for m in sorted(targets) if (layer_of(m) or 0) > mine and (module, m) not in ALLOWED_UPWARD]
        if upward:
            bad[module] = upward
    assert bad == {}, f"modules importing a later stage: {bad}"
    assert all(layer_of(m) is not None for m in graph() if m.count(".") >= 1), \
        "a package is missing from LAYERS"


def private_imports(path: str, module: str) -> list[str]:
    """`_name`s this file imports from another tag_tf package (a private helper used as if public)."""
    package = module.split(".")[1] if module.count(".") >= 1 else ""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("tag_tf."):
            if node.module.split(".")[1] == package:
                continue
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_helper_crosses_a_package():
    bad = {m: found for m, p in sorted(modules().items()) if (found := private_imports(p, m))}
    assert bad == {}, f"private names imported from another package (make them public there): {bad}"
