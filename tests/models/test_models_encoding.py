"""Cross-encoding of rows between two different tokenizers (docs/architecture.md, "One step", step 5)."""

from __future__ import annotations

import pytest
import torch

from hacrl_core.data.templates import render_prompt
from hacrl_core.models.encoding import collate, encode_prompt, encode_row_for

RESPONSES = [
    "11",
    "The answer is \\boxed{-7}.",
    "3 * 4 = 12\nso 12 + 1 = 13",
    " leading space",
    "42<|eos|> literal </s> markers",
]


@pytest.mark.parametrize("response", RESPONSES)
def test_cross_rows_round_trip_text_between_the_two_tokenizers(char_tokenizer, bpe_tokenizer, response: str) -> None:
    for source, learner in ((char_tokenizer, bpe_tokenizer), (bpe_tokenizer, char_tokenizer)):
        # The source sampled ids; the row carries the decoded text.
        source_ids = source(response, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        text = source.decode(source_ids, skip_special_tokens=True)
        prompt = render_prompt(learner, "3+4*2=")
        input_ids, mask = encode_row_for(learner, prompt, text, finish_reason="stop")
        assert len(input_ids) == len(mask)
        prompt_ids = encode_prompt(learner, prompt)
        assert input_ids[: len(prompt_ids)] == prompt_ids
        assert mask == [0] * len(prompt_ids) + [1] * (len(input_ids) - len(prompt_ids))
        response_ids = input_ids[len(prompt_ids) :]
        assert response_ids[-1] == learner.eos_token_id
        assert learner.eos_token_id not in response_ids[:-1], "literal special-token text must stay text"
        assert learner.decode(response_ids[:-1]) == response


def test_eos_only_when_the_source_stopped(char_tokenizer) -> None:
    prompt = render_prompt(char_tokenizer, "1+1=")
    stopped, _ = encode_row_for(char_tokenizer, prompt, "2", finish_reason="stop")
    truncated, mask = encode_row_for(char_tokenizer, prompt, "2", finish_reason="length")
    assert stopped == truncated + [char_tokenizer.eos_token_id]
    assert sum(mask) == 1
    with pytest.raises(ValueError, match="finish_reason must be one of stop, length"):
        encode_row_for(char_tokenizer, prompt, "2", finish_reason="eos")


def test_own_rows_keep_their_stored_ids_exactly(bpe_tokenizer) -> None:
    prompt = render_prompt(bpe_tokenizer, "9*2=")
    merged = next(t for t in bpe_tokenizer.get_vocab() if len(t) == 2 and t.isdigit())
    # A non-canonical split a sampler can produce: a merged number as two single-byte tokens.
    own = [
        bpe_tokenizer.convert_tokens_to_ids(merged[0]),
        bpe_tokenizer.convert_tokens_to_ids(merged[1]),
        bpe_tokenizer.eos_token_id,
    ]
    assert bpe_tokenizer(merged, add_special_tokens=False)["input_ids"] != own[:2]
    input_ids, mask = encode_row_for(bpe_tokenizer, prompt, merged, own_token_ids=own, finish_reason="length")
    assert input_ids[-3:] == own
    assert mask[-3:] == [1, 1, 1] and sum(mask) == 3


def test_cross_row_truncation(char_tokenizer) -> None:
    prompt = render_prompt(char_tokenizer, "1+1=")
    ids, mask = encode_row_for(char_tokenizer, prompt, "12345", max_response_tokens=3)
    assert sum(mask) == 3 and char_tokenizer.eos_token_id not in ids


def test_collate_right_pads(char_tokenizer) -> None:
    rows = [([5, 6, 7], [0, 1, 1]), ([8], [1])]
    input_ids, attention_mask, response_mask = collate(rows, pad_token_id=char_tokenizer.pad_token_id)
    assert input_ids.tolist() == [[5, 6, 7], [8, char_tokenizer.pad_token_id, char_tokenizer.pad_token_id]]
    assert attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert response_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert input_ids.dtype == torch.long
    with pytest.raises(ValueError, match="2 ids but 1 mask"):
        collate([([1, 2], [1])], pad_token_id=0)


def test_collate_equals_row_by_row_padding():
    """collate pads the whole batch in one tensor call; the result is the per-row slice writes' exactly."""
    import random

    import torch

    rng = random.Random(0)
    rows = []
    for _ in range(17):
        prompt, response = rng.randint(1, 30), rng.randint(0, 50)
        rows.append(([rng.randrange(150_000) for _ in range(prompt + response)], [0] * prompt + [1] * response))
    width = max(len(ids) for ids, _ in rows)
    expected = [
        torch.full((len(rows), width), 7, dtype=torch.long),
        torch.zeros((len(rows), width), dtype=torch.long),
        torch.zeros((len(rows), width), dtype=torch.long),
    ]
    for index, (ids, mask) in enumerate(rows):
        expected[0][index, : len(ids)] = torch.tensor(ids)
        expected[1][index, : len(ids)] = 1
        expected[2][index, : len(mask)] = torch.tensor(mask)
    for got, want in zip(collate(rows, pad_token_id=7), expected):
        assert got.dtype == torch.long and torch.equal(got, want)
