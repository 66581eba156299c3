"""The worker context stays in the worker modules (docs/architecture.md, "The worker loop").

Followed as a parameter from where it is built (``hacrl worker``, ``hacrl eval``): a function
holds the context when one of its parameters gets it, and a call inside it that passes the
context (a name bound to it, or ``self.<field>`` of an object built with it) holds it in the
callee. The modules with a function that holds it are the context's reach; the layers below the
worker modules (evaluation, tracking, the rank join, models, the sampler) take their pieces.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where a context is built, and the name it is bound to there.
ENTRIES = (
    ("hacrl_core.runtime.commands", "_worker", "context"),
    ("hacrl_core.runtime.eval_command", "evaluate", "context"),
)
#: The modules that may take the whole context: the commands and the worker loops.
WORKER_MODULES = {
    "hacrl_core.runtime.commands",
    "hacrl_core.runtime.eval_command",
    "hacrl_core.colocated",
    "hacrl_core.learner.worker",
    "hacrl_core.learner.sinks",
    "hacrl_core.learner.team",
    "hacrl_core.rollout.worker",
}
Defs = dict[str, ast.AST]


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in (ROOT / "hacrl_core").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return found


MODULES = _modules()


def _defs(tree: ast.Module) -> Defs:
    """Module-level functions and classes by name, methods as ``Class.name``."""
    out: Defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        if isinstance(node, ast.ClassDef):
            out.update({f"{node.name}.{m.name}": m for m in node.body if isinstance(m, ast.FunctionDef)})
    return out


def _imports(module: str) -> dict[str, tuple[str, str | None]]:
    """Alias -> (module, name) of every ``from x import y`` (``name`` None for a module)."""
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(MODULES[module]):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out[alias.asname or alias.name] = (full, None) if full in MODULES else (node.module, alias.name)
    return out


DEFS = {name: _defs(tree) for name, tree in MODULES.items()}
IMPORTS = {name: _imports(name) for name in MODULES}


def _callee(module: str, func: ast.expr, cls: str | None) -> tuple[str, str] | None:
    if isinstance(func, ast.Name):
        if func.id in DEFS[module]:
            return module, func.id
        target, name = IMPORTS[module].get(func.id, ("", None))
        return (target, name) if name and name in DEFS.get(target, {}) else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner = func.value.id
        if owner == "self" and cls and f"{cls}.{func.attr}" in DEFS[module]:
            return module, f"{cls}.{func.attr}"
        target, name = IMPORTS[module].get(owner, ("", None))
        target = target if name is None else f"{target}.{name}"
        if func.attr in DEFS.get(target, {}):
            return target, func.attr
    return None


def _holds(expr: ast.expr, names: set[str], fields: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in names
    return (
        isinstance(expr, ast.Attribute)
        and isinstance(expr.value, ast.Name)
        and expr.value.id == "self"
        and expr.attr in fields
    )


def _parameters(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ClassDef):
        init = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
        if init is None:  # a dataclass: its fields in order
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        node = init
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    names = [a.arg for a in node.args.args + node.args.kwonlyargs]
    return names[1:] if names and names[0] in ("self", "cls") else names


def reach(entries=ENTRIES) -> set[str]:
    """The modules with a function that holds the context."""
    reached: set[str] = set()
    seen: set[tuple[str, str, frozenset[str], frozenset[str]]] = set()

    def visit(module: str, name: str, params: set[str], fields: frozenset[str] = frozenset()) -> None:
        node = DEFS[module][name]
        reached.add(module)
        if isinstance(node, ast.ClassDef):  # built with the context: its methods hold the fields that got it
            init = DEFS[module].get(f"{name}.__init__")
            got = set(params) if init is None else _assigned_fields(init, params)
            for key in DEFS[module]:
                if key.startswith(f"{name}.") and key != f"{name}.__init__":
                    visit(module, key, set(), frozenset(got))
            return
        key = (module, name, frozenset(params), fields)
        if key in seen:
            return
        seen.add(key)
        names = set(params)
        for statement in ast.walk(node):
            if isinstance(statement, ast.Assign) and _holds(statement.value, names, set(fields)):
                names |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
        cls = name.split(".")[0] if "." in name else None
        for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
            given = [(i, a) for i, a in enumerate(call.args)] + [(k.arg, k.value) for k in call.keywords]
            hits = [position for position, value in given if _holds(value, names, set(fields))]
            target = _callee(module, call.func, cls) if hits else None
            if target is None:
                continue
            parameters = _parameters(DEFS[target[0]][target[1]])
            got = {parameters[p] if isinstance(p, int) and p < len(parameters) else p for p in hits}
            got.discard(None)
            if got:
                visit(*target, {g for g in got if isinstance(g, str)})

    for module, name, variable in entries:
        visit(module, name, {variable})
    return reached


def _assigned_fields(init: ast.AST, params: set[str]) -> set[str]:
    fields = set()
    for statement in ast.walk(init):
        if not isinstance(statement, ast.Assign):
            continue
        for target in statement.targets:
            pairs = (
                zip(target.elts, statement.value.elts)
                if isinstance(target, ast.Tuple) and isinstance(statement.value, ast.Tuple)
                else [(target, statement.value)]
            )
            fields |= {t.attr for t, v in pairs if isinstance(t, ast.Attribute) and _holds(v, params, set())}
    return fields


def test_the_walk_follows_the_context_into_the_worker_loops() -> None:
    assert {"hacrl_core.learner.worker", "hacrl_core.learner.sinks", "hacrl_core.rollout.worker"} <= reach()


def test_only_the_worker_modules_take_the_whole_context() -> None:
    beyond = reach() - WORKER_MODULES
    assert not beyond, f"give these the pieces they use (a RunDescription, the store, ...), not the context: {beyond}"
