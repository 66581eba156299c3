"""Per-token log-probabilities of given sequences under a causal LM (the learner's scorer).

One implementation for pi_old, pi_new and the reference model alike, so the ratio
``log pi_new - log pi_old`` is never the difference of two differently computed numbers.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, cast

import torch

#: Rows whose logits are turned to float32 at once; bounds the float32 copy to CHUNK x T x V.
LOGIT_CHUNK_ROWS = 8


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """Log-probability of each response token given everything before it.

    Args:
        model: a causal LM returning ``.logits`` [N, T, V].
        input_ids: long[N, T], prompt then response, padded on either side.
        attention_mask: [N, T], 1 on real tokens, 0 on padding. Position ids are the count of
            real tokens before each position, so left padding does not shift positions.
        response_mask: [N, T], 1 on the tokens to score (response tokens), 0 elsewhere.

    Returns:
        float32[N, T] aligned with ``input_ids``: entry ``[n, t]`` is
        ``log p(input_ids[n, t] | input_ids[n, :t])`` where ``response_mask[n, t]`` is 1 (and
        ``t > 0``), and exactly 0 elsewhere. Computed as ``logits[:, :-1]`` gathered at
        ``input_ids[:, 1:]`` minus ``logsumexp`` (``log_softmax``) in float32, whatever the
        model's dtype. Differentiable with respect to the model parameters.

    Only the columns from the batch's first response token on are scored: the model is asked for
    the logits of the last ``T - first + 1`` positions only (transformers' ``logits_to_keep``, as
    TRL does), so the LM head, the log-softmax and their backward skip the prompt positions, whose
    logits nothing reads (with 64-token prompts and 16-token responses, most of them).
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != response_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have the same shape [N, T]"
        )
    attention_mask = attention_mask.to(input_ids.device)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    first = first_scored_column(response_mask)
    keep = input_ids.shape[1] - first + 1  # the positions first - 1 .. T - 1: each predicts the next token
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **({"logits_to_keep": keep} if accepts_logits_to_keep(model) else {}),
    ).logits
    # A model without logits_to_keep returned every position. One slice and one split: slicing
    # each chunk out of the logits apart would give each chunk a backward node that writes a
    # zero-filled gradient of the whole logits, summed over the chunks (chunks x the logits' size).
    logits = logits[:, logits.shape[1] - keep : -1]
    targets = input_ids[:, first:].unsqueeze(-1).split(LOGIT_CHUNK_ROWS)
    pieces = []
    for rows, target in zip(logits.split(LOGIT_CHUNK_ROWS), targets):
        chunk = rows.float()
        pieces.append(chunk.gather(-1, target).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
    token_logprobs = torch.cat(pieces, dim=0)
    mask = response_mask[:, first:].to(token_logprobs.device).bool() & attention_mask[:, first:].bool()
    token_logprobs = torch.where(mask, token_logprobs, torch.zeros_like(token_logprobs))
    return torch.cat([token_logprobs.new_zeros(token_logprobs.shape[0], first), token_logprobs], dim=1)


def first_scored_column(response_mask: torch.Tensor) -> int:
    """The first column (at least 1: column 0 has no context) holding a response token in any row
    of ``response_mask`` [N, T]; T where none does."""
    columns = response_mask.bool().any(dim=0)
    if not bool(columns.any()):
        return response_mask.shape[1]
    return max(int(columns.long().argmax()), 1)


@functools.cache
def _forward_parameters(cls: type) -> tuple[bool, bool]:
    """(takes ``logits_to_keep``, takes ``**kwargs``) of ``cls.forward``."""
    try:
        parameters = inspect.signature(cast(Any, cls).forward).parameters.values()
    except (TypeError, ValueError):
        return False, False
    return any(p.name == "logits_to_keep" for p in parameters), any(p.kind is p.VAR_KEYWORD for p in parameters)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes transformers' ``logits_to_keep``, or passes its keyword
    arguments on (``**kwargs``: a PEFT or DeepSpeed wrapper) to a model it wraps that does."""
    for _ in range(4):
        takes, passes_on = _forward_parameters(type(model))  # type: ignore[arg-type]  # a class is hashable
        if takes:
            return True
        inner = next(
            (getattr(model, a, None) for a in ("module", "base_model", "model") if getattr(model, a, None) is not None),
            None,
        )
        if not passes_on or not isinstance(inner, torch.nn.Module) or inner is model:
            return False
        model = inner
    return False


def masked_sum_and_count(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(sum of values where mask, number of masked tokens)``, both float32[N].

    Divide the two for the per-sequence mean log-prob of GSPO's ratio (docs/architecture.md,
    "One step", step 6); keeping sum and count lets the store carry them and lengths stay in each
    tokenizer's own space.
    """
    mask = mask.to(values.device).float()
    return (values.float() * mask).sum(-1), mask.sum(-1)
