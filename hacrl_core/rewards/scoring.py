"""A step's responses scored in one call: the spec's reward, built in or a reward server.

``scorer_for(data)`` gives ``score(items) -> list[float]``: a built-in reward (``exact``,
``numeric``, ``math``) scores each item's response against its gold; a URL (``https://...``)
sends the items to that reward server in batches (``rewards.remote``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Scorer = Callable[[Sequence["RewardItem"]], list[float]]


@dataclass(frozen=True)
class RewardItem:
    prompt: str
    response: str
    gold: str
    extra: dict[str, Any] = field(default_factory=dict)
    label: str = "an item"  # names the item in errors (prompt uid and sample)


def per_item(reward: Callable[[str, str], float]) -> Scorer:
    """A ``reward(response, gold)`` function as a scorer of items."""
    return lambda items: [float(reward(item.response, item.gold)) for item in items]


def scorer_for(data: Any) -> Scorer:
    """The scorer of a spec's ``data`` section (``data.reward``, ``data.rewardServer``)."""
    from hacrl_core.rewards.remote import RemoteReward, is_reward_url

    if is_reward_url(data.reward):
        server = data.reward_server
        return RemoteReward(data.reward, timeout_seconds=server.timeout_seconds, retries=server.retries,
                            concurrency=server.concurrency, batch_size=server.batch_size).score
    from hacrl_core.rewards.registry import get_reward

    return per_item(get_reward(data.reward))
