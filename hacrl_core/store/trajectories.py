"""Tokenizer-neutral trajectory rows in Parquet (DESIGN.md section 3).

A rollout row is keyed by (experiment, step, source_agent, policy_version, tokenizer_id,
prompt_uid, sample_index) and carries the rendered prompt, the response text, the source's
response token ids, the reward, the finish reason ("stop" or "length") and ``extra``: a JSON
object as text (e.g. ``{"answer": "42", "correct": true}``; "{}" when absent).

A score row carries a learner's old log-probabilities of its own rollout rows: the sum over the
response tokens (``logp_sum``) and how many tokens were scored (``token_count``).

Rows are plain dicts. Writing checks every row against the schema: a missing, unknown or null
field, a wrong type or a bad finish reason raises ValueError naming the field (and row).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FINISH_REASONS = ("stop", "length")

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("experiment", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("source_agent", pa.string(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("tokenizer_id", pa.string(), nullable=False),
        pa.field("prompt_uid", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("response", pa.string(), nullable=False),
        pa.field(
            "token_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False
        ),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("extra", pa.string(), nullable=False),
    ]
)

SCORE_SCHEMA = pa.schema(
    [
        pa.field("experiment", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("source_agent", pa.string(), nullable=False),
        pa.field("prompt_uid", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("logp_sum", pa.float64(), nullable=False),
        pa.field("token_count", pa.int32(), nullable=False),
    ]
)

_KIND_KEY = b"hacrl.kind"
_VERSION_KEY = b"hacrl.schema_version"
_SCHEMA_VERSION = b"1"


def _normalise_extra(value: Any, index: int) -> str:
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            return value
    raise ValueError(
        f"row {index}: field 'extra' must be a JSON object (dict or text), got {value!r}"
    )


def _to_parquet(rows: list[dict[str, Any]], schema: pa.Schema, kind: str) -> bytes:
    names = schema.names
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"row {index}: expected a dict, got {type(row).__name__}")
        if kind == "rollouts":
            row = {**row, "extra": _normalise_extra(row.get("extra", "{}"), index)}
            if "finish_reason" in row and row["finish_reason"] not in FINISH_REASONS:
                raise ValueError(
                    f"row {index}: field 'finish_reason' must be one of {FINISH_REASONS}, "
                    f"got {row['finish_reason']!r}"
                )
        unknown = sorted(set(row) - set(names))
        if unknown:
            raise ValueError(f"row {index}: unknown field(s) {unknown}; {kind} fields are {names}")
        for name in names:
            if name not in row:
                raise ValueError(f"row {index}: missing field {name!r} in {kind} row")
            if row[name] is None:
                raise ValueError(f"row {index}: field {name!r} must not be None")
            columns[name].append(row[name])
    arrays = []
    for field in schema:
        values = columns[field.name]
        if pa.types.is_floating(field.type) and any(isinstance(v, bool) for v in values):
            raise ValueError(f"field {field.name!r} must be a number, got a bool")
        try:
            array = pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise ValueError(f"field {field.name!r} of {kind}: {exc}") from None
        if pa.types.is_list(field.type) and array.flatten().null_count:
            raise ValueError(f"field {field.name!r} of {kind} must not contain None")
        arrays.append(array)
    table = pa.Table.from_arrays(arrays, schema=schema).replace_schema_metadata(
        {_KIND_KEY: kind.encode(), _VERSION_KEY: _SCHEMA_VERSION}
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def _from_parquet(data: bytes, schema: pa.Schema, kind: str) -> list[dict[str, Any]]:
    table = pq.read_table(pa.BufferReader(data))
    stored_kind = (table.schema.metadata or {}).get(_KIND_KEY)
    if stored_kind is not None and stored_kind != kind.encode():
        raise ValueError(f"expected a {kind} file, got a {stored_kind.decode()} file")
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise ValueError(f"{kind} file lacks field(s) {missing}")
    table = table.select(schema.names).cast(schema)
    return table.to_pylist()


def rollouts_to_parquet(rows: list[dict[str, Any]]) -> bytes:
    return _to_parquet(rows, ROLLOUT_SCHEMA, "rollouts")


def rollouts_from_parquet(data: bytes) -> list[dict[str, Any]]:
    return _from_parquet(data, ROLLOUT_SCHEMA, "rollouts")


def scores_to_parquet(rows: list[dict[str, Any]]) -> bytes:
    return _to_parquet(rows, SCORE_SCHEMA, "scores")


def scores_from_parquet(data: bytes) -> list[dict[str, Any]]:
    return _from_parquet(data, SCORE_SCHEMA, "scores")
