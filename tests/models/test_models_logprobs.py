"""sequence_logprobs: golden per-row values, padding on either side, masks, dtype, gradients."""

from __future__ import annotations

import pytest
import torch

from hacrl_core.models.logprobs import masked_sum_and_count, sequence_logprobs
from hacrl_core.models.tiny import _make_model, get_preset

ROWS = [
    ([1, 20, 21, 22, 30, 31, 2], 4),
    ([1, 25, 26, 40, 2], 3),
    ([1, 27, 50, 51, 52, 53, 54, 55, 2], 2),
]  # (ids, prompt length)


@pytest.fixture(scope="module")
def model(char_tokenizer):
    torch.manual_seed(0)
    return _make_model(get_preset("llama-char"), char_tokenizer).eval()


def _reference(model, ids: list[int], prompt_len: int) -> torch.Tensor:
    """Unpadded, one row at a time, float64 log_softmax: the definition."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(len(ids), dtype=torch.float64)
    out[prompt_len:] = logp[prompt_len - 1 :]
    return out


def _batch(rows, pad: int, left: bool):
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response = torch.zeros_like(input_ids)
    for i, (ids, prompt_len) in enumerate(rows):
        start = width - len(ids) if left else 0
        input_ids[i, start : start + len(ids)] = torch.tensor(ids)
        attention[i, start : start + len(ids)] = 1
        response[i, start + prompt_len : start + len(ids)] = 1
    return input_ids, attention, response


@pytest.mark.parametrize("left", [False, True])
def test_matches_the_unpadded_definition(model, char_tokenizer, left: bool) -> None:
    input_ids, attention, response = _batch(ROWS, char_tokenizer.pad_token_id, left)
    with torch.no_grad():
        got = sequence_logprobs(model, input_ids, attention, response)
    assert got.dtype == torch.float32 and got.shape == input_ids.shape
    width = input_ids.shape[1]
    for i, (ids, prompt_len) in enumerate(ROWS):
        start = width - len(ids) if left else 0
        expected = _reference(model, ids, prompt_len).float()
        torch.testing.assert_close(got[i, start : start + len(ids)], expected, atol=2e-5, rtol=1e-5)
        assert torch.all(got[i, :start] == 0) and torch.all(got[i, start + len(ids) :] == 0)


def test_masked_positions_are_exactly_zero_whatever_the_ids(model, char_tokenizer) -> None:
    input_ids, attention, response = _batch(ROWS, char_tokenizer.pad_token_id, left=False)
    with torch.no_grad():
        base = sequence_logprobs(model, input_ids, attention, response)
        garbage = input_ids.clone()
        garbage[attention == 0] = 50  # sentinel tokens in padding slots
        assert torch.equal(sequence_logprobs(model, garbage, attention, response), base)
    assert torch.all(base[response == 0] == 0)
    assert torch.all(base[response == 1] < 0)


def test_gradients_flow_and_bf16_models_give_float32(model, char_tokenizer) -> None:
    input_ids, attention, response = _batch(ROWS, char_tokenizer.pad_token_id, left=False)
    logp = sequence_logprobs(model, input_ids, attention, response)
    total, count = masked_sum_and_count(logp, response)
    assert count.tolist() == [3.0, 2.0, 7.0]
    (total / count).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)
    half = _make_model(get_preset("llama-char"), char_tokenizer).to(torch.bfloat16)
    with torch.no_grad():
        assert sequence_logprobs(half, input_ids, attention, response).dtype == torch.float32


def test_shape_mismatch_is_rejected(model) -> None:
    ids = torch.ones((2, 4), dtype=torch.long)
    with pytest.raises(ValueError, match="must have the same shape"):
        sequence_logprobs(model, ids, ids, torch.ones((2, 3)))


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward takes no ``logits_to_keep``: it returns every position's logits."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )


class _PassesKwargsOn(torch.nn.Module):
    """A wrapper (as PEFT's and DeepSpeed's) whose forward passes its keyword arguments on."""

    def __init__(self, module) -> None:
        super().__init__()
        self.module = module
        self.kept: list[int] = []

    def forward(self, **kwargs):
        self.kept.append(kwargs.get("logits_to_keep", 0))
        return self.module(**kwargs)


@pytest.mark.parametrize("left", [False, True])
def test_prompt_logits_are_skipped_and_change_nothing(model, char_tokenizer, left: bool) -> None:
    """Only the logits from the first response column on are computed (``logits_to_keep``); the
    log-probs and their gradients equal those of a model that returns every position's logits."""
    from hacrl_core.models.logprobs import accepts_logits_to_keep, first_scored_column

    input_ids, attention, response = _batch(ROWS, char_tokenizer.pad_token_id, left)
    wrapped, full = _PassesKwargsOn(model), _NoLogitsToKeep(model)
    assert accepts_logits_to_keep(model) and accepts_logits_to_keep(wrapped) and not accepts_logits_to_keep(full)
    first = first_scored_column(response)
    assert first == (2 if not left else input_ids.shape[1] - 7)  # row 3's prompt is 2 tokens; left: row 1's response
    results = []
    for candidate in (wrapped, full):
        model.zero_grad(set_to_none=True)
        logp = sequence_logprobs(candidate, input_ids, attention, response)
        (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    assert wrapped.kept == [input_ids.shape[1] - first + 1]
    (sliced, sliced_grads), (every, every_grads) = results
    torch.testing.assert_close(sliced, every, atol=1e-6, rtol=1e-6)
    assert torch.all(sliced[:, :first] == 0)
    for got, expected in zip(sliced_grads, every_grads):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_no_response_token_scores_nothing(model, char_tokenizer) -> None:
    input_ids, attention, response = _batch(ROWS, char_tokenizer.pad_token_id, False)
    with torch.no_grad():
        got = sequence_logprobs(model, input_ids, attention, torch.zeros_like(response))
    assert got.shape == input_ids.shape and torch.all(got == 0)


def _graph_nodes(output: torch.Tensor, name: str) -> int:
    """How many nodes of ``output``'s autograd graph are named ``name``."""
    seen, stack, count = set(), [output.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == name
        stack.extend(next_node for next_node, _ in node.next_functions)
    return count


def test_row_chunks_give_the_per_chunk_slices_values_in_one_backward_node(model, char_tokenizer) -> None:
    """More rows than ``LOGIT_CHUNK_ROWS``: the chunks are split off the logits in one node (a
    slice per chunk made each chunk's backward write a gradient the size of all the logits, summed
    over the chunks), with the log-probs and gradients of the per-chunk slices (the code before)
    and the log-probs of one log_softmax over every row."""
    from hacrl_core.models.logprobs import LOGIT_CHUNK_ROWS

    rows = [ROWS[i % len(ROWS)] for i in range(2 * LOGIT_CHUNK_ROWS + 3)]
    input_ids, attention, response = _batch(rows, char_tokenizer.pad_token_id, False)
    weights = torch.linspace(0.5, 1.5, input_ids.numel()).view(input_ids.shape)
    model.zero_grad(set_to_none=True)
    got = sequence_logprobs(model, input_ids, attention, response)
    (got * weights).sum().backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=False).logits
    pieces = []
    for start in range(0, len(rows), LOGIT_CHUNK_ROWS):  # the per-chunk slices
        chunk = logits[start : start + LOGIT_CHUNK_ROWS, :-1].float()
        target = input_ids[start : start + LOGIT_CHUNK_ROWS, 1:].unsqueeze(-1)
        pieces.append(chunk.gather(-1, target).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
    sliced = torch.cat([logits.new_zeros(len(rows), 1), torch.cat(pieces) * response[:, 1:]], dim=1)
    (sliced * weights).sum().backward()
    torch.testing.assert_close(got, sliced, atol=1e-6, rtol=1e-6)
    for mine, before in zip(got_grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(mine, before, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        one = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(got[:, 1:], one * response[:, 1:], atol=1e-5, rtol=1e-5)
    few = sequence_logprobs(model, *_batch(ROWS, char_tokenizer.pad_token_id, False))
    assert _graph_nodes(got, "SliceBackward0") == _graph_nodes(few, "SliceBackward0")
    assert _graph_nodes(got, "SplitBackward0") == 1
