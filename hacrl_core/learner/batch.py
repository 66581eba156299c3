"""A step's training rows in the learner's own tokenizer (DESIGN.md section 2, step 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from hacrl_core.data.templates import render_prompt
from hacrl_core.models.encoding import collate, encode_prompt, encode_row_for
from hacrl_core.models.logprobs import sequence_logprobs


@dataclass
class TrainRow:
    source: int  # agent index of the sampler
    group: str  # prompt uid
    reward: float
    input_ids: list[int]  # prompt + response in the learner's tokenizer
    response_mask: list[int]
    is_own: bool
    # pi_old of the row: the mean over response tokens, from the source's scores (or the
    # learner's own scoring); None until known (rows of an isolated algorithm's first update
    # get it from that update's own forward pass, see ``learner.stages.score_own_rows``).
    logp_old_mean: float | None = 0.0
    logp_old_tokens: torch.Tensor | None = None  # per-token pi_old of own rows (token-level losses)


def encode_rows(
    rows: Sequence[dict], *, source: int, is_own: bool, tokenizer, template: str
) -> list[TrainRow]:
    """Own rows keep their stored ids; cross rows are re-encoded after the learner's own prompt.
    Each distinct prompt is rendered and encoded once (the G rows of a prompt share it)."""
    encoded = []
    rendered: dict[str, str] = {}
    prompt_ids: dict[str, list[int]] = {}
    for row in rows:
        if is_own:
            prompt = row["prompt"]
        else:
            question = json.loads(row["extra"])["question"]
            prompt = rendered.get(question)
            if prompt is None:
                prompt = rendered[question] = render_prompt(tokenizer, question, template)
        if prompt not in prompt_ids:
            prompt_ids[prompt] = encode_prompt(tokenizer, prompt)
        ids, mask = encode_row_for(tokenizer, prompt, row["response"], row["token_ids"] if is_own else None,
                                   finish_reason=row["finish_reason"], prompt_ids=prompt_ids[prompt])
        encoded.append(TrainRow(source, row["prompt_uid"], float(row["reward"]), ids, mask, is_own))
    return encoded


def micro_batches(rows: Sequence[TrainRow], size: int) -> Iterator[list[TrainRow]]:
    for start in range(0, len(rows), size):
        yield list(rows[start : start + size])


def collate_rows(rows: Sequence[TrainRow], pad_token_id: int, device: str = "cpu"):
    input_ids, attention, response = collate([(r.input_ids, r.response_mask) for r in rows], pad_token_id)
    return input_ids.to(device), attention.to(device), response.to(device)


@torch.no_grad()
def score_rows(model, rows: Sequence[TrainRow], pad_token_id: int, micro_batch_size: int, device: str = "cpu"):
    """Per-row (sum, count) of response log-probs and the per-token log-probs, without grad."""
    sums, counts, tokens = [], [], []
    was_training = model.training
    model.eval()
    for chunk in micro_batches(rows, micro_batch_size):
        input_ids, attention, response = collate_rows(chunk, pad_token_id, device)
        logp = sequence_logprobs(model, input_ids, attention, response)
        mask = response.to(logp.dtype)
        sums.extend((logp * mask).sum(-1).tolist())
        counts.extend(mask.sum(-1).long().tolist())
        tokens.extend(logp[i, : len(row.input_ids)].cpu() for i, row in enumerate(chunk))
    if was_training:
        model.train()
    return sums, counts, tokens
