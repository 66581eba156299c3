"""Tiny presets: warm start gives RL signal, builds are deterministic, cached and atomic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import PRESETS, build_tiny_model, greedy_accuracy, parse_tiny_uri, read_build_record


def test_presets_differ_in_architecture_size_and_tokenizer() -> None:
    llama, qwen = PRESETS["llama-char"], PRESETS["qwen2-bpe"]
    assert (llama.architecture, llama.tokenizer) == ("llama", "char")
    assert (qwen.architecture, qwen.tokenizer) == ("qwen2", "bpe")
    assert (llama.hidden_size, llama.num_layers) != (qwen.hidden_size, qwen.num_layers)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_warm_start_gives_nonzero_but_far_from_perfect_accuracy(default_builds: dict[str, Path], preset: str) -> None:
    path = default_builds[preset]
    record = read_build_record(path)
    assert 0.05 < record["eval_accuracy"] < 0.6, record
    model, tokenizer = load_policy(path)
    assert type(model).__name__ == {"llama-char": "LlamaForCausalLM", "qwen2-bpe": "Qwen2ForCausalLM"}[preset]
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    held_out = [ArithmeticTask(split="eval").problem(i) for i in range(60)]
    assert 0.0 < greedy_accuracy(model, tokenizer, held_out) < 0.8
    assert (path / "model.safetensors").is_file()


def test_second_build_reuses_the_cache(default_builds: dict[str, Path]) -> None:
    built = default_builds["llama-char"]
    files = {f.name: f.stat().st_mtime_ns for f in built.iterdir()}
    assert build_tiny_model("llama-char", seed=0, cache_dir=built.parent) == built
    assert {f.name: f.stat().st_mtime_ns for f in built.iterdir()} == files, "the cached build was rewritten"
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".tmp")], "no temporary directory left behind"


def test_same_seed_gives_identical_weights_and_another_seed_does_not(tmp_path: Path) -> None:
    torch.manual_seed(1234)
    before = torch.rand(3)
    first = build_tiny_model("qwen2-bpe", seed=3, cache_dir=tmp_path / "a", warmup_steps=4)
    after = torch.rand(3)
    torch.manual_seed(1234)
    assert torch.equal(torch.rand(3), before) and not torch.equal(before, after), "the build must not consume the caller's RNG"
    second = build_tiny_model("qwen2-bpe", seed=3, cache_dir=tmp_path / "b", warmup_steps=4)
    other = build_tiny_model("qwen2-bpe", seed=4, cache_dir=tmp_path / "c", warmup_steps=4)
    weights = [load_file(p / "model.safetensors") for p in (first, second, other)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()


def test_tiny_uri_parsing() -> None:
    assert parse_tiny_uri("tiny://llama-char?seed=2&warmup_steps=10&difficulty=2&data_seed=1") == {
        "preset": "llama-char",
        "seed": 2,
        "warmup_steps": 10,
        "task_spec": "builtin://arithmetic?difficulty=2-2&seed=1",
    }
    assert parse_tiny_uri("tiny://qwen2-bpe")["warmup_steps"] is None
    with pytest.raises(ValueError, match="unknown tiny preset 'gpt9'; valid: llama-char, qwen2-bpe"):
        parse_tiny_uri("tiny://gpt9")
    with pytest.raises(ValueError, match="unknown parameter.*lr.*valid: seed, warmup_steps, difficulty, data_seed"):
        parse_tiny_uri("tiny://llama-char?lr=1")
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        parse_tiny_uri("tiny://llama-char?warmup_steps=-1")
