"""Algorithms by name: an algorithm is its catalog entry, with its loss and advantage mode looked
up by the names the entry gives.

The learner looks its algorithm up here once, from ``spec.algorithm.name`` and its ablations
(``resolve_algorithm``); every algorithm-specific choice is a field of the entry the ``Algorithm``
holds, so there is no if/elif on the name anywhere else. The entries are the built-in table
(``hacrl_core.catalog``) and the plugins' (``hacrl_core.algorithm_plugins``: a module dropped into
this folder, or named by an installed package's ``hacrl.algorithms`` entry point), whose modules
are imported the first time a name is not found. Registering a different definition under a taken
name raises, and an unknown name lists the valid ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from hacrl_core.algorithm_plugins import ENTRY_NAME, plugin_algorithms
from hacrl_core.algorithms import losses as _builtin_losses  # noqa: F401  registers the built-in losses
from hacrl_core.algorithms.advantages import ADVANTAGE_ESTIMATORS
from hacrl_core.algorithms.policy_loss import POLICY_LOSSES, PolicyLoss
from hacrl_core.catalog import ALGORITHM_TABLE, AlgorithmDescriptor
from hacrl_core.registry import Registry


@dataclass(frozen=True)
class Algorithm:
    """How one named algorithm trains a learner: its catalog entry (``AlgorithmDescriptor``: read
    its docstring for each field), after the spec's ablations, and the loss the entry names."""

    entry: AlgorithmDescriptor

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def shares_rows(self) -> bool:
        return self.entry.shares_rows

    @property
    def advantage_mode(self) -> str:
        return self.entry.advantage_mode

    @property
    def cross_old_logprob(self) -> Literal["source", "learner"]:
        return self.entry.cross_old_logprob

    @property
    def discrepancy_coefficient(self) -> bool:
        return self.entry.discrepancy_coefficient

    @property
    def aggregation(self) -> Literal["rows", "tokens"]:
        return self.entry.aggregation

    @property
    def policy_loss(self) -> PolicyLoss:
        return POLICY_LOSSES.get(self.entry.policy_loss)

    def without(self, *, capability_advantage: bool = True, discrepancy_coefficient: bool = True) -> Algorithm:
        """This algorithm with mechanisms 1 and 2 switched off where an ablation says so (3 and 4
        are loss settings: ``AlgorithmSpec.effective_alpha`` / ``effective_delta_step``)."""
        mode = self.advantage_mode
        if mode == "hacpo" and not capability_advantage:
            mode = "naive"  # the plain mean of the mixed group
        return Algorithm(
            replace(
                self.entry,
                advantage_mode=mode,
                discrepancy_coefficient=self.discrepancy_coefficient and discrepancy_coefficient,
            )
        )

    def loss_weight(self, response_lengths: Sequence[int]) -> float:
        """How much of a mini-batch a set of rows is, in the unit the loss averages over."""
        if self.aggregation == "tokens":
            return float(sum(response_lengths)) or 1.0
        return float(len(response_lengths)) or 1.0


ALGORITHMS: Registry[Algorithm] = Registry("algorithm")


def register_algorithm(entry: AlgorithmDescriptor) -> Algorithm:
    """The ``Algorithm`` of ``entry``, registered under its name; its loss and advantage mode must
    be registered already (``ValueError`` names the one missing)."""
    for kind, registry, name in (
        ("policy_loss", POLICY_LOSSES, entry.policy_loss),
        ("advantage_mode", ADVANTAGE_ESTIMATORS, entry.advantage_mode),
    ):
        if name not in registry:
            raise ValueError(
                f"algorithm {entry.name!r}: {kind} {name!r} is not registered (registered: {', '.join(registry.names())})"
            )
    return ALGORITHMS.register(entry.name, Algorithm(entry))


def load_plugins() -> None:
    """Import every plugin algorithm's module (it registers its functions) and register its entry.
    The entry was read from the module's source (``algorithm_plugins``); the module must define
    the same one."""
    for plugin in plugin_algorithms():
        if plugin.entry.name in ALGORITHMS:
            continue
        declared = getattr(importlib.import_module(plugin.module), ENTRY_NAME, None)
        if declared != plugin.entry:
            raise ValueError(f"{plugin.module}.{ENTRY_NAME} is {declared!r} when imported, {plugin.entry!r} as written")
        register_algorithm(plugin.entry)


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        load_plugins()
    return ALGORITHMS.get(name)


def resolve_algorithm(settings) -> Algorithm:
    """The ``Algorithm`` a spec's ``algorithm`` section trains with: its name, then its ablations."""
    ablations = settings.ablations
    return get_algorithm(settings.name).without(
        capability_advantage=ablations.capability_advantage, discrepancy_coefficient=ablations.discrepancy_coefficient
    )


# The built-in algorithms, in the table's order.
for _entry in ALGORITHM_TABLE:
    register_algorithm(_entry)
