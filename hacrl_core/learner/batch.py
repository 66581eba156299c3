"""A step's training rows in the learner's own tokenizer (docs/architecture.md, "One step", step 5)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hacrl_core.data.templates import render_prompt
from hacrl_core.learner.micro_batches import MicroBatching
from hacrl_core.models.encoding import assemble_row, collate, encode_prompts, encode_texts
from hacrl_core.models.logprobs import sequence_logprobs


@dataclass
class TrainRow:
    source: int  # agent index of the sampler
    group: str  # prompt uid
    reward: float
    input_ids: list[int]  # prompt + response in the learner's tokenizer
    response_mask: list[int]
    is_own: bool
    # A row carries no pi_old: the pi_old stage returns every row's apart, frozen
    # (``learner.stages.score_pi_old``, ``OldLogprobs``).


def rollout_columns(rollouts: Any, names: Sequence[str]) -> dict[str, list]:
    """The named columns of a rollouts (or scores) shard as Python lists, one list per column.

    ``rollouts`` is the store's Arrow table (``read_rollouts_columns``: each column converted in
    one call, no row dict built) or a sequence of row dicts (``read_rollouts``; rows sampled in
    memory by the examples and benchmarks).
    """
    if hasattr(rollouts, "column_names"):
        return {name: rollouts.column(name).to_pylist() for name in names}
    return {name: [row[name] for row in rollouts] for name in names}


def encode_rows(rollouts: Any, *, source: int, is_own: bool, tokenizer, template: str) -> list[TrainRow]:
    """The training rows of a rollouts shard (``rollout_columns``: a table or row dicts).

    Own rows keep their stored ids; cross rows are re-encoded after the learner's own prompt.
    Tokenizer calls are batched: each distinct prompt is rendered once, the distinct prompts are
    encoded in one call and a peer's responses in another (``encode_prompts``, ``encode_texts``:
    the ids of one call per text); ``assemble_row`` then builds each row.
    """
    names = ["prompt_uid", "reward", "finish_reason"] + (["prompt", "token_ids"] if is_own else ["extra", "response"])
    columns = rollout_columns(rollouts, names)
    if is_own:
        prompts = columns["prompt"]
        responses = columns["token_ids"]
    else:
        questions = {text: json.loads(text)["question"] for text in dict.fromkeys(columns["extra"])}
        rendered = {
            question: render_prompt(tokenizer, question, template) for question in dict.fromkeys(questions.values())
        }
        prompts = [rendered[questions[text]] for text in columns["extra"]]
        responses = encode_texts(tokenizer, columns["response"])
    distinct = list(dict.fromkeys(prompts))
    prompt_ids = dict(zip(distinct, encode_prompts(tokenizer, distinct)))
    eos = None if is_own else tokenizer.eos_token_id
    encoded = []
    for uid, reward, finish, prompt, response in zip(
        columns["prompt_uid"], columns["reward"], columns["finish_reason"], prompts, responses
    ):
        ids, mask = assemble_row(prompt_ids[prompt], response, own=is_own, eos_token_id=eos, finish_reason=finish)
        encoded.append(TrainRow(source, uid, float(reward), ids, mask, is_own))
    return encoded


def collate_rows(rows: Sequence[TrainRow], pad_token_id: int, device: str = "cpu"):
    input_ids, attention, response = collate([(r.input_ids, r.response_mask) for r in rows], pad_token_id)
    return input_ids.to(device), attention.to(device), response.to(device)


@torch.no_grad()
def score_rows(model, rows: Sequence[TrainRow], pad_token_id: int, micro_batching: MicroBatching, device: str = "cpu"):
    """Per-row (sum, count) of response log-probs and the per-token log-probs, without grad, in
    micro-batches of ``micro_batching``."""
    sums: list[float] = []
    counts: list[int] = []
    tokens: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    for indices in micro_batching.pack(rows, range(len(rows))):
        chunk = [rows[i] for i in indices]
        input_ids, attention, response = collate_rows(chunk, pad_token_id, device)
        logp = sequence_logprobs(model, input_ids, attention, response)
        mask = response.to(logp.dtype)
        sums.extend((logp * mask).sum(-1).tolist())
        counts.extend(mask.sum(-1).long().tolist())
        tokens.extend(logp[i, : len(row.input_ids)].cpu() for i, row in enumerate(chunk))
    if was_training:
        model.train()
    return sums, counts, tokens
