"""Retry with exponential backoff and full jitter, used by the S3 backend.

``delay(n) = uniform(0, min(max_delay, base_delay * 2**n))`` before retry ``n`` (0-based), the
"full jitter" scheme of the AWS Architecture Blog post "Exponential Backoff And Jitter".
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure.

    attempts: total tries including the first (default 5; 1 disables retrying).
    base_delay: upper bound in seconds of the first backoff (default 0.2).
    max_delay: cap in seconds of any single backoff (default 5.0).
    """

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(
                f"delays must be >= 0, got base_delay={self.base_delay}, max_delay={self.max_delay}"
            )

    def delay(self, retry_index: int, rng: random.Random) -> float:
        """Seconds to sleep before retry ``retry_index`` (0 for the first retry)."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2**retry_index)))


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it returns, retrying exceptions for which ``is_transient`` is true.

    ``on_retry(retry_index, exc, delay)`` is called before each backoff. After
    ``policy.attempts`` tries, or on a non-transient exception, the exception propagates.
    """
    rng = rng or random.Random()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt + 1 >= policy.attempts or not is_transient(exc):
                raise
            delay = policy.delay(attempt, rng)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
