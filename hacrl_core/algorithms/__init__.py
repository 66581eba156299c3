"""The HACPO core math and its baselines (docs/algorithm.md): pure torch, no I/O."""

from hacrl_core.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    GroupRule,
    group_advantages,
    group_baselines,
    register_adv_est,
)
from hacrl_core.algorithms.capability import CapabilityTracker, capability_ratios
from hacrl_core.algorithms.losses import (
    clipped_surrogate_loss,
    grpo_loss,
    gspo_loss,
    hacpo_loss,
    k3_kl,
    kl_penalty,
    masked_mean,
    sequence_log_ratio,
    stepwise_lower_bound,
)
from hacrl_core.algorithms.policy_loss import POLICY_LOSSES, PolicyLossInputs, register_policy_loss
from hacrl_core.algorithms.registry import (
    ALGORITHMS,
    Algorithm,
    get_algorithm,
    register_algorithm,
    resolve_algorithm,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHMS",
    "Algorithm",
    "CapabilityTracker",
    "GroupRule",
    "POLICY_LOSSES",
    "PolicyLossInputs",
    "capability_ratios",
    "clipped_surrogate_loss",
    "get_algorithm",
    "group_advantages",
    "group_baselines",
    "grpo_loss",
    "gspo_loss",
    "hacpo_loss",
    "k3_kl",
    "kl_penalty",
    "masked_mean",
    "register_adv_est",
    "register_algorithm",
    "register_policy_loss",
    "resolve_algorithm",
    "sequence_log_ratio",
    "stepwise_lower_bound",
]
