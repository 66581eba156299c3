"""Algorithms by name: what rows a learner trains on, how advantages are formed, which loss.

The learner looks its algorithm up here once, from ``spec.algorithm.name`` and its ablations
(``resolve_algorithm``); every algorithm-specific choice is a field of the ``Algorithm`` it gets
back, so there is no if/elif on the name anywhere else. Registering a different definition under
a taken name raises, and an unknown name lists the valid ones (as verl's ``register_policy_loss``).
Which algorithms exist, and what sets each apart, is the torch-free table ``hacrl_core.catalog``
(the spec offers its names); this module pairs each row with its loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Literal, Protocol

import torch

from hacrl_core.algorithms.losses import grpo_loss, gspo_loss, hacpo_loss, masked_mean
from hacrl_core.catalog import ALGORITHM_TABLE, AlgorithmDescriptor
from hacrl_core.registry import Registry


class LossSettings(Protocol):
    """The knobs a policy loss reads (``hacrl_core.spec.AlgorithmSpec`` provides them)."""

    effective_alpha: float  # alpha, or 0 when exponential importance sampling is ablated
    delta: float
    effective_delta_step: float  # delta_step, or 0 when stepwise clipping is ablated
    own_clip_low: float
    own_clip_high: float
    grpo_clip_low: float
    grpo_clip_high: float


@dataclass
class PolicyLossInputs:
    """One mini-batch as the learner sees it, all rows already encoded in its own tokenizer.

    logp_new: float[N, T] learner's per-token log-probs (with grad); response_mask: [N, T];
    logp_old_mean: float[N] the sampling-side old log-prob per row (source's own tokens, mean);
    logp_old: float[N, T] learner's own pre-update per-token log-probs (own rows; token-level
    losses need them); advantages, discrepancy: float[N]; is_own: bool[N]; update_index: m.
    """

    logp_new: torch.Tensor
    response_mask: torch.Tensor
    logp_old_mean: torch.Tensor
    logp_old: torch.Tensor
    advantages: torch.Tensor
    is_own: torch.Tensor
    discrepancy: torch.Tensor
    update_index: int


PolicyLoss = Callable[[PolicyLossInputs, LossSettings], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """How one named algorithm trains a learner.

    shares_rows: the learner also trains on the other agents' rows of the step; only then is the
        capability of the agents tracked (isolated algorithms never look at it).
    advantage_mode: passed to ``group_advantages``.
    cross_old_logprob: for shared rows, whose pre-update log-prob is the ratio's denominator:
        "source" (the sampler's, importance sampling across policies, HACPO) or "learner" (the
        learner's own, i.e. treat the row as if it were on-policy: naive sharing).
    discrepancy_coefficient: cross rows are weighted by omega(source, learner) (mechanism 2).
    policy_loss: the loss.
    aggregation: what the loss is a mean over, "rows" or "tokens"; the learner weights
        micro-batches by it so gradient accumulation equals one pass over the mini-batch.
    """

    name: str
    shares_rows: bool
    advantage_mode: str
    cross_old_logprob: Literal["source", "learner"]
    policy_loss: PolicyLoss
    discrepancy_coefficient: bool = False
    aggregation: Literal["rows", "tokens"] = "rows"

    def without(self, *, capability_advantage: bool = True, discrepancy_coefficient: bool = True) -> Algorithm:
        """This algorithm with mechanisms 1 and 2 switched off where an ablation says so (3 and 4
        are loss settings: ``AlgorithmSpec.effective_alpha`` / ``effective_delta_step``)."""
        mode = self.advantage_mode
        if mode == "hacpo" and not capability_advantage:
            mode = "naive"  # the plain mean of the mixed group
        return replace(self, advantage_mode=mode, discrepancy_coefficient=self.discrepancy_coefficient and discrepancy_coefficient)

    def loss_weight(self, response_lengths: Sequence[int]) -> float:
        """How much of a mini-batch a set of rows is, in the unit the loss averages over."""
        if self.aggregation == "tokens":
            return float(sum(response_lengths)) or 1.0
        return float(len(response_lengths)) or 1.0


ALGORITHMS: Registry[Algorithm] = Registry("algorithm")


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    return ALGORITHMS.register(algorithm.name, algorithm)


def get_algorithm(name: str) -> Algorithm:
    return ALGORITHMS.get(name)


def resolve_algorithm(settings) -> Algorithm:
    """The ``Algorithm`` a spec's ``algorithm`` section trains with: its name, then its ablations."""
    ablations = settings.ablations
    return get_algorithm(settings.name).without(
        capability_advantage=ablations.capability_advantage, discrepancy_coefficient=ablations.discrepancy_coefficient
    )


def _row_mean(inputs: PolicyLossInputs) -> torch.Tensor:
    return masked_mean(inputs.logp_new, inputs.response_mask, dim=-1)


def hacpo_policy_loss(inputs: PolicyLossInputs, settings: LossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    return hacpo_loss(
        _row_mean(inputs),
        inputs.logp_old_mean,
        inputs.advantages,
        inputs.is_own,
        inputs.discrepancy,
        inputs.update_index,
        alpha=settings.effective_alpha,
        delta=settings.delta,
        delta_step=settings.effective_delta_step,
        own_clip=(settings.own_clip_low, settings.own_clip_high),
    )


def gspo_policy_loss(inputs: PolicyLossInputs, settings: LossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    return gspo_loss(
        _row_mean(inputs),
        inputs.logp_old_mean,
        inputs.advantages,
        clip=(settings.own_clip_low, settings.own_clip_high),
    )


def grpo_policy_loss(inputs: PolicyLossInputs, settings: LossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    return grpo_loss(
        inputs.logp_new,
        inputs.logp_old,
        inputs.advantages,
        inputs.response_mask,
        clip=(settings.grpo_clip_low, settings.grpo_clip_high),
    )


POLICY_LOSSES: dict[str, PolicyLoss] = {"hacpo": hacpo_policy_loss, "gspo": gspo_policy_loss, "grpo": grpo_policy_loss}


def from_descriptor(descriptor: AlgorithmDescriptor) -> Algorithm:
    """The ``Algorithm`` of a row of the torch-free table (``hacrl_core.catalog``): its data, and its loss."""
    data = {f.name: getattr(descriptor, f.name) for f in fields(descriptor) if f.name != "policy_loss"}
    return Algorithm(**data, policy_loss=POLICY_LOSSES[descriptor.policy_loss])


# Every algorithm the spec offers (the catalog is where its names are written), in the table's order.
for _descriptor in ALGORITHM_TABLE:
    register_algorithm(from_descriptor(_descriptor))
