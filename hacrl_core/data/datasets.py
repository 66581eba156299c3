"""Prompt sources (jsonl, parquet, built-in) and deterministic, resumable batching.

``open_source(uri, prompt_key=..., answer_key=..., reward=...)`` returns a ``PromptSource``:

- ``builtin://arithmetic?difficulty=1-3&seed=0[&split=train|eval][&size=N][&format=answer|chain]``:
  the built-in task (``hacrl_core.data.arithmetic``; ``chain`` for worked solutions);
- a path or ``file://`` URI ending in ``.jsonl`` (one JSON object per line) or ``.parquet``;
- ``hf://<org>/<name>?split=S`` (a hub dataset via ``datasets.load_dataset``; ``hacrl_core.data.hub``).

Rows of files and hub datasets become problems in ``hacrl_core.data.rows.RowSource`` (dotted
keys, chat-message prompts, numeric answers).

A bad row is skipped and counted in ``source.skipped`` under one of: ``non_utf8``,
``invalid_json``, ``not_object``, ``missing_prompt``, ``missing_answer``, ``bad_prompt`` (not
text), ``bad_answer`` (not text or a finite number), ``empty_prompt``, ``empty_answer``, ``too_long``
(a prompt over ``rows.MAX_PROMPT_CHARS`` or an answer over ``rows.MAX_ANSWER_CHARS`` characters: no model
context holds it, and tokenizing it would stall every worker), ``invalid_gold``
(the reward's ``validate_gold`` rejected it). A source with no usable row raises ``ValueError``
with these counts.

``iter_batches(source, batch_size, start_cursor)`` walks an endless stream of epochs, each a
seeded permutation of the source; the integer cursor is the position in that stream, so a run
that stored ``batch.next_cursor`` resumes exactly where it stopped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.data.base import Problem, PromptSource
from hacrl_core.data.rows import BadRow, RowSource, decode_bytes
from hacrl_core.file_kind import not_a_regular_file
from hacrl_core.uri import uri_query

#: The longest JSONL line read as a row: room for a prompt and answer at their limits
#: (rows.MAX_PROMPT_CHARS, MAX_ANSWER_CHARS; up to 4 UTF-8 bytes or a 6-byte JSON escape per
#: character) and other keys. A longer line is skipped as ``too_long`` without being held in
#: memory: a 1 GB line cost 3.2 GB per reader when read whole.
MAX_LINE_BYTES = 4 << 20


def _lines(handle, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """``(line number, bytes)`` of each line, ``None`` for one longer than ``limit`` (read
    through in ``limit``-sized pieces and dropped)."""
    position = 0
    while True:
        raw = handle.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = handle.readline(limit)
            yield position, None
        else:
            yield position, raw
        position += 1


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as handle:
        for position, raw in _lines(handle):
            if raw is None:
                yield position, BadRow("too_long")
                continue
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield position, BadRow("non_utf8")
                continue
            try:
                yield position, json.loads(text)
            # ValueError besides JSONDecodeError: an integer of more digits than Python converts
            # (sys.get_int_max_str_digits, 4300); RecursionError: nested thousands deep.
            except (ValueError, RecursionError):
                yield position, BadRow("invalid_json")


def _parquet_rows(path: Path, columns: list[str]) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = set(parquet.schema_arrow.names)
    wanted = sorted({c if c in names else c.split(".", 1)[0] for c in columns} & names)
    position = 0
    for batch in parquet.iter_batches(columns=wanted or None):
        for row in batch.to_pylist():
            yield position, {key: decode_bytes(value) for key, value in row.items()}
            position += 1


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
    problem = not_a_regular_file(path)
    if problem:
        raise ValueError(f"data source {uri!r}: {problem}")
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
        task = ArithmeticTask(
            difficulty=difficulty,
            seed=seed,
            split=query.get("split", "train"),
            size=size,
            format=query.get("format", "answer"),
        )
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
        problems = [
            source[stream_index(length, p, seed=seed, shuffle=shuffle)] for p in range(cursor, cursor + batch_size)
        ]
        yield Batch(cursor=cursor, next_cursor=cursor + batch_size, epoch=cursor // length, problems=problems)
        cursor += batch_size
