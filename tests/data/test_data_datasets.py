"""Dataset readers (bad rows skipped and counted) and deterministic, resumable batching."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hacrl_core.data import ArithmeticTask, iter_batches, open_source
from hacrl_core.data.base import Problem, PromptSource


def _write_jsonl(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_jsonl_bad_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            json.dumps({"question": "1+1?", "meta": {"gt": "2"}}).encode(),
            json.dumps({"question": "2+2?", "meta": {"gt": 4}}).encode(),  # number answer -> "4"
            json.dumps({"question": "no answer", "meta": {}}).encode(),
            json.dumps({"meta": {"gt": "3"}}).encode(),
            json.dumps({"question": "empty", "meta": {"gt": "  "}}).encode(),
            json.dumps({"question": "", "meta": {"gt": "3"}}).encode(),
            json.dumps(["not", "an", "object"]).encode(),
            b'{"question": "caf\xe9", "meta": {"gt": "1"}}',  # latin-1 byte: not UTF-8
            b'{"question": "broken json", ',
            json.dumps({"question": "lone surrogate \udc80", "meta": {"gt": "1"}}).encode(),
            json.dumps({"question": "list answer", "meta": {"gt": [1, 2]}}).encode(),
            b"",
            json.dumps({"question": "3*3?", "meta": {"gt": "9"}}).encode(),
        ],
    )
    source = open_source(str(path), prompt_key="question", answer_key="meta.gt")
    assert [(p.question, p.answer) for p in source] == [("1+1?", "2"), ("2+2?", "4"), ("3*3?", "9")]
    assert source.skipped == {
        "missing_answer": 1,
        "missing_prompt": 1,
        "empty_answer": 1,
        "empty_prompt": 1,
        "not_object": 1,
        "non_utf8": 2,
        "invalid_json": 1,
        "bad_answer": 1,
    }


def test_uids_are_stable_and_unique_across_reads(tmp_path: Path) -> None:
    rows = [json.dumps({"prompt": "same", "answer": "1"}).encode()] * 3
    path = _write_jsonl(tmp_path / "dup.jsonl", rows)
    first = [p.uid for p in open_source(str(path))]
    second = [p.uid for p in open_source(f"file://{path}")]
    assert first == second
    assert len(set(first)) == 3


def test_uid_key_is_used_when_given(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "ids.jsonl", [json.dumps({"id": 17, "prompt": "q", "answer": "a"}).encode()])
    assert open_source(str(path), uid_key="id")[0].uid == "17"


def test_reward_validation_skips_invalid_gold(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "gold.jsonl",
        [
            json.dumps({"prompt": "q1", "answer": "\\frac{1}{2}"}).encode(),
            json.dumps({"prompt": "q2", "answer": "x+1"}).encode(),
        ],
    )
    source = open_source(str(path), reward="numeric")
    assert [p.answer for p in source] == ["\\frac{1}{2}"]
    assert source.skipped == {"invalid_gold": 1}


def test_parquet_verl_layout_with_dotted_key(tmp_path: Path) -> None:
    table = pa.table(
        {
            "prompt": [
                [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 6*7?"}],
                [{"role": "user", "content": "What is 1+1?"}],
                [{"role": "user", "content": "What is 2+3?"}],
                [{"role": "user", "content": "What is 0+0?"}],
            ],
            "reward_model": [
                {"ground_truth": "42"},
                {"ground_truth": None},
                {"ground_truth": ""},
                {"ground_truth": "0"},
            ],
            "extra": [1, 2, 3, 4],
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    source = open_source(str(path), prompt_key="prompt", answer_key="reward_model.ground_truth")
    assert [(p.question, p.answer) for p in source] == [("What is 6*7?", "42"), ("What is 0+0?", "0")]
    assert source.skipped == {"missing_answer": 1, "empty_answer": 1}


def test_parquet_binary_column_with_invalid_utf8_is_counted(tmp_path: Path) -> None:
    table = pa.table({"prompt": pa.array([b"ok", b"\xff\xfe"], type=pa.binary()), "answer": ["1", "2"]})
    path = tmp_path / "bin.parquet"
    pq.write_table(table, path)
    source = open_source(str(path))
    assert [p.question for p in source] == ["ok"]
    assert source.skipped == {"non_utf8": 1}


def test_source_without_usable_rows_raises_with_counts(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [b"[1]", b"{}"])
    with pytest.raises(ValueError, match="no usable rows.*not_object"):
        open_source(str(path))


def test_unknown_sources_and_parameters_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        open_source(str(tmp_path / "missing.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        open_source(str(tmp_path / "x.csv"))
    with pytest.raises(ValueError, match="unknown parameter.*difficuly.*valid: difficulty, seed, split, size"):
        open_source("builtin://arithmetic?difficuly=2")
    with pytest.raises(ValueError, match="unknown built-in source 'geometry'"):
        open_source("builtin://geometry")


def test_builtin_source() -> None:
    source = open_source("builtin://arithmetic?difficulty=2-4&seed=5&split=eval&size=30", reward="exact")
    assert isinstance(source, ArithmeticTask)
    assert len(source) == 30
    assert source.difficulty == (2, 4) and source.seed == 5 and source.split == "eval"
    assert source[0] == ArithmeticTask(difficulty=(2, 4), seed=5, split="eval").problem(0)


class _Numbers(PromptSource):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.name = "numbers"
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Problem:
        return Problem(uid=f"u{index}", question=str(index), answer=str(index))


def _uids(batches: list) -> list[str]:
    return [p.uid for batch in batches for p in batch.problems]


def test_batches_are_deterministic_and_epochs_are_permutations() -> None:
    source = _Numbers(10)
    batches = list(islice(iter_batches(source, batch_size=4, seed=1), 5))
    assert _uids(batches) == _uids(list(islice(iter_batches(source, batch_size=4, seed=1), 5)))
    uids = _uids(batches)
    assert sorted(uids[:10]) == sorted(f"u{i}" for i in range(10))
    assert sorted(uids[10:20]) == sorted(f"u{i}" for i in range(10))
    assert uids[:10] != uids[10:20], "each epoch gets its own shuffle"
    assert uids[:10] != _uids(list(islice(iter_batches(source, 4, seed=2), 3)))[:10]
    assert [(b.cursor, b.next_cursor, b.epoch) for b in batches[:3]] == [(0, 4, 0), (4, 8, 0), (8, 12, 0)]
    assert batches[3].epoch == 1


def test_resuming_at_a_cursor_continues_the_stream_exactly() -> None:
    source = ArithmeticTask(size=37)
    straight = list(islice(iter_batches(source, batch_size=8, seed=3), 12))
    resumed = list(islice(iter_batches(source, batch_size=8, start_cursor=straight[4].next_cursor, seed=3), 7))
    assert _uids(resumed) == _uids(straight[5:])
    unshuffled = next(iter_batches(source, batch_size=3, start_cursor=36, shuffle=False))
    assert [p.uid for p in unshuffled.problems] == [source[36].uid, source[0].uid, source[1].uid]


def test_batching_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        next(iter_batches(_Numbers(3), 0))
    with pytest.raises(ValueError, match="start_cursor must be >= 0"):
        next(iter_batches(_Numbers(3), 1, start_cursor=-1))
