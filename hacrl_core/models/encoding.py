"""Token ids of prompts and of rows for a learner, own or cross (docs/architecture.md, "One step", step 5).

``encode_prompt`` is the one way a rendered prompt becomes ids, for the rollout worker and the
learner alike (no special tokens added: the chat template already wrote any BOS), so a learner
rebuilds exactly the prompt ids its rollout worker generated from.

``encode_row_for(tokenizer, prompt_text, response_text, own_token_ids, finish_reason=...)``:

- OWN row (``own_token_ids`` given): ``prompt ids + own_token_ids``, the sampler's response ids
  unchanged (never a decode/re-encode round trip, which is not the identity for BPE);
- CROSS row: ``prompt ids + ids of response_text`` encoded by THIS tokenizer with no special
  tokens added and special-token strings in the text treated as plain text (a response that
  literally contains ``<|eos|>`` must not end the learner's sequence early), then this
  tokenizer's EOS when the source finished with ``"stop"``.

Prompt and response are encoded separately and concatenated, so no token spans the boundary.

A shard's rows go through ``encode_prompts`` / ``encode_texts`` (one tokenizer call for many
texts: the fast tokenizer's batch encode, the same ids as one call per text) and
``assemble_row`` (EOS and truncation of one row); ``encode_row_for`` is the one-row form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

FINISH_REASONS = ("stop", "length")


def encode_prompt(tokenizer: Any, prompt_text: str) -> list[int]:
    """Ids of a rendered prompt (``hacrl_core.data.templates.render_prompt``), no specials added."""
    return encode_prompts(tokenizer, [prompt_text])[0]


def encode_prompts(tokenizer: Any, prompt_texts: Sequence[str]) -> list[list[int]]:
    """``encode_prompt`` of every text, in one tokenizer call."""
    return _encode_batch(tokenizer, prompt_texts, add_special_tokens=False)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of free text with no special tokens added and special-token strings kept as text."""
    return encode_texts(tokenizer, [text])[0]


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """``encode_text`` of every text, in one tokenizer call."""
    return _encode_batch(tokenizer, texts, add_special_tokens=False, split_special_tokens=True)


def _encode_batch(tokenizer: Any, texts: Sequence[str], **options: Any) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), **options)["input_ids"]]


def encode_row_for(
    tokenizer: Any,
    prompt_text: str,
    response_text: str,
    own_token_ids: Sequence[int] | None = None,
    *,
    finish_reason: str = "stop",
    max_response_tokens: int | None = None,
    prompt_ids: Sequence[int] | None = None,
) -> tuple[list[int], list[int]]:
    """``(input_ids, response_mask)`` of one row for the learner that owns ``tokenizer``.

    Args:
        tokenizer: the LEARNER's tokenizer.
        prompt_text: the prompt rendered for this tokenizer (its own chat template).
        response_text: the response as text (used for cross rows only).
        own_token_ids: the stored response ids when the row is the learner's own; None for a
            cross row.
        finish_reason: ``"stop"`` (the source emitted its EOS: append ours) or ``"length"``
            (truncated: no EOS). Ignored for own rows, whose ids already hold what was sampled.
        max_response_tokens: cross rows only: keep at most this many response tokens (EOS
            included); a cut response gets no EOS.
        prompt_ids: ``encode_prompt(tokenizer, prompt_text)`` when the caller has it already
            (the G rows of a prompt share it).

    Returns:
        ``input_ids`` (prompt then response) and ``response_mask`` (0 on prompt tokens, 1 on
        response tokens), both lists of the same length.
    """
    prompt_ids = prompt_ids if prompt_ids is not None else encode_prompt(tokenizer, prompt_text)
    if own_token_ids is not None:
        return assemble_row(prompt_ids, own_token_ids, own=True, eos_token_id=None, finish_reason=finish_reason)
    return assemble_row(
        prompt_ids,
        encode_text(tokenizer, response_text),
        own=False,
        eos_token_id=tokenizer.eos_token_id,
        finish_reason=finish_reason,
        max_response_tokens=max_response_tokens,
    )


def assemble_row(
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    *,
    own: bool,
    eos_token_id: int | None,
    finish_reason: str = "stop",
    max_response_tokens: int | None = None,
) -> tuple[list[int], list[int]]:
    """``encode_row_for`` from ids already encoded: ``prompt_ids`` (``encode_prompt``) and
    ``response_ids`` (an own row's stored ids, or ``encode_text`` of a cross row's response).
    A cross row (``own`` False) gets the learner tokenizer's ``eos_token_id`` when
    ``finish_reason`` is ``"stop"`` and is cut to ``max_response_tokens``; an own row's ids are
    kept exactly. (The caller looks ``eos_token_id`` up once: on a transformers tokenizer each
    lookup costs about 0.1 ms, more than the rest of the row.)"""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {', '.join(FINISH_REASONS)}, got {finish_reason!r}")
    response_ids = [int(token) for token in response_ids] if own else list(response_ids)
    if not own:
        if finish_reason == "stop":
            if eos_token_id is None:
                raise ValueError("tokenizer has no eos_token_id; cannot mark a stopped cross row")
            response_ids.append(int(eos_token_id))
        if max_response_tokens is not None and len(response_ids) > max_response_tokens:
            response_ids = response_ids[:max_response_tokens]
    return list(prompt_ids) + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def collate(
    rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad ``(input_ids, response_mask)`` rows into tensors.

    Returns ``input_ids`` long[N, T] (padding = ``pad_token_id``), ``attention_mask`` long[N, T]
    (1 on real tokens) and ``response_mask`` long[N, T] (1 on response tokens, 0 on prompt and
    padding), with T the longest row.
    """
    if not rows:
        raise ValueError("collate needs at least one row")
    lengths = [len(ids) for ids, _ in rows]
    for index, ((_, mask), length) in enumerate(zip(rows, lengths)):
        if length != len(mask):
            raise ValueError(f"row {index}: {length} ids but {len(mask)} mask entries")
    width = max(lengths)
    # One torch.tensor call per batch on rows padded as lists: a call and three slice writes per
    # row cost ~3 ms per 64-row micro-batch, paid by every scoring and training pass.
    input_ids = torch.tensor(
        [[*ids, *[pad_token_id] * (width - n)] for (ids, _), n in zip(rows, lengths)], dtype=torch.long
    )
    response_mask = torch.tensor([[*mask, *[0] * (width - n)] for (_, mask), n in zip(rows, lengths)], dtype=torch.long)
    attention_mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    return input_ids, attention_mask, response_mask
