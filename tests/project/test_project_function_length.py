"""No function of the operator or of hacrl_core is over 60 lines (docstring included): each
builder, each step of the reconcile and each part of a worker loop (start-up, a per-step sink)
stays one screen a reader takes in at once (docs/operator.md, "Design"; docs/architecture.md,
"The worker loop")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
# The trees held to MAX_LINES.
TREES = ("operator/hacrl_operator", "hacrl_core")
# Functions allowed past MAX_LINES, as "path:qualified name", each with the reason.
EXCEPTIONS: dict[str, str] = {
    "hacrl_core/algorithms/losses.py:hacpo_loss": "the paper's loss, one equation per block, read top to bottom",
    "hacrl_core/runtime/report.py:write_report": "the summary's sections in the order the reader sees them",
    "hacrl_core/store/weight_chain.py:fetch_policy": "one fetch along the chain, with its fallback",
    "hacrl_core/runtime/eval_command.py:evaluate": "`hacrl eval` top to bottom: weights, sets, table",
    "hacrl_core/crd.py:to_structural": "one recursive walk of the JSON schema, a branch per keyword",
    "hacrl_core/runtime/local.py:prepare": "`hacrl run`'s preparation in the order it happens",
}


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
    """The walk finds the builders, the reconcile and the worker loops, so an empty result below
    means something."""
    lengths = {name for tree in TREES for path in (ROOT / tree).rglob("*.py") for name, _ in function_lengths(path)}
    assert {"build_pod", "Reconciler.execute", "Reconciler._reconcile", "run_learner_worker", "_worker"} <= lengths


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
