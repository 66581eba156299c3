"""G samples per prompt with one prefill per prompt: the hf engine's decode loop.

transformers' ``generate(num_return_sequences=G)`` copies every prompt G times before its first
forward pass, so the prompt is read G times and its KV cache computed G times. GRPO samples
G = 8-16 completions of the same prompt: here the prompts are read once, the cache is repeated
G times (``Cache.batch_repeat_interleave``, the call beam search uses), and only the new tokens
cost a forward pass per row. The samples come from a ``torch.Generator`` of their own, so
sampling never moves the global RNG that a colocated learner trains with.

The distribution is generate's: logits / temperature, then nucleus (top-p) filtering, then one
multinomial draw per row; greedy takes the argmax. A row stops at its eos, and pads after it,
as generate does. Every policy is a decoder-only causal LM (``models.loading``), whose caches
all repeat.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def _base_forward_parameters(model: Any) -> set[str]:
    # A peft wrapper's forward takes **kwargs and hands them to the base model's.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


def _cache_of(output: Any) -> Any:
    # transformers 5 names it `cache`; 4.x `past_key_values`.
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def next_tokens(
    logits: torch.Tensor, *, greedy: bool, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row from last-position ``logits`` [rows, vocab]: argmax, or a draw from
    softmax(logits / temperature) restricted to the smallest set of tokens whose probability
    reaches ``top_p`` (the most likely token always stays)."""
    if greedy:
        return logits.argmax(dim=-1)
    scores = logits.float() / temperature
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # drop a token once the ones before it already reach top_p
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def sample_with_shared_prefill(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    greedy: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """New tokens [prompts * samples_per_prompt, <= max_new_tokens] for left-padded prompts
    ``input_ids`` [prompts, width]; rows are prompt-major (prompt 0's samples first), padded with
    ``pad_id`` after their eos; the width is that of the longest row."""
    parameters = _base_forward_parameters(model)
    cache_name = "cache" if "cache" in parameters else "past_key_values"
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
    # Left padding: a prompt's first real token is position 0, as generate counts them.
    positions = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
    output = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True, **last_only
    )
    cache = _cache_of(output)
    logits = output.logits[:, -1, :]
    if samples_per_prompt > 1:
        cache.batch_repeat_interleave(samples_per_prompt)
        logits = logits.repeat_interleave(samples_per_prompt, dim=0)
        attention_mask = attention_mask.repeat_interleave(samples_per_prompt, dim=0)
        positions = positions.repeat_interleave(samples_per_prompt, dim=0)
    position = positions[:, -1:]
    finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    tokens: list[torch.Tensor] = []
    for index in range(max_new_tokens):
        chosen = next_tokens(logits, greedy=greedy, temperature=temperature, top_p=top_p, generator=generator)
        chosen = chosen.masked_fill(finished, pad_id)
        tokens.append(chosen)
        finished |= chosen == eos_id
        if index == max_new_tokens - 1 or bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        position = position + 1
        output = model(
            input_ids=chosen[:, None],
            attention_mask=attention_mask,
            position_ids=position,
            use_cache=True,
            **{cache_name: cache},
        )
        cache = _cache_of(output)
        logits = output.logits[:, -1, :]
    return torch.stack(tokens, dim=1)
