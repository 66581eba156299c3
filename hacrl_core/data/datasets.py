"""Prompt sources (jsonl, parquet, built-in) and deterministic, resumable batching.

``open_source(uri, prompt_key=..., answer_key=..., reward=...)`` returns a ``PromptSource``:

- ``builtin://arithmetic?difficulty=1-3&seed=0[&split=train|eval][&size=N][&format=answer|chain]``:
  the built-in task (``hacrl_core.data.arithmetic``; ``chain`` for worked solutions);
- a path or ``file://`` URI ending in ``.jsonl`` (one JSON object per line) or ``.parquet``;
- ``hf://<org>/<name>?split=S`` (a hub dataset via ``datasets.load_dataset``; ``hacrl_core.data.hub``).

Keys may be dotted to reach nested objects (``reward_model.ground_truth``); a key that exists
literally with its dots wins. A prompt may be a string or a chat-style list of
``{"role", "content"}`` messages (verl's parquet layout), in which case the content of the last
``user`` message is the question. Answers that are numbers are turned into text.

A bad row is skipped and counted in ``source.skipped`` under one of: ``non_utf8``,
``invalid_json``, ``not_object``, ``missing_prompt``, ``missing_answer``, ``bad_prompt`` (not
text), ``bad_answer`` (not text or a finite number), ``empty_prompt``, ``empty_answer``, ``too_long``
(a prompt over ``MAX_PROMPT_CHARS`` or an answer over ``MAX_ANSWER_CHARS`` characters: no model
context holds it, and tokenizing it would stall every worker), ``invalid_gold``
(the reward's ``validate_gold`` rejected it). A source with no usable row raises ``ValueError``
with these counts.

``iter_batches(source, batch_size, start_cursor)`` walks an endless stream of epochs, each a
seeded permutation of the source; the integer cursor is the position in that stream, so a run
that stored ``batch.next_cursor`` resumes exactly where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.data.base import Problem, PromptSource
from hacrl_core.uri import uri_query

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
        if isinstance(row, _BadRow):
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
class _BadRow:
    reason: str


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as handle:
        for position, raw in enumerate(handle):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield position, _BadRow("non_utf8")
                continue
            try:
                yield position, json.loads(text)
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested thousands deep
                yield position, _BadRow("invalid_json")


def _parquet_rows(path: Path, columns: list[str]) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = set(parquet.schema_arrow.names)
    wanted = sorted({c if c in names else c.split(".", 1)[0] for c in columns} & names)
    position = 0
    for batch in parquet.iter_batches(columns=wanted or None):
        for row in batch.to_pylist():
            yield position, {key: _decode_bytes(value) for key, value in row.items()}
            position += 1


def _decode_bytes(value: Any) -> Any:
    """Binary cells decoded as UTF-8; undecodable bytes become surrogates (counted as non_utf8)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, dict):
        return {k: _decode_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_bytes(v) for v in value]
    return value


def open_source(
    uri: str,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    uid_key: str | None = None,
    reward: str | None = None,
) -> PromptSource:
    """A ``PromptSource`` for ``uri`` (forms in the module docstring).

    ``reward`` (a registered reward name) validates every gold answer; rows that fail are
    skipped as ``invalid_gold``. The built-in task ignores the key arguments.
    """
    if uri.startswith("builtin://"):
        return _builtin(uri, reward)
    if uri.startswith("hf://"):
        from hacrl_core.data.hub import open_hub_source

        return open_hub_source(uri, prompt_key=prompt_key, answer_key=answer_key, uid_key=uid_key, reward=reward)
    path = Path(uri.removeprefix("file://"))
    if not path.is_file():
        raise ValueError(f"data source {uri!r}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = _jsonl_rows(path)
    elif suffix == ".parquet":
        keys = [prompt_key, answer_key] + ([uid_key] if uid_key else [])
        rows = _parquet_rows(path, keys)
    else:
        raise ValueError(f"data source {uri!r}: unsupported file type {suffix!r}; valid: .jsonl, .parquet, builtin://")
    return RowSource(path.name, rows, prompt_key=prompt_key, answer_key=answer_key, uid_key=uid_key, reward=reward)


_BUILTIN_PARAMS = ("difficulty", "seed", "split", "size", "format")


def _builtin(uri: str, reward: str | None) -> PromptSource:
    parsed = urlparse(uri)
    if parsed.netloc != "arithmetic":
        raise ValueError(f"unknown built-in source {parsed.netloc!r} in {uri!r}; valid: arithmetic")
    query = uri_query(parsed.query, _BUILTIN_PARAMS, repr(uri))
    try:
        difficulty = parse_range(query.get("difficulty", "1-3"))
        seed = int(query.get("seed", "0"))
        size = int(query["size"]) if "size" in query else None
    except ValueError as error:
        raise ValueError(f"{uri!r}: {error}") from None
    try:
        task = ArithmeticTask(difficulty=difficulty, seed=seed, split=query.get("split", "train"), size=size, format=query.get("format", "answer"))
    except ValueError as error:
        raise ValueError(f"{uri!r}: {error}") from None
    if reward is not None:
        from hacrl_core.rewards import validate_gold

        validate_gold(reward, task.problem(0).answer)  # integer golds: one check tells all
    return task


def parse_range(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1-3"`` -> (1, 3)."""
    low, _, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise ValueError(f"difficulty must look like '2' or '1-3', got {text!r}") from None


@dataclass(frozen=True)
class Batch:
    """``problems`` of stream positions ``cursor .. next_cursor - 1``; ``epoch`` of the first."""

    cursor: int
    next_cursor: int
    epoch: int
    problems: list[Problem]


def stream_index(source_len: int, position: int, *, seed: int = 0, shuffle: bool = True) -> int:
    """Index into the source of stream position ``position`` (epoch-wise seeded permutation)."""
    epoch, offset = divmod(position, source_len)
    if not shuffle:
        return offset
    return _permutation(source_len, seed, epoch)[offset]


_PERMUTATIONS: dict[tuple[int, int, int], list[int]] = {}


def _permutation(length: int, seed: int, epoch: int) -> list[int]:
    key = (length, seed, epoch)
    cached = _PERMUTATIONS.get(key)
    if cached is None:
        cached = list(range(length))
        random.Random(f"hacrl-epoch/{seed}/{epoch}/{length}").shuffle(cached)
        if len(_PERMUTATIONS) > 8:
            _PERMUTATIONS.clear()
        _PERMUTATIONS[key] = cached
    return cached


def iter_batches(
    source: PromptSource,
    batch_size: int,
    start_cursor: int = 0,
    *,
    seed: int = 0,
    shuffle: bool = True,
) -> Iterator[Batch]:
    """Endless batches of ``batch_size`` problems starting at stream position ``start_cursor``.

    The stream is epoch after epoch of the source, each epoch a permutation seeded by
    ``(seed, epoch)`` (identity when ``shuffle`` is False). A batch may span two epochs. The same
    arguments always give the same batches, and starting at a batch's ``next_cursor`` continues
    the stream exactly.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if start_cursor < 0:
        raise ValueError(f"start_cursor must be >= 0, got {start_cursor}")
    length = len(source)
    if length == 0:
        raise ValueError(f"{source.name}: cannot batch an empty source")
    cursor = start_cursor
    while True:
        problems = [source[stream_index(length, p, seed=seed, shuffle=shuffle)] for p in range(cursor, cursor + batch_size)]
        yield Batch(cursor=cursor, next_cursor=cursor + batch_size, epoch=cursor // length, problems=problems)
        cursor += batch_size
