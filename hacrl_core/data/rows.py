"""Rows (dicts) to ``Problem``s, the conversion every file and hub source shares.

``RowSource(name, rows, prompt_key=..., answer_key=..., uid_key=..., reward=...)`` reads
``(position, row)`` pairs. Keys may be dotted to reach nested objects
(``reward_model.ground_truth``); a key that exists literally with its dots wins. A prompt may be
a string or a chat-style list of ``{"role", "content"}`` messages (verl's parquet layout), in
which case the content of the last ``user`` message is the question. Answers that are numbers
are turned into text. A bad row is skipped and counted (reasons in ``hacrl_core.data.datasets``);
a reader that cannot even parse a row passes ``BadRow(reason)`` in its place.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hacrl_core.data.base import Problem, PromptSource

_MISSING = object()
# ~25k tokens of English: past any context a rollout is sampled in. Gold answers are short.
MAX_PROMPT_CHARS = 100_000
MAX_ANSWER_CHARS = 10_000


def lookup(row: dict[str, Any], key: str) -> Any:
    """``row[key]``, following dots into nested dicts when the literal key is absent.

    Returns a private sentinel (``_MISSING``) when the key is absent at any level.
    """
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _prompt_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m.get("content") for m in value if m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def _answer_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # JSON's NaN/Infinity (Python's reader accepts them): no response can match such a gold.
        return str(value) if math.isfinite(value) else None
    return None


class RowSource(PromptSource):
    """Problems read from rows (dicts) with configurable keys; bad rows counted, not raised.

    ``uid_key`` names a column holding stable ids; without it the uid is a SHA-256 of the row's
    position, question and answer, so every process reading the same file agrees.
    ``reward`` names a registered reward whose ``validate_gold`` every answer must pass.
    """

    def __init__(
        self,
        name: str,
        rows: Iterator[tuple[int, Any]],
        *,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        uid_key: str | None = None,
        reward: str | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.prompt_key = prompt_key
        self.answer_key = answer_key
        self._problems: list[Problem] = []
        validate = None
        if reward is not None:
            from hacrl_core.rewards import validate_gold

            def validate(gold: str) -> None:
                validate_gold(reward, gold)

        for position, row in rows:
            problem = self._convert(position, row, uid_key)
            if problem is None:
                continue
            if validate is not None:
                try:
                    validate(problem.answer)
                except ValueError:
                    self._skip("invalid_gold", position)
                    continue
            self._problems.append(problem)
        if not self._problems:
            raise ValueError(f"{name}: no usable rows (skipped: {self.skipped or 'none, the source is empty'})")

    def _convert(self, position: int, row: Any, uid_key: str | None) -> Problem | None:
        if isinstance(row, BadRow):
            self._skip(row.reason, position)
            return None
        if not isinstance(row, dict):
            self._skip("not_object", position)
            return None
        raw_prompt = lookup(row, self.prompt_key)
        if raw_prompt is _MISSING or raw_prompt is None:
            self._skip("missing_prompt", position)
            return None
        raw_answer = lookup(row, self.answer_key)
        if raw_answer is _MISSING or raw_answer is None:
            self._skip("missing_answer", position)
            return None
        prompt = _prompt_text(raw_prompt)
        if prompt is None:
            self._skip("bad_prompt", position)
            return None
        answer = _answer_text(raw_answer)
        if answer is None:
            self._skip("bad_answer", position)
            return None
        if not prompt.strip():
            self._skip("empty_prompt", position)
            return None
        if not answer.strip():
            self._skip("empty_answer", position)
            return None
        if len(prompt) > MAX_PROMPT_CHARS or len(answer) > MAX_ANSWER_CHARS:
            self._skip("too_long", position)
            return None
        if _has_surrogates(prompt) or _has_surrogates(answer):
            self._skip("non_utf8", position)
            return None
        uid = None
        if uid_key is not None:
            raw_uid = lookup(row, uid_key)
            uid = None if raw_uid is _MISSING or raw_uid is None else str(raw_uid)
        if uid is None:
            digest = hashlib.sha256(f"{position}\0{prompt}\0{answer}".encode()).hexdigest()[:16]
            uid = f"row-{position}-{digest}"
        return Problem(uid=uid, question=prompt, answer=answer.strip())

    def __len__(self) -> int:
        return len(self._problems)

    def __getitem__(self, index: int) -> Problem:
        return self._problems[index]


@dataclass(frozen=True)
class BadRow:
    """A row its reader could not parse, and why (a skip reason)."""

    reason: str


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def decode_bytes(value: Any) -> Any:
    """Binary cells decoded as UTF-8; undecodable bytes become surrogates (counted as non_utf8)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, dict):
        return {k: decode_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_bytes(v) for v in value]
    return value
