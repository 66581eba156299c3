"""Tokenizer-neutral rollout and score rows in Parquet."""

from __future__ import annotations

import gc
import json
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hacrl_core.store import (
    ROLLOUT_SCHEMA,
    SCORE_SCHEMA,
    rollouts_from_parquet,
    rollouts_table_from_parquet,
    rollouts_table_to_parquet,
    rollouts_to_parquet,
    scores_from_parquet,
    scores_table_from_parquet,
    scores_table_to_parquet,
    scores_to_parquet,
)
from hacrl_core.store.trajectories import FINISH_REASONS


def rollout(**overrides: Any) -> dict[str, Any]:
    row = {
        "experiment": "exp",
        "step": 3,
        "source_agent": "alpha",
        "policy_version": 2,
        "tokenizer_id": "tiny://gpt2-like",
        "prompt_uid": "gsm8k-000017",
        "sample_index": 0,
        "prompt": "Question: 2+2? ∑ 日本語 🚀\nAnswer:",
        "response": " 4 — ünïcødé ✓",
        "token_ids": [17, 2, 40000],
        "reward": 1.0,
        "finish_reason": "stop",
        "extra": '{"answer": "4", "correct": true}',
    }
    row.update(overrides)
    return row


def score(**overrides: Any) -> dict[str, Any]:
    row = {
        "experiment": "exp",
        "step": 3,
        "source_agent": "alpha",
        "prompt_uid": "gsm8k-000017",
        "sample_index": 0,
        "logp_sum": -12.5,
        "token_count": 3,
    }
    row.update(overrides)
    return row


def test_rollouts_round_trip_unicode_and_empty_tokens() -> None:
    rows = [
        rollout(),
        rollout(
            sample_index=1,
            response="",
            token_ids=[],
            reward=0.0,
            finish_reason="length",
            extra="{}",
        ),
    ]
    assert rollouts_from_parquet(rollouts_to_parquet(rows)) == rows


def test_rollouts_use_the_explicit_schema() -> None:
    table = pq.read_table(pa.BufferReader(rollouts_to_parquet([rollout()])))
    assert table.schema.remove_metadata() == ROLLOUT_SCHEMA
    assert table.schema.field("token_ids").type == pa.list_(pa.field("item", pa.int32(), nullable=False))


def test_extra_may_be_a_dict_or_absent() -> None:
    [row] = rollouts_from_parquet(rollouts_to_parquet([rollout(extra={"correct": False, "answer": "5"})]))
    assert row["extra"] == '{"answer": "5", "correct": false}'
    without = rollout()
    del without["extra"]
    [row] = rollouts_from_parquet(rollouts_to_parquet([without]))
    assert row["extra"] == "{}"


def test_empty_shard_round_trips() -> None:
    assert rollouts_from_parquet(rollouts_to_parquet([])) == []
    assert scores_from_parquet(scores_to_parquet([])) == []


@pytest.mark.parametrize("field", [n for n in ROLLOUT_SCHEMA.names if n != "extra"])
def test_rollout_missing_field_is_named(field: str) -> None:
    row = rollout()
    del row[field]
    with pytest.raises(ValueError, match=f"missing field '{field}'"):
        rollouts_to_parquet([rollout(), row])


@pytest.mark.parametrize("field", SCORE_SCHEMA.names)
def test_score_missing_field_is_named(field: str) -> None:
    row = score()
    del row[field]
    with pytest.raises(ValueError, match=f"missing field '{field}'"):
        scores_to_parquet([row])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"finish_reason": "eos"}, "finish_reason"),
        ({"token_ids": [1, None]}, "token_ids"),
        ({"token_ids": [2**40]}, "token_ids"),
        ({"step": "three"}, "step"),
        ({"reward": None}, "reward"),
        ({"reward": True}, "reward"),
        ({"extra": "not json"}, "extra"),
        ({"extra": "[1, 2]"}, "extra"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_rollout_values_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rollouts_to_parquet([rollout(**overrides)])


def test_scores_round_trip() -> None:
    rows = [score(), score(sample_index=1, logp_sum=0.0, token_count=0)]
    assert scores_from_parquet(scores_to_parquet(rows)) == rows


def test_reading_the_wrong_kind_fails() -> None:
    with pytest.raises(ValueError, match="expected a rollouts file, got a scores file"):
        rollouts_from_parquet(scores_to_parquet([score()]))


# -- the columnar path -----------------------------------------------------------------------


def random_rollouts(seed: int, count: int = 40) -> list[dict[str, Any]]:
    """Rows with random lengths, unicode, empty responses, both finish reasons, shared extras."""
    rng = random.Random(seed)
    alphabet = 'ab 7+=\n日本🚀é"\\'
    rows = []
    for i in range(count):
        length = rng.choice([0, 1, rng.randrange(2, 300)])
        rows.append(
            rollout(
                policy_version=rng.randrange(2**40),
                prompt_uid=f"p-{i // 4}",
                sample_index=i % 4,
                prompt="".join(rng.choice(alphabet) for _ in range(rng.randrange(40))),
                response="".join(rng.choice(alphabet) for _ in range(length)),
                token_ids=[rng.randrange(-(2**31), 2**31) for _ in range(length)],
                reward=rng.choice([0.0, 1.0, rng.random(), -rng.random() * 1e300]),
                finish_reason=rng.choice(FINISH_REASONS),
                extra=json.dumps({"answer": str(i // 4), "k": [i // 4, None]}),
            )
        )
    return rows


def previous_decode(data: bytes, schema: pa.Schema) -> list[dict[str, Any]]:
    """How shards were read before the columnar path: select, cast always, then row by row."""
    return pq.read_table(pa.BufferReader(data)).select(schema.names).cast(schema).to_pylist()


@pytest.mark.parametrize("seed", range(5))
def test_reading_returns_the_rows_the_previous_decoder_returned(seed: int) -> None:
    rows = random_rollouts(seed)
    data = rollouts_to_parquet(rows)
    assert rollouts_from_parquet(data) == previous_decode(data, ROLLOUT_SCHEMA) == rows
    scores = [score(sample_index=i, logp_sum=-0.25 * i, token_count=i) for i in range(seed * 7)]
    data = scores_to_parquet(scores)
    assert scores_from_parquet(data) == previous_decode(data, SCORE_SCHEMA) == scores


@pytest.mark.parametrize("seed", range(3))
def test_columns_and_rows_are_the_same_shard(seed: int) -> None:
    rows = random_rollouts(seed)
    data = rollouts_to_parquet(rows)
    table = rollouts_table_from_parquet(data)
    assert table.schema == ROLLOUT_SCHEMA
    assert table.to_pylist() == rollouts_from_parquet(data)
    assert rollouts_table_from_parquet(rollouts_table_to_parquet(table)).equals(table)
    scores = [score(sample_index=i, token_count=i) for i in range(5)]
    table = scores_table_from_parquet(scores_to_parquet(scores))
    assert table.to_pylist() == scores
    assert scores_from_parquet(scores_table_to_parquet(table)) == scores


def foreign_shard(**columns: list[Any]) -> bytes:
    """A rollouts file written by something other than this codec: plain types, nullable fields,
    ``columns`` replacing those of as many copies of ``rollout()``."""
    count = max(map(len, columns.values()), default=1)
    values = {name: [value] * count for name, value in rollout().items()}
    values.update(columns)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(values), sink)
    return sink.getvalue().to_pybytes()


def test_a_shard_of_another_schema_is_cast_on_read() -> None:
    data = foreign_shard()  # int64 sample_index, nullable fields, no kind metadata
    assert pq.read_schema(pa.BufferReader(data)).remove_metadata() != ROLLOUT_SCHEMA
    assert rollouts_table_from_parquet(data).schema == ROLLOUT_SCHEMA
    assert rollouts_from_parquet(data) == [rollout()]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("not json", "is not valid JSON"),
        ("[1, 2]", "is JSON list, not an object"),
        ("", "is not valid JSON"),
    ],
)
def test_a_shard_whose_extra_is_not_a_json_object_is_refused_naming_the_column(extra: str, problem: str) -> None:
    data = foreign_shard(extra=['{"answer": "4"}', extra], sample_index=[0, 1])
    for read in (rollouts_from_parquet, rollouts_table_from_parquet):
        with pytest.raises(ValueError, match=f"rollouts file: row 1: field 'extra' {problem}"):
            read(data)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"finish_reason": ["eos"]}, r"row 0: field 'finish_reason' must be one of .* got 'eos'"),
        ({"reward": [None]}, "row 0: field 'reward' must not be None"),
        ({"token_ids": [[1, None]]}, "field 'token_ids' must not contain None"),
        ({"step": ["three"]}, "does not fit the rollouts schema"),
    ],
)
def test_a_shard_with_bad_values_is_refused_naming_the_field(columns: dict[str, list[Any]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rollouts_table_from_parquet(foreign_shard(**columns))


def test_a_table_is_checked_like_rows() -> None:
    table = rollouts_table_from_parquet(rollouts_to_parquet([rollout()]))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['surprise'\]"):
        rollouts_table_to_parquet(table.append_column("surprise", pa.array([1])))
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['reward'\]"):
        rollouts_table_to_parquet(table.drop_columns(["reward"]))
    with pytest.raises(ValueError, match="field 'extra' is not valid JSON"):
        rollouts_table_to_parquet(table.set_column(12, "extra", pa.array(["{"])))
    with pytest.raises(TypeError, match="expected a pyarrow Table"):
        rollouts_table_to_parquet([rollout()])


def test_reading_restores_the_garbage_collector_as_it_found_it() -> None:
    data = rollouts_to_parquet(random_rollouts(0))
    assert gc.isenabled()
    rollouts_from_parquet(data)
    assert gc.isenabled()
    gc.disable()
    try:
        rollouts_from_parquet(data)
        assert not gc.isenabled()
    finally:
        gc.enable()
