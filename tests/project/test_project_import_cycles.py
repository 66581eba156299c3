"""No import cycles: neither between files nor between the subpackages of hacrl_core and the operator.

Every import counts: those at module level (in class bodies, ``try`` and ``if`` blocks too) and
those inside functions, which are deferred on purpose (to keep torch out of the operator, or
`hacrl validate` instant) but are dependencies all the same: a cycle through one is a cycle.
Only imports under ``if TYPE_CHECKING:`` never run and do not count. ``from a.b import c``
depends on the module ``a.b.c`` where that is a file, else on ``a.b``.
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


def _statements(body: list[ast.stmt], *, deferred: bool) -> Iterator[ast.stmt]:
    """The statements of ``body`` and of the blocks nested in it; function bodies only when
    ``deferred`` (else: the statements that run on import); never those under TYPE_CHECKING."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if deferred:
                yield from _statements(node.body, deferred=deferred)
            continue
        if isinstance(node, ast.ClassDef):
            yield from _statements(node.body, deferred=deferred)
            continue
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _statements(node.body, deferred=deferred)
            yield from _statements(node.orelse, deferred=deferred)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None) or []
            blocks = [
                child.body if isinstance(child, (ast.ExceptHandler, ast.match_case)) else [child] for child in children
            ]
            for block in blocks:
                yield from _statements(block, deferred=deferred)


def imports_of(module: str, path: Path, modules: dict[str, Path], *, deferred: bool = True) -> set[str]:
    """The modules of ``modules`` that ``module`` imports directly (``deferred``: also inside its
    functions; else only on import)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _statements(ast.parse(path.read_text(), str(path)).body, deferred=deferred):
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
def import_graph(deferred: bool = True) -> dict[str, set[str]]:
    modules = module_files()
    return {module: imports_of(module, path, modules, deferred=deferred) for module, path in modules.items()}


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
    # Imported inside a function (on use only): a dependency, though not one of import time.
    assert "hacrl_core.learner.distributed" in graph["hacrl_core.cli"]
    assert "hacrl_core.learner.distributed" not in import_graph(deferred=False)["hacrl_core.cli"]


def test_no_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle or [])


# Package edges that close a cycle today, through imports inside functions. Remove an entry once
# its edge is gone; nothing may be added.
KNOWN_UPWARD_EDGES: set[tuple[str, str]] = set()


def test_no_subpackage_imports_itself_through_others() -> None:
    graph = package_graph(import_graph())
    for source, target in KNOWN_UPWARD_EDGES:
        assert target in graph[source], f"{source} no longer imports {target}: remove the edge from KNOWN_UPWARD_EDGES"
        graph[source].discard(target)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_import_time_imports_alone_have_no_package_cycle() -> None:
    cycle = find_cycle(package_graph(import_graph(deferred=False)))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


# Layers that point one way: the learner trains and the rollout samples; the colocated worker
# (hacrl_core.colocated), which does both, composes them from above.
FORBIDDEN_PACKAGE_EDGES = {
    ("hacrl_core.learner", "hacrl_core.rollout"),
    ("hacrl_core.rollout", "hacrl_core.learner"),
    ("hacrl_core.learner", "hacrl_core.colocated"),
    ("hacrl_core.rollout", "hacrl_core.colocated"),
}


def test_layers_point_one_way() -> None:
    graph = package_graph(import_graph())
    broken = sorted((source, target) for source, target in FORBIDDEN_PACKAGE_EDGES if target in graph[source])
    assert not broken, f"imports across layers that must not: {broken}"


def test_context_and_evaluation_import_no_engine_or_backend() -> None:
    """Every worker builds its context; the names of the engines and backends it checks come from
    the torch-free catalog, and evaluation reaches an engine only through the engine interface."""
    graph = import_graph()
    assert not {m for m in graph["hacrl_core.context"] if package_of(m) in ("hacrl_core.learner", "hacrl_core.rollout")}
    assert {
        m for m in graph["hacrl_core.evaluation"] if package_of(m) in ("hacrl_core.learner", "hacrl_core.rollout")
    } == {"hacrl_core.rollout.engine"}
    assert graph["hacrl_core.catalog"] == set()  # the standard library only
