"""The hf engine's decode loop (``rollout.decoding``) against transformers' own ``generate``.

One prefill per prompt, its cache repeated G times, must give the tokens generate gives: greedy
decoding is compared token for token (left-padded prompts of different lengths, both tiny
architectures), sampling by its support (top-p) and its frequencies (temperature).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.generation.logits_process import TopPLogitsWarper

from hacrl_core.rollout.decoding import next_tokens, sample_with_shared_prefill

VOCAB, EOS, PAD = 61, 1, 0


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(3)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**common)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**common))
    return model.eval()


def left_padded(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(sum(lengths))
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(2, VOCAB, (length,), generator=generator)
        mask[row, width - length :] = 1
    return ids, mask


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("copies", [1, 3])
def test_greedy_tokens_equal_generate_for_left_padded_prompts_and_every_copy(kind: str, copies: int) -> None:
    model = tiny(kind)
    ids, mask = left_padded([5, 9, 2, 7])
    with torch.no_grad():
        expected = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD, eos_token_id=-1
        )[:, ids.shape[1] :]
    ours = sample_with_shared_prefill(
        model, ids, mask, samples_per_prompt=copies, max_new_tokens=12, eos_id=-1, pad_id=PAD, greedy=True
    )
    assert torch.equal(ours, expected.repeat_interleave(copies, dim=0))


def test_a_row_pads_after_its_eos_and_the_loop_stops_when_every_row_has_one() -> None:
    model = tiny("qwen2")
    ids, mask = left_padded([4, 6])
    free = sample_with_shared_prefill(
        model, ids, mask, samples_per_prompt=1, max_new_tokens=8, eos_id=-1, pad_id=PAD, greedy=True
    )
    # name the first row's third greedy token the eos: that row stops there, the other runs on
    eos = int(free[0, 2])
    stopped = sample_with_shared_prefill(
        model, ids, mask, samples_per_prompt=1, max_new_tokens=8, eos_id=eos, pad_id=PAD, greedy=True
    )
    assert stopped[0, :3].tolist() == free[0, :3].tolist() and set(stopped[0, 3:].tolist()) <= {PAD}
    second_eos = (free[1] == eos).nonzero()
    expected_width = 8 if len(second_eos) == 0 else max(3, int(second_eos[0]) + 1)
    assert stopped.shape[1] == expected_width
    # every row's first token an eos: one step, nothing more computed
    first = int(free[0, 0])
    same_first = sample_with_shared_prefill(
        model, ids[:1], mask[:1], samples_per_prompt=4, max_new_tokens=8, eos_id=first, pad_id=PAD, greedy=True
    )
    assert same_first.tolist() == [[first]] * 4


def test_sampling_is_reproducible_from_its_generator_and_leaves_the_global_rng_alone() -> None:
    model = tiny("llama")
    ids, mask = left_padded([3, 8])
    state = torch.get_rng_state()

    def draw(seed: int) -> torch.Tensor:
        return sample_with_shared_prefill(
            model,
            ids,
            mask,
            samples_per_prompt=6,
            max_new_tokens=10,
            eos_id=EOS,
            pad_id=PAD,
            temperature=1.0,
            generator=torch.Generator().manual_seed(seed),
        )

    first, again, other = draw(7), draw(7), draw(8)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(torch.get_rng_state(), state), "sampling must not move the global RNG a colocated learner uses"
    # the G samples of one prompt differ from each other (the cache is shared, the draws are not)
    assert len({tuple(row) for row in first[:6].tolist()}) > 1


@pytest.mark.parametrize("top_p", [0.3, 0.7, 0.9, 0.99])
def test_top_p_keeps_the_tokens_transformers_keeps(top_p: float) -> None:
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(int(top_p * 100))) * 3
    kept_by_transformers = TopPLogitsWarper(top_p)(None, logits.clone()) > float("-inf")
    draws = torch.stack(
        [
            next_tokens(logits, greedy=False, temperature=1.0, top_p=top_p, generator=torch.Generator().manual_seed(s))
            for s in range(200)
        ],
        dim=1,
    )
    drawn = torch.zeros_like(kept_by_transformers)
    drawn.scatter_(1, draws, True)
    assert not (drawn & ~kept_by_transformers).any(), "a token outside the nucleus was drawn"
    # and the nucleus is not cut short: with 200 draws, kept tokens of probability >= 5% all show up
    probabilities = logits.softmax(-1)
    assert not (kept_by_transformers & (probabilities >= 0.05) & ~drawn).any()


def test_first_token_frequencies_follow_the_tempered_softmax() -> None:
    model = tiny("qwen2")
    ids, mask = left_padded([6])
    temperature = 0.7
    with torch.no_grad():
        probabilities = (model(input_ids=ids, attention_mask=mask).logits[0, -1] / temperature).softmax(-1)
    draws = sample_with_shared_prefill(
        model,
        ids,
        mask,
        samples_per_prompt=4000,
        max_new_tokens=1,
        eos_id=EOS,
        pad_id=PAD,
        temperature=temperature,
        generator=torch.Generator().manual_seed(0),
    )[:, 0]
    frequencies = torch.bincount(draws, minlength=VOCAB).double() / len(draws)
    total_variation = 0.5 * (frequencies - probabilities.double()).abs().sum()
    assert total_variation < 0.06, (
        f"sampled frequencies are {total_variation:.3f} (total variation) from the tempered softmax"
    )
