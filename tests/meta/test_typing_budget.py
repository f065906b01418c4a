"""How much of tag_tf's interface is untyped: function signatures (parameters or return) that mention
`Any`. A ratchet: the number may only go down; lower MAX_ANY_SIGNATURES when it does.

`python tests/meta/test_typing_budget.py` prints the count per module."""
from __future__ import annotations

import ast
import collections
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tag_tf"
MAX_ANY_SIGNATURES = 28


def _mentions_any(node: ast.AST | None) -> bool:
    for n in ast.walk(node) if node is not None else ():
        if (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any"):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str):       # a quoted annotation
            try:
                if _mentions_any(ast.parse(n.value, mode="eval")):
                    return True
            except SyntaxError:
                pass
    return False


def _signature_mentions_any(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = fn.args
    annotated = [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    annotated += [a.annotation for a in (args.vararg, args.kwarg) if a is not None]
    return any(_mentions_any(a) for a in [*annotated, fn.returns])


def any_signatures() -> collections.Counter[str]:
    per_module: collections.Counter[str] = collections.Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _signature_mentions_any(node):
                per_module[str(path.relative_to(PACKAGE.parent))] += 1
    return per_module


def test_signatures_mentioning_any_stay_within_the_ratchet():
    total = sum(any_signatures().values())
    assert total <= MAX_ANY_SIGNATURES, (
        f"{total} signatures mention Any (at most {MAX_ANY_SIGNATURES}): "
        "type the new ones (`python tests/meta/test_typing_budget.py` lists them per module)")


def test_the_counter_sees_any_in_every_position():
    source = ("def a(x: Any): ...\ndef b(x) -> dict[str, Any]: ...\ndef c(*xs: typing.Any): ...\n"
              "def d(**kw: 'Any'): ...\ndef e(x: int) -> int: ...\ndef f(x: 'Anything'): ...\n")
    found = [fn.name for fn in ast.walk(ast.parse(source))
             if isinstance(fn, ast.FunctionDef) and _signature_mentions_any(fn)]
    assert found == ["a", "b", "c", "d"]


if __name__ == "__main__":
    counts = any_signatures()
    for module, n in counts.most_common():
        print(f"{n:4d}  {module}")
    print(f"{sum(counts.values()):4d}  in all (ratchet {MAX_ANY_SIGNATURES})")
