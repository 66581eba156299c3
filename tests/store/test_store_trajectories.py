"""Tokenizer-neutral rollout and score rows in Parquet."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hacrl_core.store import (
    ROLLOUT_SCHEMA,
    SCORE_SCHEMA,
    rollouts_from_parquet,
    rollouts_to_parquet,
    scores_from_parquet,
    scores_to_parquet,
)


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
    assert table.schema.field("token_ids").type == pa.list_(
        pa.field("item", pa.int32(), nullable=False)
    )


def test_extra_may_be_a_dict_or_absent() -> None:
    [row] = rollouts_from_parquet(
        rollouts_to_parquet([rollout(extra={"correct": False, "answer": "5"})])
    )
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
