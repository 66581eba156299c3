"""A step's responses scored in one call: the items and the scorer type.

A ``Scorer`` is ``score(items) -> list[float]``: ``per_item`` wraps a built-in reward (``exact``,
``numeric``, ``math``), ``rewards.remote.RemoteReward.score`` sends the items to a reward server
in batches; ``rewards.scorer_for(data)`` picks the spec's.
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
