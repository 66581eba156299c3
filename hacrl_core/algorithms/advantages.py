"""Group-relative advantages: HACPO's capability-aware baseline and the baselines' variants.

docs/algorithm.md, "Formulas" (step 4). All tensors are per response ("row"); ``group_ids`` says which
prompt a row answers, ``source_agent`` which agent sampled it.

An advantage mode is a function registered by name (``@register_adv_est``, as verl's
``register_adv_est``) that says which rows form a prompt's group and how each weighs in its
baseline (``GroupRule``); the group statistics are computed once, the same for every mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from hacrl_core.algorithms.capability import capability_ratios
from hacrl_core.registry import Registry


class GroupRule(NamedTuple):
    """An advantage mode's rows: which form their prompt's group, and each one's weight in the baseline."""

    in_group: torch.Tensor  # bool[N]
    weights: torch.Tensor  # float64[N], times the reward in the baseline's sum
    own_fallback: bool  # a baseline above the group's largest reward falls back to the own rows' mean


#: (rewards float64[N], is_own bool[N], source_agent long[N], learner k, capability float[n], omega bounds) -> rule.
AdvantageEstimator = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor, tuple[float, float]], GroupRule
]

ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage mode")


def register_adv_est(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """``@register_adv_est("name")``: the decorated rule, registered as advantage mode ``name``."""
    return ADVANTAGE_ESTIMATORS.decorator(name)


@register_adv_est("hacpo")
def capability_weighted(values, is_own, source_agent, learner, capability, bounds) -> GroupRule:
    """Mechanism 1: all nG rows of a prompt, each reward weighted by omega(k, src)."""
    omega = capability_ratios(capability, bounds)[learner]  # omega(k, j) for every source j
    return GroupRule(torch.ones_like(is_own), omega[source_agent.long()], True)


@register_adv_est("naive")
def mixed_group(values, is_own, source_agent, learner, capability, bounds) -> GroupRule:
    """The plain mean of the mixed group."""
    return GroupRule(torch.ones_like(is_own), torch.ones_like(values), False)


@register_adv_est("gspo")
@register_adv_est("grpo")
def own_group(values, is_own, source_agent, learner, capability, bounds) -> GroupRule:
    """Only the learner's own rows form the group; other rows get 0."""
    return GroupRule(is_own, torch.ones_like(values), False)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    source_agent: torch.Tensor,
    learner: int,
    capability: torch.Tensor,
    mode: str = "hacpo",
    eps: float = 1e-6,
    *,
    bounds: tuple[float, float] = (0.1, 10.0),
) -> torch.Tensor:
    """Advantage of every row for learner ``learner``.

    Args:
        rewards: float[N], reward R_i of each row.
        group_ids: long[N], prompt group of each row (all agents' rows of one prompt share it).
        source_agent: long[N], index of the agent that sampled each row.
        learner: index k of the learner the advantages are for.
        capability: float[n_agents], smoothed capability P (``CapabilityTracker.capability``;
            pass ones to disable the capability weighting, e.g. during warm-up).
        mode: the registered advantage mode (``register_adv_est``). ``"hacpo"``: over all nG rows of a prompt, baseline
            mu_k = (1/nG) * sum_i omega(k, src_i) * R_i (paper mechanism 1), falling back to the
            mean of the learner's own rewards in the group when mu_k exceeds the group's largest
            reward. ``"naive"``: the plain mean of the mixed group. ``"gspo"``/``"grpo"``: only the
            learner's own rows form the group; other rows get 0.
        eps: added to the standard deviation.
        bounds: clamp of omega(k, j) = P_k / P_j.

    Returns:
        float[N] advantages A_i = (R_i - mu) / (std_unbiased(R of the group) + eps), the std taken
        over the *unweighted* rewards of the rows that form the group. A group whose rewards are
        all equal, or that has a single row, gets A = 0.
    """
    stats = _group_statistics(rewards, group_ids, source_agent, learner, capability, mode, bounds)
    varies = (stats.group_count >= 2) & (stats.max > stats.min)
    per_row = stats.group_index
    advantages = (stats.rewards - stats.baseline[per_row]) / (stats.std[per_row] + eps)
    advantages = torch.where(stats.in_group & varies[per_row], advantages, torch.zeros_like(advantages))
    return advantages.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def group_baselines(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    source_agent: torch.Tensor,
    learner: int,
    capability: torch.Tensor,
    mode: str = "hacpo",
    *,
    bounds: tuple[float, float] = (0.1, 10.0),
) -> torch.Tensor:
    """Baseline mu of the group of every row (float64[N]; 0 for rows outside any group).

    Arguments as ``group_advantages``. Exposed on its own because the paper's claim is about the
    baseline: with P equal to the true success rates, E[mu_k] is learner k's expected reward.
    """
    stats = _group_statistics(rewards, group_ids, source_agent, learner, capability, mode, bounds)
    baselines = stats.baseline[stats.group_index]
    return torch.where(stats.in_group, baselines, torch.zeros_like(baselines))


class _GroupStatistics(NamedTuple):
    rewards: torch.Tensor  # float64[N]
    group_index: torch.Tensor  # long[N], dense group index of each row
    in_group: torch.Tensor  # bool[N], row takes part in its group's statistics
    group_count: torch.Tensor  # per group, rows taking part
    baseline: torch.Tensor  # per group, mu (after the fallback)
    std: torch.Tensor  # per group, unbiased std of the unweighted rewards
    max: torch.Tensor
    min: torch.Tensor


def _group_statistics(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    source_agent: torch.Tensor,
    learner: int,
    capability: torch.Tensor,
    mode: str,
    bounds: tuple[float, float],
) -> _GroupStatistics:
    """Per-group sums in one pass of scatter-adds (a Python loop over groups is far too slow)."""
    if mode not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage mode {mode!r}; valid modes: {', '.join(ADVANTAGE_ESTIMATORS.names())}")
    if not (rewards.shape == group_ids.shape == source_agent.shape) or rewards.dim() != 1:
        raise ValueError(
            "rewards, group_ids and source_agent must be 1-D of equal length, got "
            f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, {tuple(source_agent.shape)}"
        )
    values = rewards.to(torch.float64)
    is_own = source_agent == learner
    in_group, weights, own_fallback = ADVANTAGE_ESTIMATORS.get(mode)(
        values, is_own, source_agent, learner, capability, bounds
    )
    _, index = torch.unique(group_ids, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0

    def group_sum(per_row: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, per_row)

    member = in_group.to(torch.float64)
    count = group_sum(member)
    safe_count = count.clamp_min(1.0)
    mean = group_sum(member * values) / safe_count
    baseline = group_sum(member * weights * values) / safe_count
    highest = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, index, torch.where(in_group, values, -torch.inf), "amax"
    )
    lowest = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(
        0, index, torch.where(in_group, values, torch.inf), "amin"
    )
    if own_fallback:
        own = member * is_own.to(torch.float64)
        own_count = group_sum(own)
        own_mean = torch.where(own_count > 0, group_sum(own * values) / own_count.clamp_min(1.0), mean)
        baseline = torch.where(baseline > highest, own_mean, baseline)
    deviation = member * (values - mean[index]) ** 2
    std = (group_sum(deviation) / (count - 1).clamp_min(1.0)).sqrt()
    return _GroupStatistics(values, index, in_group, count, baseline, std, highest, lowest)
