"""Reward functions registered by name, with gold-answer validators and shared counters.

A reward is ``reward(response: str, gold: str) -> float`` in [0, 1]. It scores the response
text only (never the prompt; docs/architecture.md, "One step", step 1) and never raises on model output: a
response it cannot judge scores 0 and the reason is counted in ``reward_stats()``.

Registration goes through ``hacrl_core.registry.Registry`` like every named thing in the spec: a
decorator registers by name, looking up an unknown name lists the valid ones, and registering a
different function under a taken name raises.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from hacrl_core.registry import Registry

RewardFn = Callable[[str, str], float]
GoldValidator = Callable[[str], None]

#: Responses (and golds) longer than this are rejected before any parsing (reason ``too_long``).
MAX_CHARS = 100_000


@dataclass(frozen=True)
class RewardEntry:
    name: str
    factory: Callable[[], RewardFn]
    validate_gold: GoldValidator


REWARDS: Registry[RewardEntry] = Registry("reward")
_INSTANCES: dict[str, RewardFn] = {}
_LOCK = threading.Lock()
_STATS: Counter[str] = Counter()


def register_reward(
    name: str, *, validate_gold: GoldValidator
) -> Callable[[Callable[[], RewardFn]], Callable[[], RewardFn]]:
    """Register a reward FACTORY under ``name`` (instances are built lazily, once per process).

    A factory rather than the function itself lets a reward own resources (the ``math``
    reward's verifier process) that must not start at import time. ``validate_gold(gold)``
    raises ``ValueError`` for a gold answer the reward could never match.
    """

    def decorator(factory: Callable[[], RewardFn]) -> Callable[[], RewardFn]:
        REWARDS.register(name, RewardEntry(name, factory, validate_gold))
        return factory

    return decorator


def reward_names() -> list[str]:
    """Registered reward names, sorted."""
    return REWARDS.names()


def get_reward(name: str) -> RewardFn:
    """The process-wide instance of reward ``name``; ``ValueError`` listing valid names if unknown."""
    entry = REWARDS.get(name)
    with _LOCK:
        instance = _INSTANCES.get(name)
        if instance is None:
            instance = _INSTANCES[name] = entry.factory()
        return instance


def validate_gold(name: str, gold: str) -> None:
    """Raise ``ValueError`` (naming the reward and the gold) if ``gold`` cannot be parsed."""
    entry = REWARDS.get(name)
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"{name} reward: gold answer is empty")
    if len(gold) > MAX_CHARS:
        raise ValueError(f"{name} reward: gold answer has {len(gold)} characters (limit {MAX_CHARS})")
    entry.validate_gold(gold)


def count(name: str, reason: str, amount: int = 1) -> None:
    """Add to the counter ``<name>/<reason>`` (for example ``math/timeout``)."""
    with _LOCK:
        _STATS[f"{name}/{reason}"] += amount


def reward_stats(*, reset: bool = False) -> dict[str, int]:
    """Counters of rejected or failed scorings since start (or the last reset), by ``reward/reason``.

    Reasons: ``too_long`` (over ``MAX_CHARS``), ``too_deep`` (bracket nesting over the limit),
    ``timeout`` (the verifier process was killed), ``error`` (the verifier raised),
    ``worker_restart`` (a verifier process was started after the first).
    """
    with _LOCK:
        snapshot = dict(_STATS)
        if reset:
            _STATS.clear()
    return snapshot
