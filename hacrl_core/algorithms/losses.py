"""Policy losses: HACPO (paper mechanisms 2-4), GSPO, GRPO, and the k3 KL penalty.

Pure functions in the manner of verl's ``core_algos``: tensors in, ``(loss, metrics)`` out, the
metrics detached Python floats. Every loss is a *mean over rows* (sequences) unless it says
otherwise; "mean over tokens, then over sequences" is written once, in ``masked_mean``. At the
end, each algorithm's loss as the learner calls it: one typed input (``PolicyLossInputs``) and the
spec's settings, registered by name (``@register_policy_loss``).
"""

from __future__ import annotations

import torch

from hacrl_core.algorithms.policy_loss import LossSettings, PolicyLossInputs, register_policy_loss

LOG_RATIO_BOUND = 10.0  # two-sided clamp of the sequence log-ratio (docs/algorithm.md, "Formulas", step 6)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1, over ``dim`` (all elements when None).

    A slice with no unmasked element yields 0 rather than NaN, so empty rows never poison a batch.
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / count.clamp_min(1.0)


def sequence_log_ratio(logp_new_mean: torch.Tensor, logp_old_mean: torch.Tensor) -> torch.Tensor:
    """log s_i = mean log pi_new(y_i) - mean log pi_old(y_i), clamped to [-10, 10].

    Each mean is over the tokens of its own tokenizer (docs/algorithm.md, "Formulas", step 6).
    """
    return (logp_new_mean - logp_old_mean).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def clipped_surrogate_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-element loss -min(r*A, clip(r, 1-low, 1+high)*A) and whether clipping was active."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def stepwise_lower_bound(update_index: int, delta: float, delta_step: float) -> float:
    """lo_m = min(1, 1 - delta + m * delta_step): the cross-row ratio floor rises with each update m."""
    return min(1.0, 1.0 - delta + update_index * delta_step)


def hacpo_loss(
    logp_new_mean: torch.Tensor,
    logp_old_mean: torch.Tensor,
    advantages: torch.Tensor,
    is_own: torch.Tensor,
    discrepancy: torch.Tensor,
    update_index: int,
    *,
    alpha: float = 1.0,
    delta: float = 0.2,
    delta_step: float = 0.025,
    own_clip: tuple[float, float] = (3e-4, 4e-4),
) -> tuple[torch.Tensor, dict[str, float]]:
    """HACPO policy loss of one learner on one optimizer update (docs/algorithm.md, "Formulas", step 7).

    Args:
        logp_new_mean: float[N], mean over the learner's tokens of log pi_k(y_i) (carries grad).
        logp_old_mean: float[N], mean over the source's tokens of log pi_old^(src)(y_i); for own
            rows that is the learner's own pre-update score.
        advantages: float[N], from ``group_advantages``.
        is_own: bool[N], True for rows the learner sampled itself.
        discrepancy: float[N], omega(src, k) = P_src / P_k for cross rows (mechanism 2), 1 for own
            rows. Pass ones to ablate the capability discrepancy coefficient.
        update_index: m, 0-based index of this optimizer update within the step.
        alpha: exponent of the exponential importance weight s~ = c * stopgrad(c)^alpha
            (mechanism 3); 0 ablates it.
        delta, delta_step: stepwise clipping (mechanism 4), cross ratios clamped to
            [min(1, 1 - delta + m * delta_step), 1]; delta_step 0 keeps a fixed floor.
        own_clip: GSPO's (low, high) clip of own rows' sequence ratio.

    Returns:
        The mean over all N rows of -min(s*A, clip(s)*A) (own) and -omega * s~ * A (cross), and
        detached metrics. Cross rows have no PPO min(): outside [lo_m, 1] their gradient is zero
        whatever the sign of A. Inside, d(loss_i)/d(theta) = -omega * A * s^(alpha+1) *
        d(mean log pi_k(y_i))/d(theta) / N.
    """
    is_own = is_own.bool()
    is_cross = ~is_own
    log_ratio = sequence_log_ratio(logp_new_mean, logp_old_mean)
    ratio = torch.exp(log_ratio)

    own_loss, own_clipped = clipped_surrogate_loss(ratio, advantages, *own_clip)

    low = stepwise_lower_bound(update_index, delta, delta_step)
    bounded = ratio.clamp(low, 1.0)
    weighted_ratio = bounded * bounded.detach().pow(alpha)
    cross_loss = -discrepancy.to(ratio.dtype) * weighted_ratio * advantages

    row_loss = torch.where(is_own, own_loss, cross_loss)
    loss = row_loss.mean()

    with torch.no_grad():
        cross_outside = (ratio < low) | (ratio > 1.0)
        # |d loss_i / d log s_i|: how much of the update each row drives (zero where clipped).
        own_weight = torch.where(own_clipped, torch.zeros_like(ratio), (ratio * advantages).abs())
        cross_weight = torch.where(
            cross_outside,
            torch.zeros_like(ratio),
            (discrepancy.to(ratio.dtype) * advantages).abs() * ratio.pow(alpha + 1),
        )
        row_weight = torch.where(is_own, own_weight, cross_weight)
        total_weight = float(row_weight.sum())
        metrics = {
            "pg_loss": float(loss.detach()),
            "own_rows": float(is_own.sum()),
            "cross_rows": float(is_cross.sum()),
            "own_ratio_mean": _mean_where(ratio, is_own),
            "own_clip_frac": _mean_where(own_clipped.to(ratio.dtype), is_own),
            "cross_ratio_mean": _mean_where(ratio, is_cross),
            "cross_ratio_min": float(ratio[is_cross].min()) if is_cross.any() else 0.0,
            "cross_ratio_max": float(ratio[is_cross].max()) if is_cross.any() else 0.0,
            "cross_clip_frac": _mean_where(cross_outside.to(ratio.dtype), is_cross),
            "cross_lower_bound": low,
            "cross_weight_mean": _mean_where(discrepancy.to(ratio.dtype) * weighted_ratio, is_cross),
            "cross_grad_share": float(row_weight[is_cross].sum()) / total_weight if total_weight > 0 else 0.0,
            # the sums behind cross_grad_share, so that a caller can form it over several calls
            "grad_weight": total_weight,
            "cross_grad_weight": float(row_weight[is_cross].sum()),
        }
    return loss, metrics


def gspo_loss(
    logp_new_mean: torch.Tensor,
    logp_old_mean: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip: tuple[float, float] = (3e-4, 4e-4),
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence-level ratio with PPO clipping, mean over rows. Shapes as ``hacpo_loss``."""
    ratio = torch.exp(sequence_log_ratio(logp_new_mean, logp_old_mean))
    row_loss, clipped = clipped_surrogate_loss(ratio, advantages, *clip)
    loss = row_loss.mean()
    metrics = {
        "pg_loss": float(loss.detach()),
        "own_rows": float(ratio.numel()),
        "own_ratio_mean": float(ratio.detach().mean()) if ratio.numel() else 0.0,
        "own_clip_frac": float(clipped.float().mean()) if ratio.numel() else 0.0,
    }
    return loss, metrics


def grpo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip: tuple[float, float] = (0.2, 0.28),
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO with clip-higher: token-level ratio, PPO clip, token-mean over the whole batch.

    Args:
        logp_new, logp_old: float[N, T] per-token log-probs (same tokenizer: own rows only).
        advantages: float[N], broadcast to every response token of the row.
        response_mask: float/bool[N, T], 1 on response tokens.
    """
    log_ratio = (logp_new - logp_old).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    token_loss, clipped = clipped_surrogate_loss(ratio, advantages[:, None].to(ratio.dtype), *clip)
    loss = masked_mean(token_loss, response_mask)
    metrics = {
        "pg_loss": float(loss.detach()),
        "own_rows": float(logp_new.shape[0]),
        "own_ratio_mean": float(masked_mean(ratio.detach(), response_mask)),
        "own_clip_frac": float(masked_mean(clipped.to(ratio.dtype), response_mask)),
    }
    return loss, metrics


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.exp(log_ratio) - log_ratio - 1.0


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, response_mask: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """k3 KL to the reference: mean over each row's tokens, then mean over ``rows`` (bool[N]).

    The learner adds ``kl_coef * kl_penalty(...)`` on its own rows only (docs/algorithm.md, "Formulas", step 7).
    """
    per_row = masked_mean(k3_kl(logp, ref_logp), response_mask, dim=-1)
    return masked_mean(per_row, rows.to(per_row.dtype))


def _mean_where(values: torch.Tensor, where: torch.Tensor) -> float:
    return float(values[where].mean()) if where.any() else 0.0


def _row_mean(inputs: PolicyLossInputs) -> torch.Tensor:
    return masked_mean(inputs.logp_new, inputs.response_mask, dim=-1)


@register_policy_loss("hacpo")
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


@register_policy_loss("gspo")
def gspo_policy_loss(inputs: PolicyLossInputs, settings: LossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    return gspo_loss(
        _row_mean(inputs),
        inputs.logp_old_mean,
        inputs.advantages,
        clip=(settings.own_clip_low, settings.own_clip_high),
    )


@register_policy_loss("grpo")
def grpo_policy_loss(inputs: PolicyLossInputs, settings: LossSettings) -> tuple[torch.Tensor, dict[str, float]]:
    return grpo_loss(
        inputs.logp_new,
        inputs.logp_old,
        inputs.advantages,
        inputs.response_mask,
        clip=(settings.grpo_clip_low, settings.grpo_clip_high),
    )
