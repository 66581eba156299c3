"""Verifiable rewards, registered by name: ``exact``, ``numeric`` and ``math`` (Math-Verify).

``get_reward(name)(response, gold) -> float`` in [0, 1] scores the response text only;
``scorer_for(data)`` scores a step's items with the spec's reward, built in or a reward server;
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
from hacrl_core.rewards.remote import RemoteReward, is_reward_url
from hacrl_core.rewards.scoring import RewardItem, Scorer, per_item
from hacrl_core.rewards.simple import exact_reward, numeric_reward


def scorer_for(data) -> Scorer:
    """The scorer of a spec's ``data`` section: its built-in reward, or the reward server its
    ``reward`` URL names with ``rewardServer``'s knobs (docs/rewards.md)."""
    if is_reward_url(data.reward):
        server = data.reward_server
        return RemoteReward(
            data.reward,
            timeout_seconds=server.timeout_seconds,
            retries=server.retries,
            concurrency=server.concurrency,
            batch_size=server.batch_size,
        ).score
    return per_item(get_reward(data.reward))


__all__ = [
    "MAX_CHARS",
    "MathVerifyReward",
    "RemoteReward",
    "RewardFn",
    "RewardItem",
    "Scorer",
    "exact_reward",
    "extract_answer",
    "get_reward",
    "normalize_answer",
    "numeric_reward",
    "parse_number",
    "register_reward",
    "reward_names",
    "reward_stats",
    "scorer_for",
    "validate_gold",
]
