"""No function of the operator is over 60 lines (docstring included): each builder and each step
of the reconcile stays one screen a reader takes in at once (docs/operator.md, "Design")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
# The trees held to MAX_LINES.
TREES = ("operator/hacrl_operator",)
# Functions allowed past MAX_LINES, as "path:qualified name", each with the reason. None today.
EXCEPTIONS: dict[str, str] = {}


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines from ``def`` to its last line) of every function in ``path``, nested ones too."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def test_the_length_check_sees_the_functions() -> None:
    """The walk finds the builders and the reconcile, so an empty result below means something."""
    lengths = {name for path in (ROOT / TREES[0]).rglob("*.py") for name, _ in function_lengths(path)}
    assert {"build_pod", "Reconciler.execute", "Reconciler._reconcile"} <= lengths


def test_no_function_is_over_the_limit() -> None:
    too_long = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            for name, lines in function_lengths(path):
                key = f"{path.relative_to(ROOT).as_posix()}:{name}"
                if lines > MAX_LINES and key not in EXCEPTIONS:
                    too_long.append(f"{key} ({lines} lines)")
    assert not too_long, f"over {MAX_LINES} lines; split them into helpers of one job each: {too_long}"


def test_every_exception_is_still_needed() -> None:
    """An exception whose function is gone or got short is removed, so the list never grows stale."""
    lengths = {
        f"{path.relative_to(ROOT).as_posix()}:{name}": lines
        for tree in TREES
        for path in (ROOT / tree).rglob("*.py")
        for name, lines in function_lengths(path)
    }
    stale = [key for key in EXCEPTIONS if lengths.get(key, 0) <= MAX_LINES]
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): remove from EXCEPTIONS: {stale}"
