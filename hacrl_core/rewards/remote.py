"""Rewards scored by an HTTP(S) reward server (``data.reward: https://...``), batch by batch.

The protocol (docs/rewards.md): ``POST <url>`` with a JSON body
``{"items": [{"prompt": str, "response": str, "gold": str, "extra": object}, ...]}`` answered by
``200 {"scores": [float, ...]}``, one finite score in [0, 1] per item, in order. The request
carries ``Authorization: Bearer <token>`` when ``REWARD_SERVER_TOKEN`` is set (on a cluster: an
``env`` entry of the spec from an approved Secret). ``hacrl reward-server`` serves the built-in
rewards this way.

A request that gets no whole answer within ``timeoutSeconds`` (a deadline for the whole
exchange, ``deadline.py``), cannot connect, is cut off, or gets a 5xx or 429 is retried with
exponential backoff; each retry is logged and counted by reason (``take_retries``), and the counts reach
the step's metrics. Once the retries run out the batch fails with ``RewardServerError``:
the worker stops resumably rather than train on rewards it does not have. An answer that is not
a score in [0, 1] for every item (or over ``MAX_ANSWER_BYTES``) is refused at once, naming the
item. Every failure of a batch is a ``RewardServerError`` naming the server.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hacrl_core.rewards.deadline import Expired, post
from hacrl_core.rewards.scoring import RewardItem

TOKEN_ENV = "REWARD_SERVER_TOKEN"
RETRYABLE_STATUS = {429, 500, 502, 503, 504}
#: The most an answer may hold: scores of a batch take some 20 bytes each, so this is far above
#: any real answer and bounds what a runaway server makes the worker hold.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
log = logging.getLogger("hacrl")
_RETRIES: Counter[str] = Counter()
_LOCK = threading.Lock()


def take_retries() -> dict[str, int]:
    """``rollout/reward_retries/<reason>``: requests retried since the last call, by reason
    (timeout, connection, http_<status>); the rollout's step metrics carry them."""
    with _LOCK:
        taken = {f"rollout/reward_retries/{reason}": n for reason, n in sorted(_RETRIES.items())}
        _RETRIES.clear()
    return taken


class RewardServerError(RuntimeError):
    """The reward server could not score a batch (after its retries), or answered nonsense."""


@dataclass(frozen=True)
class RemoteReward:
    """The client of one reward server (``data.reward``'s URL and ``data.rewardServer``'s knobs)."""

    url: str
    timeout_seconds: float = 30.0
    retries: int = 5
    concurrency: int = 4
    batch_size: int = 256
    backoff_seconds: float = 0.5

    def score(self, items: Sequence[RewardItem]) -> list[float]:
        """Scores of ``items`` in order: batches of ``batch_size``, at most ``concurrency`` at once."""
        batches = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        if len(batches) <= 1:
            return [s for batch in batches for s in self._score_batch(batch)]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return [s for scores in pool.map(self._score_batch, batches) for s in scores]

    def _score_batch(self, batch: Sequence[RewardItem]) -> list[float]:
        body = json.dumps(
            {"items": [{"prompt": i.prompt, "response": i.response, "gold": i.gold, "extra": i.extra} for i in batch]}
        ).encode()
        headers = {"Content-Type": "application/json"}
        token = os.environ.get(TOKEN_ENV)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                with _LOCK:
                    _RETRIES[last] += 1
                log.warning("reward server %s: %s; retry %d/%d", self.url, last, attempt, self.retries)
                time.sleep(self.backoff_seconds * 2 ** (attempt - 1) * (0.5 + random.random() / 2))
            try:
                status, answer = post(self.url, body, headers, self.timeout_seconds, MAX_ANSWER_BYTES)
            except Expired:
                last = "timeout"
                continue
            except (OSError, http.client.HTTPException) as error:  # refused, reset, dropped part-way, not HTTP
                reason = getattr(error, "reason", error)
                last = "timeout" if isinstance(reason, TimeoutError) else "connection"
                continue
            if status in RETRYABLE_STATUS:
                last = f"http_{status}"
                continue
            if not 200 <= status < 300:
                detail = answer[:300].decode(errors="replace")
                raise RewardServerError(f"reward server {self.url} refused the batch: HTTP {status} {detail}".rstrip())
            return self._parse(answer, batch)
        raise RewardServerError(
            f"reward server {self.url}: no answer after {self.retries + 1} tries (last: {last}); "
            f"the worker stops and resumes from its last step once restarted "
            f"(data.rewardServer.timeoutSeconds and .retries bound each try and their number)"
        )

    def _parse(self, answer: bytes, batch: Sequence[RewardItem]) -> list[float]:
        if len(answer) > MAX_ANSWER_BYTES:
            raise RewardServerError(
                f"reward server {self.url} answered over {MAX_ANSWER_BYTES} bytes for {len(batch)} items: "
                f'expected {{"scores": [...]}}'
            )
        try:
            scores = json.loads(answer)["scores"]
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested thousands deep
            raise RewardServerError(
                f'reward server {self.url} answered {answer[:200]!r}: expected {{"scores": [...]}}'
            ) from None
        if not isinstance(scores, list) or len(scores) != len(batch):
            got = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise RewardServerError(f"reward server {self.url} answered {got} scores for {len(batch)} items")
        checked = []
        for item, score in zip(batch, scores):
            if (
                isinstance(score, bool)
                or not isinstance(score, (int, float))
                or not math.isfinite(score)
                or not 0.0 <= score <= 1.0
            ):
                raise RewardServerError(
                    f"reward server {self.url} scored {item.label} {score!r}: a score must be a finite number in [0, 1]"
                )
            checked.append(float(score))
        return checked


def is_reward_url(reward: str) -> bool:
    return reward.startswith(("http://", "https://"))
