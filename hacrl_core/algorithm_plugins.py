"""Algorithms beyond the built-in table, found without importing them (docs/algorithm.md, "A new algorithm").

An algorithm is one module that declares its catalog entry as a module-level literal::

    CATALOG_ENTRY = AlgorithmDescriptor(name="mine", shares_rows=True, advantage_mode="hacpo",
                                        cross_old_logprob="source", policy_loss="mine")

and registers what the entry names that is new (``@register_policy_loss("mine")``,
``@register_adv_est(...)``: ``hacrl_core.algorithms.registry``). Such a module is found where it is

- dropped into ``hacrl_core/algorithms/``, or
- named by an installed distribution's entry point in the ``hacrl.algorithms`` group, the entry
  point's name being the algorithm's (``mine = "my_package.mine"``).

The entry is read from the module's source, not by running it: the spec, `hacrl validate` and the
operator (whose image has no torch) learn a plugin's name and whether it shares rows without
loading torch or executing the plugin's code. The learner imports the module
(``algorithms.registry.get_algorithm``), which registers its functions.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hacrl_core.catalog import ALGORITHM_TABLE, AlgorithmDescriptor

#: The entry point group an installed package names its algorithm modules in.
ENTRY_POINT_GROUP = "hacrl.algorithms"
#: The module-level name an algorithm module assigns its ``AlgorithmDescriptor`` to.
ENTRY_NAME = "CATALOG_ENTRY"
ALGORITHMS_PACKAGE = "hacrl_core.algorithms"
ALGORITHMS_DIR = Path(__file__).resolve().parent / "algorithms"


@dataclass(frozen=True)
class AlgorithmModule:
    """A plugin algorithm: its catalog entry and the module that registers its functions."""

    entry: AlgorithmDescriptor
    module: str


def read_entry(path: Path) -> AlgorithmDescriptor | None:
    """The module's ``CATALOG_ENTRY = AlgorithmDescriptor(...)`` (keyword arguments, each a
    literal), or None when it declares none. ``ValueError`` names the file when the call is not
    literal."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == [ENTRY_NAME]
            and isinstance(node.value, ast.Call)
        ):
            call = node.value
            try:
                arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
                if call.args or len(arguments) != len(call.keywords):
                    raise ValueError("positional or ** arguments")
                return AlgorithmDescriptor(**arguments)
            except (ValueError, TypeError) as error:
                raise ValueError(
                    f"{path}: {ENTRY_NAME} must be AlgorithmDescriptor(...) with literal keyword arguments ({error})"
                ) from None
    return None


def dropped_in(directory: Path = ALGORITHMS_DIR, package: str = ALGORITHMS_PACKAGE) -> list[AlgorithmModule]:
    """The algorithm modules in ``directory`` (the package ``package``), by file name."""
    found = []
    for path in sorted(directory.glob("*.py")):
        entry = read_entry(path)
        if entry is not None:
            found.append(AlgorithmModule(entry, f"{package}.{path.stem}"))
    return found


def from_entry_points() -> list[AlgorithmModule]:
    """The algorithm modules installed packages name in the ``hacrl.algorithms`` group. Finding a
    module's file imports its parent packages, not the module."""
    found = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        spec = importlib.util.find_spec(point.module)
        entry = read_entry(Path(spec.origin)) if spec is not None and spec.origin else None
        if entry is None:
            raise ValueError(
                f"entry point {point.name} = {point.value!r} ({ENTRY_POINT_GROUP}): "
                f"module {point.module!r} {'is not installed' if spec is None else f'declares no {ENTRY_NAME}'}"
            )
        if entry.name != point.name:
            raise ValueError(
                f"entry point {point.name} ({ENTRY_POINT_GROUP}) names module {point.module!r}, whose algorithm is {entry.name!r}"
            )
        found.append(AlgorithmModule(entry, point.module))
    return found


@cache
def plugin_algorithms() -> tuple[AlgorithmModule, ...]:
    """Every plugin algorithm here, dropped in or installed; a name taken twice (or a built-in's) raises."""
    taken = {entry.name: "the built-in table (hacrl_core/catalog.py)" for entry in ALGORITHM_TABLE}
    found = []
    for plugin in dropped_in() + from_entry_points():
        if plugin.entry.name in taken:
            raise ValueError(
                f"algorithm {plugin.entry.name!r} of {plugin.module} is already defined by {taken[plugin.entry.name]}"
            )
        taken[plugin.entry.name] = plugin.module
        found.append(plugin)
    return tuple(found)


def algorithm_entries() -> tuple[AlgorithmDescriptor, ...]:
    """Every algorithm a spec may name: the built-in table's, in its order, then the plugins'."""
    return ALGORITHM_TABLE + tuple(plugin.entry for plugin in plugin_algorithms())


#: Every algorithm name a spec may use here (the CRD's enum where `hacrl crd` renders it).
ALGORITHM_NAMES: tuple[str, ...] = tuple(entry.name for entry in algorithm_entries())
#: The algorithms whose learners also train on the other agents' rows (they need 2 agents or more).
SHARED_ROW_ALGORITHMS: tuple[str, ...] = tuple(entry.name for entry in algorithm_entries() if entry.shares_rows)

# The spec's algorithm name: one of ALGORITHM_NAMES for pydantic and the CRD's enum; `str` for the
# type checker (the names are found at run time, plugins included).
if TYPE_CHECKING:
    AlgorithmName = str
else:
    AlgorithmName = Literal[ALGORITHM_NAMES]
