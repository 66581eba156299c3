"""No import cycles: neither between files nor between the subpackages of hacrl_core and the operator.

Only imports that run when a module is imported count: those at module level (in class bodies,
``try`` and ``if`` blocks too), not those inside functions (deferred on purpose, e.g. to keep
torch out of the operator) nor those under ``if TYPE_CHECKING:``. ``from a.b import c`` depends on
the module ``a.b.c`` where that is a file, else on ``a.b``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"hacrl_core": REPO / "hacrl_core", "hacrl_operator": REPO / "operator" / "hacrl_operator"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the roots (a package is its ``__init__``)."""
    modules = {}
    for root, directory in ROOTS.items():
        for path in sorted(directory.rglob("*.py")):
            parts = [root, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run on import: nested blocks yes, function bodies no."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None) or []
            blocks = [child.body if isinstance(child, (ast.ExceptHandler, ast.match_case)) else [child] for child in children]
            for block in blocks:
                yield from _import_time_statements(block)


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that importing ``module`` imports directly."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _import_time_statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c.name`: the module part
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def package_of(module: str) -> str:
    """``hacrl_core.store.s3_store`` -> ``hacrl_core.store``; top-level modules are their own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for module, targets in graph.items():
        packages[package_of(module)] |= {package_of(t) for t in targets} - {package_of(module)}
    return packages


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def test_the_checker_finds_cycles_and_resolves_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "hacrl_core.store.s3_store" in graph["hacrl_core.store.objects"]  # from-import of a name
    assert "hacrl_core.data.rows" in graph["hacrl_core.data.hub"]
    assert "hacrl_core.rollout.hf_engine" not in graph["hacrl_core.rollout.engine"]  # imported on use only


def test_no_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle or [])


def test_no_subpackage_imports_itself_through_others() -> None:
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])
