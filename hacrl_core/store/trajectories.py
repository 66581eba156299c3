"""Tokenizer-neutral trajectory rows in Parquet (docs/architecture.md, "The trajectory store").

A rollout row is keyed by (experiment, step, source_agent, policy_version, tokenizer_id,
prompt_uid, sample_index) and carries the rendered prompt, the response text, the source's
response token ids, the reward, the finish reason ("stop" or "length") and ``extra``: a JSON
object as text (e.g. ``{"answer": "42", "correct": true}``; "{}" when absent).

A score row carries a learner's old log-probabilities of its own rollout rows: the sum over the
response tokens (``logp_sum``) and how many tokens were scored (``token_count``).

Rows are plain dicts, or Arrow tables with these schemas (``*_table_to_parquet``,
``*_table_from_parquet``: the columnar path, which never builds a Python object per value).
Writing checks every row against the schema: a missing, unknown or null field, a wrong type, a bad
finish reason or an ``extra`` that is not a JSON object raises ValueError naming the field (and
row). Reading checks the same of the stored file, so that a shard written by anything else is
refused with the column named instead of failing later in a learner.

Validation works per column, not per row: Arrow converts and type-checks each column in one call,
and the two checks Arrow's types cannot express (finish reasons, ``extra`` as JSON objects) look
at each column's distinct values only (a prompt's G samples usually share their ``extra``).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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
        pa.field("token_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
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


# -- writing -----------------------------------------------------------------------------------

# Fields a row may leave out, with the value they then take.
_DEFAULTS: dict[str, dict[str, Any]] = {"rollouts": {"extra": "{}"}, "scores": {}}


def _row_columns(rows: list[dict[str, Any]], schema: pa.Schema, kind: str) -> dict[str, list[Any]]:
    """The rows' values as one list per field, without copying any row.

    A row whose keys are exactly the schema's (or those less the defaulted ones) costs one set
    comparison; any other row is looked at field by field, to name the row and the field.
    """
    defaults = _DEFAULTS[kind]
    full = set(schema.names)
    short = full - set(defaults)
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"row {index}: expected a dict, got {type(row).__name__}")
        if row.keys() != full and row.keys() != short:
            _raise_field_error(row, index, schema.names, defaults, kind)
    return {
        name: ([row.get(name, defaults[name]) for row in rows] if name in defaults else [row[name] for row in rows])
        for name in schema.names
    }


def _raise_field_error(row: dict[str, Any], index: int, names: list[str], defaults: dict[str, Any], kind: str) -> None:
    unknown = sorted(set(row) - set(names))
    if unknown:
        raise ValueError(f"row {index}: unknown field(s) {unknown}; {kind} fields are {names}")
    missing = [name for name in names if name not in row and name not in defaults]
    raise ValueError(f"row {index}: missing field {missing[0]!r} in {kind} row")


def _extra_texts(values: list[Any]) -> list[Any]:
    """``extra`` as text: dicts (accepted for callers' convenience) become sorted JSON; the rollout
    worker passes text, which is then returned as is and checked later, once per distinct value."""
    if dict not in set(map(type, values)):
        return values
    return [json.dumps(v, sort_keys=True, ensure_ascii=False) if isinstance(v, dict) else v for v in values]


def _array(values: list[Any], field: pa.Field, kind: str) -> pa.Array:
    """One column converted by Arrow in one call; nulls are left for ``_conform`` to name."""
    # Arrow would store True as 1.0: a reward or log-prob given as a bool is a caller's bug.
    if pa.types.is_floating(field.type) and bool in set(map(type, values)):
        raise ValueError(f"field {field.name!r} must be a number, got a bool")
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise ValueError(f"field {field.name!r} of {kind}: {exc}") from None


def _rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema, kind: str) -> pa.Table:
    columns = _row_columns(rows, schema, kind)
    if "extra" in columns:
        columns["extra"] = _extra_texts(columns["extra"])
    arrays = [_array(columns[field.name], field, kind) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


#: Parquet gives up dictionary-encoding a column chunk once its dictionary passes this size. With
#: the default (1 MiB) a real vocabulary's token ids (150k distinct) fill a dictionary before the
#: writer falls back, most of a long shard's encoding (8,192 x 512 tokens: 107-130 ms against
#: 48-52 ms with this limit; docs/benchmarks.md section 4). A tiny model's 384 ids, or a 32k
#: vocabulary's on a shard this size, stay inside it (same time, size within 0.1%).
DICTIONARY_PAGE_LIMIT = 256 * 1024


def _to_parquet(table: pa.Table, kind: str) -> bytes:
    table = table.replace_schema_metadata({_KIND_KEY: kind.encode(), _VERSION_KEY: _SCHEMA_VERSION})
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        write_statistics=_statistics_columns(table.schema),
        dictionary_pagesize_limit=DICTIONARY_PAGE_LIMIT,
    )
    return sink.getvalue().to_pybytes()


def _statistics_columns(schema: pa.Schema) -> list[str]:
    """The columns worth min/max statistics: the numbers. A shard is always read whole, so the
    statistics only serve other tools' filters, and those of the text and token columns cost a
    tenth of the encoding of a shard of long responses (the min and max of every token id)."""
    numeric = (pa.types.is_integer, pa.types.is_floating)
    return [field.name for field in schema if any(is_type(field.type) for is_type in numeric)]


# -- checks shared by writing and reading ----------------------------------------------------


def _conform(table: pa.Table, schema: pa.Schema, kind: str, *, where: str) -> pa.Table:
    """``table``'s columns of ``schema``, in its order and types, checked value by value.

    Cast only when the types differ (a file from another writer): a shard of ours already has
    the exact schema, and casting it would copy every column. ``where`` starts error messages.
    """
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise ValueError(f"{where} lacks field(s) {missing}")
    table = table.select(schema.names)
    # Before any cast: Arrow's cast refuses nulls too, but without naming the row.
    for name in schema.names:
        _check_no_nulls(table.column(name), name, where)
    if not table.schema.equals(schema):
        try:
            table = table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"{where} does not fit the {kind} schema: {exc}") from None
    if kind == "rollouts":
        _check_finish_reasons(table.column("finish_reason"), where)
        _check_extra(table.column("extra"), where)
    return table


def _check_no_nulls(column: pa.ChunkedArray, name: str, where: str) -> None:
    # The schema's fields are not nullable, but Arrow's conversion does not enforce it.
    if column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise ValueError(f"{where}: row {row}: field {name!r} must not be None")
    if pa.types.is_list(column.type) and pc.list_flatten(column).null_count:
        raise ValueError(f"{where}: field {name!r} must not contain None")


def _check_finish_reasons(column: pa.ChunkedArray, where: str) -> None:
    bad = pc.invert(pc.is_in(column, value_set=pa.array(FINISH_REASONS)))
    if pc.any(bad).as_py():
        row = pc.index(bad, True).as_py()
        raise ValueError(
            f"{where}: row {row}: field 'finish_reason' must be one of {FINISH_REASONS}, got {column[row].as_py()!r}"
        )


def _check_extra(column: pa.ChunkedArray, where: str) -> None:
    """Every value a JSON object as text: each distinct value parsed once."""
    for text in pc.unique(column).to_pylist():
        try:
            decoded = json.loads(text)
        except ValueError as exc:
            problem = f"is not valid JSON ({exc})"
        else:
            if isinstance(decoded, dict):
                continue
            problem = f"is JSON {type(decoded).__name__}, not an object"
        row = pc.index(column, text).as_py()
        raise ValueError(f"{where}: row {row}: field 'extra' {problem}: {text[:200]!r}")


# -- reading -----------------------------------------------------------------------------------


def _from_parquet(data: bytes, schema: pa.Schema, kind: str) -> pa.Table:
    table = pq.read_table(pa.BufferReader(data))
    stored_kind = (table.schema.metadata or {}).get(_KIND_KEY)
    if stored_kind is not None and stored_kind != kind.encode():
        raise ValueError(f"expected a {kind} file, got a {stored_kind.decode()} file")
    return _conform(table, schema, kind, where=f"{kind} file")


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """Row dicts, converting column by column (``Table.to_pylist`` goes row by row: slower)."""
    names = table.column_names
    with _gc_paused():
        columns = [table.column(name).to_pylist() for name in names]
        return [dict(zip(names, values)) for values in zip(*columns)]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while a block allocates many objects.

    Collections are triggered by allocation counts: the millions of token lists and ints of a
    large shard set off collections that each walk every container made so far (about a quarter
    of the conversion time of 8,192 rows of 512 tokens), and none of these objects is in a
    cycle. The collector's previous state is restored, so a caller that disabled it keeps it off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- the codec -----------------------------------------------------------------------------------


def rollouts_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rollout row dicts as a checked table with ``ROLLOUT_SCHEMA``."""
    table = _rows_to_table(rows, ROLLOUT_SCHEMA, "rollouts")
    return _conform(table, ROLLOUT_SCHEMA, "rollouts", where="rollouts")


def rollouts_to_parquet(rows: list[dict[str, Any]]) -> bytes:
    return _to_parquet(rollouts_table(rows), "rollouts")


def rollouts_table_to_parquet(table: pa.Table) -> bytes:
    """Parquet bytes of a rollouts table (``ROLLOUT_SCHEMA``'s columns, checked like rows)."""
    return _to_parquet(_checked_table(table, ROLLOUT_SCHEMA, "rollouts"), "rollouts")


def rollouts_from_parquet(data: bytes) -> list[dict[str, Any]]:
    return _rows(rollouts_table_from_parquet(data))


def rollouts_table_from_parquet(data: bytes) -> pa.Table:
    """The rollouts of ``data`` as an Arrow table with ``ROLLOUT_SCHEMA``, checked."""
    return _from_parquet(data, ROLLOUT_SCHEMA, "rollouts")


def scores_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Score row dicts as a checked table with ``SCORE_SCHEMA``."""
    table = _rows_to_table(rows, SCORE_SCHEMA, "scores")
    return _conform(table, SCORE_SCHEMA, "scores", where="scores")


def scores_to_parquet(rows: list[dict[str, Any]]) -> bytes:
    return _to_parquet(scores_table(rows), "scores")


def scores_table_to_parquet(table: pa.Table) -> bytes:
    """Parquet bytes of a scores table (``SCORE_SCHEMA``'s columns, checked like rows)."""
    return _to_parquet(_checked_table(table, SCORE_SCHEMA, "scores"), "scores")


def scores_from_parquet(data: bytes) -> list[dict[str, Any]]:
    return _rows(scores_table_from_parquet(data))


def scores_table_from_parquet(data: bytes) -> pa.Table:
    """The scores of ``data`` as an Arrow table with ``SCORE_SCHEMA``, checked."""
    return _from_parquet(data, SCORE_SCHEMA, "scores")


def _checked_table(table: pa.Table, schema: pa.Schema, kind: str) -> pa.Table:
    if not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow Table of {kind}, got {type(table).__name__}")
    unknown = sorted(set(table.column_names) - set(schema.names))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; {kind} fields are {schema.names}")
    return _conform(table, schema, kind, where=kind)
