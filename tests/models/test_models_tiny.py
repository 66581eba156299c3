"""Tiny presets: warm start gives RL signal, builds are deterministic, cached and atomic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.models.loading import load_policy
from hacrl_core.models.tiny import (
    PRESETS,
    apply_overrides,
    build_tiny_model,
    cache_key,
    greedy_accuracy,
    parse_tiny_uri,
    read_build_record,
)


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
    # Only this model's: the cache is the session's, where another build may be under way (or
    # have been killed mid-build by a timeout, which leaves its own temporary directory).
    assert not [p for p in built.parent.iterdir() if p.name.startswith(f".tmp-{built.name}-")], (
        "no temporary directory left behind"
    )


def test_same_seed_gives_identical_weights_and_another_seed_does_not(tmp_path: Path) -> None:
    torch.manual_seed(1234)
    before = torch.rand(3)
    first = build_tiny_model("qwen2-bpe", seed=3, cache_dir=tmp_path / "a", warmup_steps=4)
    after = torch.rand(3)
    torch.manual_seed(1234)
    assert torch.equal(torch.rand(3), before) and not torch.equal(before, after), (
        "the build must not consume the caller's RNG"
    )
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
        "overrides": {},
    }
    assert parse_tiny_uri("tiny://qwen2-bpe")["warmup_steps"] is None
    with pytest.raises(ValueError, match="unknown tiny preset 'gpt9'; valid: llama-char, qwen2-bpe"):
        parse_tiny_uri("tiny://gpt9")
    with pytest.raises(
        ValueError,
        match="unknown parameter.*lr.*valid: seed, warmup_steps, difficulty, data_seed, format, hidden, layers, tokenizer",
    ):
        parse_tiny_uri("tiny://llama-char?lr=1")
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        parse_tiny_uri("tiny://llama-char?warmup_steps=-1")


def test_agents_that_differ_by_design_are_one_uri_option_away() -> None:
    """Worked-chain warm start, width, depth and tokenizer from the URI, each part of the cache key."""
    parsed = parse_tiny_uri("tiny://qwen2-bpe?format=chain&difficulty=2-3&hidden=64&layers=2&tokenizer=char")
    assert parsed["task_spec"] == "builtin://arithmetic?difficulty=2-3&seed=0&format=chain"
    assert parsed["overrides"] == {"hidden_size": 64, "num_layers": 2, "tokenizer": "char"}
    resized = apply_overrides(PRESETS["qwen2-bpe"], parsed["overrides"])
    assert (
        resized.hidden_size,
        resized.intermediate_size,
        resized.num_layers,
        resized.tokenizer,
        resized.architecture,
    ) == (64, 128, 2, "char", "qwen2")
    keys = {
        cache_key(
            apply_overrides(PRESETS["qwen2-bpe"], parse_tiny_uri(uri)["overrides"]), 0, parse_tiny_uri(uri)["task_spec"]
        )
        for uri in (
            "tiny://qwen2-bpe",
            "tiny://qwen2-bpe?hidden=64",
            "tiny://qwen2-bpe?layers=2",
            "tiny://qwen2-bpe?tokenizer=char",
            "tiny://qwen2-bpe?format=chain",
        )
    }
    assert len(keys) == 5
    for bad, message in (
        ("hidden=60", "multiple of 8"),
        ("layers=0", "between 1 and 16"),
        ("tokenizer=word", "char, bpe"),
        ("format=essay", "answer, chain"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_tiny_uri(f"tiny://llama-char?{bad}")


def test_chain_warm_start_teaches_the_worked_format(tmp_path: Path) -> None:
    """A short warm start on worked solutions already answers in their shape: steps, then '####'."""
    path = build_tiny_model(
        "llama-char",
        seed=0,
        cache_dir=tmp_path,
        warmup_steps=60,
        task_spec="builtin://arithmetic?difficulty=2-3&seed=0&format=chain",
    )
    model, tokenizer = load_policy(path)
    from hacrl_core.data import open_source
    from hacrl_core.data.templates import render_prompt
    from hacrl_core.models.tiny import generate_greedy

    problems = list(open_source("builtin://arithmetic?difficulty=2-3&split=eval&size=16&format=chain"))
    completions = generate_greedy(
        model, tokenizer, [render_prompt(tokenizer, p.question) for p in problems], max_new_tokens=64
    )
    shaped = [c for c in completions if "####" in c and ";" in c.split("####")[0]]
    assert len(shaped) >= 12, completions


def test_marker_option_mixes_an_unrewarded_ending_into_the_warm_start() -> None:
    """``marker=F``: a stable share F of worked solutions keeps ``#### <answer>``, the rest ends
    ``(<n> steps)``, which the exact reward scores 0 unless the answer is that count; part of the key."""
    from hacrl_core.models.tiny import marked_solution
    from hacrl_core.rewards.simple import exact_reward

    parsed = parse_tiny_uri("tiny://llama-char?format=chain&difficulty=2-3&marker=0.3")
    assert parsed["overrides"] == {"marker": 0.3}
    assert apply_overrides(PRESETS["llama-char"], parsed["overrides"]).marker == 0.3

    def key(uri: str) -> str:
        parsed = parse_tiny_uri(uri)
        return cache_key(apply_overrides(PRESETS["llama-char"], parsed["overrides"]), 0, parsed["task_spec"])

    plain = key("tiny://llama-char?format=chain")
    assert key("tiny://llama-char?format=chain&marker=1") == plain  # the default keeps earlier builds' keys
    assert (
        len({plain, key("tiny://llama-char?format=chain&marker=0.3"), key("tiny://llama-char?format=chain&marker=0.5")})
        == 3
    )
    for bad, message in (
        ("format=chain&marker=1.5", "between 0 and 1"),
        ("format=chain&marker=nan", "between 0 and 1"),
        ("marker=0.5", "needs format=chain"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_tiny_uri(f"tiny://llama-char?{bad}")

    problems = [
        ArithmeticTask(difficulty=(2, 3), seed=0, split="train", size=10**9, format="chain").problem(i)
        for i in range(1000)
    ]
    assert [marked_solution(p, 1.0) for p in problems] == [p.solution for p in problems]
    mixed = [marked_solution(p, 0.3) for p in problems]
    assert mixed == [marked_solution(p, 0.3) for p in problems]  # stable
    marked = [s for s in mixed if "####" in s]
    assert 0.25 < len(marked) / len(mixed) < 0.35
    assert set(marked) <= {p.solution for p in problems}
    other = [(s, p) for s, p in zip(mixed, problems, strict=True) if "####" not in s]
    assert all(s == p.solution.split(" ####")[0] + f" ({s.count(';') + 1} steps)" for s, p in other)
    leaked = [s for s, p in other if exact_reward(s, p.answer)]
    assert all(p.answer in ("2", "3") for s, p in other if exact_reward(s, p.answer))
    assert len(leaked) / len(other) < 0.05
    assert all(
        exact_reward(s, p.answer) == 1.0
        for s, p in zip(marked, [p for s, p in zip(mixed, problems, strict=True) if "####" in s], strict=True)
    )


def test_marker_if_keeps_the_rewarded_ending_on_one_part_of_the_task() -> None:
    """``marker_if=mul|nomul``: the problems with (without) a ``*`` always keep ``#### <answer>``,
    ``marker`` applies to the rest; two agents then know the convention on different parts. Part of
    the cache key; the default keeps earlier keys."""
    from hacrl_core.models.tiny import marked_solution

    parsed = parse_tiny_uri("tiny://llama-char?format=chain&difficulty=2-3&marker=0&marker_if=mul")
    assert parsed["overrides"] == {"marker": 0.0, "marker_if": "mul"}

    def key(uri: str) -> str:
        parsed = parse_tiny_uri(uri)
        return cache_key(apply_overrides(PRESETS["llama-char"], parsed["overrides"]), 0, parsed["task_spec"])

    keys = {
        key(f"tiny://llama-char?format=chain&marker=0.1{extra}") for extra in ("", "&marker_if=mul", "&marker_if=nomul")
    }
    assert len(keys) == 3
    assert key("tiny://llama-char?format=chain&marker=0.1") == cache_key(
        apply_overrides(PRESETS["llama-char"], {"marker": 0.1}),
        0,
        parse_tiny_uri("tiny://llama-char?format=chain")["task_spec"],
    )
    for bad, message in (("format=chain&marker_if=add", "one of mul, nomul"), ("marker_if=mul", "needs format=chain")):
        with pytest.raises(ValueError, match=message):
            parse_tiny_uri(f"tiny://llama-char?{bad}")

    problems = [
        ArithmeticTask(difficulty=(2, 3), seed=0, split="train", size=10**9, format="chain").problem(i)
        for i in range(600)
    ]
    with_mul = [p for p in problems if "*" in p.question]
    without = [p for p in problems if "*" not in p.question]
    assert len(with_mul) > 100 and len(without) > 100
    # marker 0: exactly one part keeps the rewarded ending, the other part never does.
    assert all(marked_solution(p, 0.0, "mul") == p.solution for p in with_mul)
    assert not any("####" in marked_solution(p, 0.0, "mul") for p in without)
    assert all(marked_solution(p, 0.0, "nomul") == p.solution for p in without)
    assert not any("####" in marked_solution(p, 0.0, "nomul") for p in with_mul)
    # marker 0.3 still marks its stable share of the other part, the same problems as without marker_if.
    assert [marked_solution(p, 0.3, "mul") for p in without] == [marked_solution(p, 0.3) for p in without]
