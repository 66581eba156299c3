"""Reward tables (exact, numeric, math), registry behaviour, gold validation and hostile inputs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hacrl_core.rewards import (
    MathVerifyReward,
    extract_answer,
    get_reward,
    register_reward,
    reward_names,
    reward_stats,
    validate_gold,
)

# (response, gold, exact, numeric, math)
TABLE = [
    ("The answer is \\boxed{\\frac{1}{2}}.", "0.5", 0.0, 1.0, 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0, 1.0, 1.0),
    ("so we get $\\boxed{1,000}$", "1000", 1.0, 1.0, 1.0),
    ("\\boxed{1000}", "1,000", 1.0, 1.0, 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 0.0, 0.0, 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 0.0, 0.0, 1.0),
    ("\\boxed{0.333}", "\\frac{1}{3}", 0.0, 0.0, 0.0),
    ("\\boxed{3}", "4", 0.0, 0.0, 0.0),
    ("\\boxed{-7}", "7", 0.0, 0.0, 0.0),
    ("12 apples", "12", 1.0, 1.0, 1.0),
    ("\\boxed{2/4}", "\\frac{1}{2}", 0.0, 1.0, 1.0),
    ("The answer is 1/2", "0.5", 0.0, 1.0, 1.0),
    ("first 3 then \\boxed{5}", "5", 1.0, 1.0, 1.0),
    ("\\boxed{5} then 3", "5", 1.0, 1.0, 1.0),
    ("11", "11", 1.0, 1.0, 1.0),
    ("", "11", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize(("response", "gold", "exact", "numeric", "math"), TABLE)
def test_reward_table(response: str, gold: str, exact: float, numeric: float, math: float) -> None:
    assert get_reward("exact")(response, gold) == exact
    assert get_reward("numeric")(response, gold) == numeric
    assert get_reward("math")(response, gold) == math


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("answer: 0.1 + 0.2 gives \\boxed{0.30000000001}", "0.3", 1.0),
        ("\\boxed{0.3001}", "0.3", 0.0),
        ("\\boxed{1.5e3}", "1500", 1.0),
        ("\\boxed{-\\frac{3}{4}}", "-0.75", 1.0),
        ("\\boxed{\\frac34}", "0.75", 1.0),
        ("\u22123", "-3", 1.0),
        ("\\boxed{1/0}", "1", 0.0),
        ("\\boxed{1e999}", "1", 0.0),
    ],
)
def test_numeric_parsing_and_tolerance(response: str, gold: str, expected: float) -> None:
    assert get_reward("numeric")(response, gold) == expected


@pytest.mark.parametrize(
    ("response", "extracted"),
    [
        ("x \\boxed{1} y \\boxed{\\frac{a}{b}} z", "\\frac{a}{b}"),
        ("\\boxed 42 done", "42"),
        ("So the answer is: 7 apples.\nThanks 9", "7 apples."),
        ("no box, numbers 3 and -12,000.5 here", "-12,000.5"),
        ("ratio 2/3 wins", "2/3"),
        ("no numbers at all", "no numbers at all"),
        ("\\boxed{unclosed", "unclosed"),
        ("4*2=8; 3+8=11 #### 11", "11"),  # GSM8K's marker: the number after it, not before
        ("#### 12\nlater 13", "12"),
        ("#### 5 then the answer is 6", "5 then the answer is 6"),
        ("\\boxed{3} #### 4", "3"),
    ],
)
def test_extraction_rule(response: str, extracted: str) -> None:
    assert extract_answer(response) == extracted


def test_registry_names_and_unknown_name() -> None:
    assert reward_names() == ["exact", "math", "numeric"]
    with pytest.raises(ValueError, match="unknown reward 'fuzzy'; valid rewards: exact, math, numeric"):
        get_reward("fuzzy")
    with pytest.raises(ValueError, match="unknown reward"):
        validate_gold("fuzzy", "1")


def test_registering_a_different_function_under_a_taken_name_raises() -> None:
    with pytest.raises(ValueError, match="'exact' is already registered"):

        @register_reward("exact", validate_gold=lambda gold: None)
        def _other() -> object:  # pragma: no cover - never called
            return lambda response, gold: 0.0


@pytest.mark.parametrize(
    ("name", "gold", "valid"),
    [
        ("exact", "42", True),
        ("exact", "  ", False),
        ("exact", "$.$", False),
        ("numeric", "\\frac{1}{2}", True),
        ("numeric", "1,000", True),
        ("numeric", "\\boxed{-3.5}", True),
        ("numeric", "x+1", False),
        ("numeric", "(1,2)", False),
        ("math", "x^2+1", True),
        ("math", "\\sqrt{2}", True),
        ("math", "{", False),
        ("math", "", False),
    ],
)
def test_validate_gold(name: str, gold: str, valid: bool) -> None:
    if valid:
        validate_gold(name, gold)
    else:
        with pytest.raises(ValueError, match=f"{name} reward"):
            validate_gold(name, gold)


def test_model_output_is_never_evaluated(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch() or \\boxed{{__import__('os').getpid()}}"
    for name in reward_names():
        assert get_reward(name)(payload, "1") == 0.0
    assert not marker.exists()


def test_huge_input_scores_zero_fast_and_is_counted() -> None:
    huge = "1" * 10_000_000
    reward_stats(reset=True)
    for name in reward_names():
        started = time.perf_counter()
        assert get_reward(name)(huge, "1") == 0.0
        # Parsing 10 MB would take minutes; the bound catches that hang, not this machine's speed.
        assert time.perf_counter() - started < 10, name
    assert reward_stats() == {"exact/too_long": 1, "numeric/too_long": 1, "math/too_long": 1}


def test_deep_nesting_is_rejected_before_the_parser() -> None:
    reward_stats(reset=True)
    deep = "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}"
    started = time.perf_counter()
    assert get_reward("math")(deep, "1") == 0.0
    assert time.perf_counter() - started < 10  # a hang guard: the counted reason below is the proof
    assert reward_stats() == {"math/too_deep": 1}


def test_a_hanging_verification_times_out_and_the_worker_recovers() -> None:
    """9^(9^9) makes SymPy build a ~370-million-digit integer: Math-Verify would hang for minutes."""
    reward = MathVerifyReward(timeout_s=1.0)
    try:
        assert reward("\\boxed{2}", "2") == 1.0  # worker started and warm
        reward_stats(reset=True)
        started = time.perf_counter()
        assert reward("\\boxed{9^{9^{9}}}", "1") == 0.0
        assert time.perf_counter() - started < 30  # minutes without the 1 s timeout; slack for a loaded machine
        assert reward_stats() == {"math/timeout": 1}
        assert reward("\\boxed{\\frac{6}{4}}", "1.5") == 1.0  # a fresh worker answers
        assert reward_stats() == {"math/timeout": 1, "math/worker_restart": 1}
    finally:
        reward.close()


def test_math_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        MathVerifyReward(timeout_s=0)
