"""A shard's training rows (`learner.batch.encode_rows`): read as the store's Arrow table or as row
dicts, with batched tokenizer calls, they must be exactly the rows of one `encode_row_for` call
per row (docs/architecture.md, "One step", step 5), and a peer's pi_old and the scores shard must be keyed the
same from tables as from dicts."""

from __future__ import annotations

import json

import pytest

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.data.templates import render_prompt
from hacrl_core.learner.batch import TrainRow, encode_rows
from hacrl_core.learner.stages import OldLogprobs, scores_shard, source_logprobs
from hacrl_core.models.encoding import encode_prompt, encode_prompts, encode_row_for, encode_text, encode_texts
from hacrl_core.models.tokenizers import build_bpe_tokenizer, build_char_tokenizer
from hacrl_core.store.trajectories import rollouts_table, scores_table

TEMPLATE = "arithmetic"
# Responses that tokenize differently one by one than merged: specials as literal text, leading
# spaces, newlines, an empty response, characters the char tokenizer does not know.
RESPONSES = ["11", " 42", "", "3 * 4 = 12\nso 13", "7<|eos|></s> literal", "é unknown", "1234567890" * 3, "-5"]


@pytest.fixture(scope="module")
def tokenizers():
    task = ArithmeticTask(size=200)
    return {"char": build_char_tokenizer(), "bpe": build_bpe_tokenizer([p.question + p.answer for p in task])}


def shard(source_tokenizer, n_prompts: int = 5, group: int = 4) -> list[dict]:
    """Rollout row dicts as a rollout worker of ``source_tokenizer`` writes them: G rows per prompt
    sharing its ``extra``, both finish reasons."""
    rows = []
    for p, problem in enumerate(ArithmeticTask(size=n_prompts, seed=3)):
        prompt = render_prompt(source_tokenizer, problem.question, TEMPLATE)
        for sample in range(group):
            response = RESPONSES[(p * group + sample) % len(RESPONSES)]
            rows.append(
                {
                    "experiment": "enc",
                    "step": 0,
                    "source_agent": "src",
                    "policy_version": 0,
                    "tokenizer_id": "t",
                    "prompt_uid": f"p{p}",
                    "sample_index": sample,
                    "prompt": prompt,
                    "response": response,
                    "token_ids": encode_text(source_tokenizer, response),
                    "reward": float(sample % 2),
                    "finish_reason": "stop" if sample % 3 else "length",
                    "extra": json.dumps({"question": problem.question, "answer": problem.answer}),
                }
            )
    return rows


def one_by_one(rows: list[dict], *, source: int, is_own: bool, tokenizer) -> list[TrainRow]:
    """The reference: one ``encode_row_for`` (one tokenizer call per text) per row."""
    out = []
    for row in rows:
        prompt = row["prompt"] if is_own else render_prompt(tokenizer, json.loads(row["extra"])["question"], TEMPLATE)
        ids, mask = encode_row_for(
            tokenizer, prompt, row["response"], row["token_ids"] if is_own else None, finish_reason=row["finish_reason"]
        )
        out.append(TrainRow(source, row["prompt_uid"], row["reward"], ids, mask, is_own))
    return out


@pytest.mark.parametrize("source, learner", [("char", "char"), ("bpe", "bpe"), ("char", "bpe"), ("bpe", "char")])
def test_batched_rows_from_a_table_equal_one_encode_per_row(tokenizers, source: str, learner: str) -> None:
    rows = shard(tokenizers[source])
    is_own = source == learner
    expected = one_by_one(rows, source=1, is_own=is_own, tokenizer=tokenizers[learner])
    from_dicts = encode_rows(rows, source=1, is_own=is_own, tokenizer=tokenizers[learner], template=TEMPLATE)
    from_table = encode_rows(
        rollouts_table(rows), source=1, is_own=is_own, tokenizer=tokenizers[learner], template=TEMPLATE
    )
    assert from_dicts == expected
    assert from_table == expected


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_batched_encoders_give_the_ids_of_one_call_per_text(tokenizers, name: str) -> None:
    tokenizer = tokenizers[name]
    assert encode_texts(tokenizer, RESPONSES) == [encode_text(tokenizer, t) for t in RESPONSES]
    prompts = [render_prompt(tokenizer, p.question, TEMPLATE) for p in ArithmeticTask(size=6, seed=1)]
    assert encode_prompts(tokenizer, prompts) == [encode_prompt(tokenizer, p) for p in prompts]
    assert encode_texts(tokenizer, []) == [] and encode_prompts(tokenizer, []) == []


def test_scores_and_source_logprobs_are_keyed_alike_from_tables_and_dicts(tokenizers) -> None:
    rows = shard(tokenizers["char"])
    own = encode_rows(rows, source=0, is_own=True, tokenizer=tokenizers["char"], template=TEMPLATE)
    old = OldLogprobs(tuple(-0.25 * (index + 1) for index in range(len(own))), (None,) * len(own))
    from_dicts = scores_shard(rows, own, old, experiment="enc", step=0, agent="src")
    assert scores_shard(rollouts_table(rows), own, old, experiment="enc", step=0, agent="src") == from_dicts
    assert [s["logp_sum"] / s["token_count"] for s in from_dicts if s["token_count"]] == [
        mean for mean, r in zip(old.mean, own) if sum(r.response_mask)
    ]

    shuffled = from_dicts[::-1]  # a scores shard need not be in the rollouts' order
    for rollouts, scores in ((rows, shuffled), (rollouts_table(rows), scores_table(shuffled))):
        assert source_logprobs(rollouts, scores) == [s["logp_sum"] / max(s["token_count"], 1) for s in from_dicts]
