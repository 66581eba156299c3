"""What a spec may name, as plain tables: the algorithms (and, for each, what sets it apart), the
rollout engines and the training backends (and where each lives, and what it needs installed).

The spec validates names against these tables (and, for algorithms, the plugins
``hacrl_core.algorithm_plugins`` finds) and the registries that run them
(``hacrl_core.algorithms.registry``, ``hacrl_core.rollout.engine``, ``hacrl_core.learner.backends``)
are filled from them, so a name is written once; what a worker checks before it starts
(``hacrl_core.context.unsupported_settings``) reads them without importing an engine or a backend.
This module imports nothing but the standard library: the operator validates specs and must not
load torch (docs/architecture.md, "The spec").
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal


@dataclass(frozen=True, kw_only=True)
class AlgorithmDescriptor:
    """One algorithm's catalog entry, torch-free: everything that sets it apart, as data.

    shares_rows: the learner also trains on the other agents' rows of the step; only then is the
        capability of the agents tracked (isolated algorithms never look at it).
    advantage_mode: the registered advantage estimator (``algorithms.advantages.register_adv_est``).
    cross_old_logprob: for shared rows, whose pre-update log-prob is the ratio's denominator:
        "source" (the sampler's, importance sampling across policies, HACPO) or "learner" (the
        learner's own, i.e. treat the row as if it were on-policy: naive sharing).
    policy_loss: the registered loss (``algorithms.policy_loss.register_policy_loss``).
    discrepancy_coefficient: cross rows are weighted by omega(source, learner) (mechanism 2).
    aggregation: what the loss is a mean over, "rows" or "tokens"; the learner weights
        micro-batches by it so gradient accumulation equals one pass over the mini-batch.
    """

    name: str
    shares_rows: bool
    advantage_mode: str
    cross_old_logprob: Literal["source", "learner"]
    policy_loss: str
    discrepancy_coefficient: bool = False
    aggregation: Literal["rows", "tokens"] = "rows"


#: The built-in algorithms (the CRD lists their names in this order); a plugin's entry is its
#: module's (``hacrl_core.algorithm_plugins``, docs/algorithm.md "A new algorithm").
ALGORITHM_TABLE: tuple[AlgorithmDescriptor, ...] = (
    AlgorithmDescriptor(
        name="hacpo",
        shares_rows=True,
        advantage_mode="hacpo",
        cross_old_logprob="source",
        policy_loss="hacpo",
        discrepancy_coefficient=True,
    ),
    AlgorithmDescriptor(
        name="gspo", shares_rows=False, advantage_mode="gspo", cross_old_logprob="source", policy_loss="gspo"
    ),
    AlgorithmDescriptor(
        name="grpo",
        shares_rows=False,
        advantage_mode="grpo",
        cross_old_logprob="source",
        policy_loss="grpo",
        aggregation="tokens",
    ),
    # Naive sharing: the peers' rows as if they were the learner's own (its own old log-prob).
    AlgorithmDescriptor(
        name="naive", shares_rows=True, advantage_mode="naive", cross_old_logprob="learner", policy_loss="gspo"
    ),
)


@dataclass(frozen=True)
class EngineModule:
    """Where a rollout engine lives. Its module is imported only when the engine is used:
    importing vLLM takes seconds and logs to stdout, and this table imports no engine, so the
    engines can import it without a cycle."""

    module: str  # defines the engine class and ``engine_options(settings, lora)``
    factory: str  # the engine class, called with ``engine_options(settings, lora)``
    requires: str | None = None  # the distribution it needs, where that is optional

    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


@dataclass(frozen=True)
class BackendModule:
    """Where a training backend lives: the module that registers it (``@register_backend``), and
    the distribution it needs where that is optional. An optional backend's module is imported
    only when a spec asks for it: importing DeepSpeed costs seconds and makes its logger print to
    stdout, which would corrupt the JSON that commands such as `hacrl eval` print."""

    module: str
    requires: str | None = None

    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


ENGINE_TABLE: dict[str, EngineModule] = {
    "hf": EngineModule("hacrl_core.rollout.hf_engine", "HFEngine"),
    "vllm": EngineModule("hacrl_core.rollout.vllm_engine", "VLLMEngine", requires="vllm"),
}
BACKEND_TABLE: dict[str, BackendModule] = {
    "torch": BackendModule("hacrl_core.learner.backends"),
    "deepspeed": BackendModule("hacrl_core.learner.deepspeed_backend", requires="deepspeed"),
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINE_TABLE)
BACKEND_NAMES: tuple[str, ...] = tuple(BACKEND_TABLE)

# A spec field typed with these accepts only a name of the table: pydantic validates it and the CRD
# lists the names as an enum. The names are data (a table), so for the type checker they are `str`.
if TYPE_CHECKING:
    EngineName = str
    BackendName = str
else:
    EngineName = Literal[ENGINE_NAMES]
    BackendName = Literal[BACKEND_NAMES]


def installed_engines() -> list[str]:
    """Rollout engines that can run here, sorted: ``hf`` always, optional ones where their
    dependency is installed (found, not imported)."""
    return sorted(name for name, engine in ENGINE_TABLE.items() if engine.installed())


def installed_backends() -> list[str]:
    """Training backends that can run here, sorted, as ``installed_engines``."""
    return sorted(name for name, backend in BACKEND_TABLE.items() if backend.installed())
