"""What a spec may name, as plain tables: the algorithms (and, for each, what sets it apart).

The spec validates names against these tables and the registries that run them
(``hacrl_core.algorithms.registry``) are filled from them, so a name is written once. This
module imports nothing but the standard library: the operator validates specs and must not
load torch (docs/architecture.md, "The spec").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class AlgorithmDescriptor:
    """One algorithm, torch-free: the fields of ``hacrl_core.algorithms.registry.Algorithm`` that
    are data (read its docstring for each), and ``policy_loss``, the name of its loss there."""

    name: str
    shares_rows: bool
    advantage_mode: str
    cross_old_logprob: Literal["source", "learner"]
    policy_loss: Literal["hacpo", "gspo", "grpo"]
    discrepancy_coefficient: bool = False
    aggregation: Literal["rows", "tokens"] = "rows"


ALGORITHM_TABLE: tuple[AlgorithmDescriptor, ...] = (
    AlgorithmDescriptor(name="hacpo", shares_rows=True, advantage_mode="hacpo", cross_old_logprob="source", policy_loss="hacpo",
                        discrepancy_coefficient=True),
    AlgorithmDescriptor(name="gspo", shares_rows=False, advantage_mode="gspo", cross_old_logprob="source", policy_loss="gspo"),
    AlgorithmDescriptor(name="grpo", shares_rows=False, advantage_mode="grpo", cross_old_logprob="source", policy_loss="grpo",
                        aggregation="tokens"),
    # Naive sharing: the peers' rows as if they were the learner's own (its own old log-prob).
    AlgorithmDescriptor(name="naive", shares_rows=True, advantage_mode="naive", cross_old_logprob="learner", policy_loss="gspo"),
)

ALGORITHM_NAMES: tuple[str, ...] = tuple(a.name for a in ALGORITHM_TABLE)
#: The algorithms whose learners also train on the other agents' rows (they need 2 agents or more).
SHARED_ROW_ALGORITHMS: tuple[str, ...] = tuple(a.name for a in ALGORITHM_TABLE if a.shares_rows)
