"""The ``exact`` and ``numeric`` rewards: pure Python, in-process, linear time.

``exact``: 1.0 when ``normalize_answer(extract_answer(response))`` equals the normalised gold
(a gold containing ``\\boxed{}`` is extracted the same way), else 0.0.

``numeric``: 1.0 when the number parsed from the extracted answer equals the gold number within
``math.isclose(rel_tol=1e-6, abs_tol=1e-9)`` (exactly, for integers and fractions that compare
equal), else 0.0. Gold answers must be a single number (``validate_gold``).

Both reject responses over ``MAX_CHARS`` characters with 0 (counted as ``too_long``).
"""

from __future__ import annotations

import math
from fractions import Fraction

from hacrl_core.rewards.extract import (
    extract_answer,
    last_boxed,
    normalize_answer,
    parse_number,
)
from hacrl_core.rewards.registry import MAX_CHARS, RewardFn, count, register_reward

NUMERIC_REL_TOL = 1e-6
NUMERIC_ABS_TOL = 1e-9


def _normalized_gold(gold: str) -> str:
    boxed = last_boxed(gold)
    return normalize_answer(boxed if boxed is not None else gold)


def _validate_exact(gold: str) -> None:
    if not _normalized_gold(gold):
        raise ValueError(f"exact reward: gold answer {gold!r} is empty after normalisation")


def exact_reward(response: str, gold: str) -> float:
    """1.0 if the response's final answer equals the gold after normalisation, else 0.0."""
    if len(response) > MAX_CHARS:
        count("exact", "too_long")
        return 0.0
    expected = _normalized_gold(gold)
    return float(bool(expected) and normalize_answer(extract_answer(response)) == expected)


def _gold_number(gold: str) -> Fraction | None:
    boxed = last_boxed(gold)
    return parse_number(boxed if boxed is not None else gold, strict=True)


def _validate_numeric(gold: str) -> None:
    if _gold_number(gold) is None:
        raise ValueError(
            f"numeric reward: gold answer {gold!r} is not a single number "
            "(integer, decimal, a/b or \\frac{a}{b}); use the 'math' reward for expressions"
        )


def numeric_reward(response: str, gold: str) -> float:
    """1.0 if the response's final answer is numerically equal to the gold, else 0.0."""
    if len(response) > MAX_CHARS:
        count("numeric", "too_long")
        return 0.0
    expected = _gold_number(gold)
    got = parse_number(extract_answer(response))
    if expected is None or got is None:
        return 0.0
    if got == expected:
        return 1.0
    try:
        return float(math.isclose(float(got), float(expected), rel_tol=NUMERIC_REL_TOL, abs_tol=NUMERIC_ABS_TOL))
    except OverflowError:  # beyond float range and not exactly equal
        return 0.0


@register_reward("exact", validate_gold=_validate_exact)
def _exact_factory() -> RewardFn:
    return exact_reward


@register_reward("numeric", validate_gold=_validate_numeric)
def _numeric_factory() -> RewardFn:
    return numeric_reward
