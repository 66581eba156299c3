"""What a policy loss is: one typed input in, ``(loss, metrics)`` out, registered by name.

``@register_policy_loss("name")`` on the function registers it (as verl's ``register_policy_loss``);
an algorithm's catalog entry names its loss (``AlgorithmDescriptor.policy_loss``). The built-in
losses are at the end of ``losses.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

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


@dataclass(frozen=True, kw_only=True)
class PolicyLossInputs:
    """One micro-batch as the learner sees it, all rows already encoded in its own tokenizer.
    Keyword-only and frozen: several of these tensors have the same shape, and a name cannot be
    swapped by position.

    logp_new: float[N, T] learner's per-token log-probs (with grad); response_mask: [N, T];
    logp_old_mean: float[N] the sampling-side old log-prob per row (source's own tokens, mean);
    logp_old: float[N, T] learner's own pre-update per-token log-probs (own rows; token-level
    losses need them); advantages, discrepancy: float[N]; is_own: bool[N]; update_index: m;
    ref_logp: float[N, T] the frozen reference's per-token log-probs, None without a KL term
    (the learner adds the KL; a policy loss does not read it).
    """

    logp_new: torch.Tensor
    response_mask: torch.Tensor
    logp_old_mean: torch.Tensor
    logp_old: torch.Tensor
    advantages: torch.Tensor
    is_own: torch.Tensor
    discrepancy: torch.Tensor
    update_index: int
    ref_logp: torch.Tensor | None = None


PolicyLoss = Callable[[PolicyLossInputs, LossSettings], tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """``@register_policy_loss("name")``: the decorated loss, registered under ``name``."""
    return POLICY_LOSSES.decorator(name)
