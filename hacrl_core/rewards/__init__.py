"""Verifiable rewards, registered by name: ``exact``, ``numeric`` and ``math`` (Math-Verify).

``get_reward(name)(response, gold) -> float`` in [0, 1] scores the response text only;
``validate_gold(name, gold)`` raises ``ValueError`` for a gold answer the reward cannot use (called
when a dataset loads); ``reward_stats()`` reports counted rejections and timeouts.
"""

from hacrl_core.rewards import math_verify_reward as _math_verify_reward  # noqa: F401  (registers "math")
from hacrl_core.rewards import simple as _simple  # noqa: F401  (registers "exact", "numeric")
from hacrl_core.rewards.extract import extract_answer, normalize_answer, parse_number
from hacrl_core.rewards.math_verify_reward import MathVerifyReward
from hacrl_core.rewards.registry import (
    MAX_CHARS,
    RewardFn,
    get_reward,
    register_reward,
    reward_names,
    reward_stats,
    validate_gold,
)
from hacrl_core.rewards.simple import exact_reward, numeric_reward

__all__ = [
    "MAX_CHARS",
    "MathVerifyReward",
    "RewardFn",
    "exact_reward",
    "extract_answer",
    "get_reward",
    "normalize_answer",
    "numeric_reward",
    "parse_number",
    "register_reward",
    "reward_names",
    "reward_stats",
    "validate_gold",
]
