"""Group-relative advantages: HACPO's capability-aware baseline and the baselines' variants.

docs/algorithm.md, "Formulas" (step 4). All tensors are per response ("row"); ``group_ids`` says which
prompt a row answers, ``source_agent`` which agent sampled it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hacrl_core.algorithms.capability import capability_ratios

ADVANTAGE_MODES = ("hacpo", "naive", "gspo", "grpo")


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
        mode: ``"hacpo"``: over all nG rows of a prompt, baseline
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
    varies = (stats.count >= 2) & (stats.max > stats.min)
    per_row = stats.index
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
    baselines = stats.baseline[stats.index]
    return torch.where(stats.in_group, baselines, torch.zeros_like(baselines))


class _GroupStatistics(NamedTuple):
    rewards: torch.Tensor  # float64[N]
    index: torch.Tensor  # long[N], dense group index of each row
    in_group: torch.Tensor  # bool[N], row takes part in its group's statistics
    count: torch.Tensor  # per group, rows taking part
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
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; valid modes: {', '.join(ADVANTAGE_MODES)}")
    if not (rewards.shape == group_ids.shape == source_agent.shape) or rewards.dim() != 1:
        raise ValueError(
            "rewards, group_ids and source_agent must be 1-D of equal length, got "
            f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, {tuple(source_agent.shape)}"
        )
    values = rewards.to(torch.float64)
    is_own = source_agent == learner
    in_group = is_own if mode in ("gspo", "grpo") else torch.ones_like(is_own)
    _, index = torch.unique(group_ids, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    if mode == "hacpo":
        omega = capability_ratios(capability, bounds)[learner]  # omega(k, j) for every source j
        weights = omega[source_agent.long()]
    else:
        weights = torch.ones_like(values)

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
    if mode == "hacpo":
        own = member * is_own.to(torch.float64)
        own_count = group_sum(own)
        own_mean = torch.where(own_count > 0, group_sum(own * values) / own_count.clamp_min(1.0), mean)
        baseline = torch.where(baseline > highest, own_mean, baseline)
    deviation = member * (values - mean[index]) ** 2
    std = (group_sum(deviation) / (count - 1).clamp_min(1.0)).sqrt()
    return _GroupStatistics(values, index, in_group, count, baseline, std, highest, lowest)
