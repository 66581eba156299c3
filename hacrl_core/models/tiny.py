"""Tiny offline models (``tiny://<preset>``) with a short supervised warm start.

Each preset fixes an architecture, a size and a tokenizer; presets differ in all three so that a
two-agent experiment is heterogeneous in the ways HACPO cares about (docs/architecture.md, "The parts"):

- ``llama-char``: Llama, character tokenizer, hidden 128, 3 layers, 4 heads (2 kv), 0.60M params;
- ``qwen2-bpe``: Qwen2, byte-level BPE (384), hidden 96, 4 layers, 4 heads (2 kv), 0.37M params.

Default warm starts (seed 0, difficulty 1-3, greedy on the ``EVAL_PROBLEMS`` = 100 held-out
problems the build record scores, 2 CPU threads):
``llama-char`` 400 steps, 20-26 s, accuracy about 0.21 (0.37 / 0.14 / 0.06 at difficulty
1 / 2 / 3); ``qwen2-bpe`` 300 steps, about 13 s, accuracy about 0.26 (0.43 / 0.22 / 0.06).

``build_tiny_model`` initialises the model from ``seed`` and then trains it for ``warmup_steps``
steps with teacher forcing on ``prompt + gold answer + EOS`` of the built-in arithmetic task (loss
on the answer and EOS only), so that greedy accuracy on the held-out split starts clearly above 0
and well below 100%: RL then has signal. More steps make a stronger agent, fewer a weaker one.

The result is saved (safetensors, config, tokenizer, ``hacrl_tiny.json`` with the build record)
under ``cache_dir/<key>/`` where ``key`` hashes every input of the build, written to a temporary
directory and renamed into place, so concurrent builders never expose a partial model; a later
call with the same inputs returns the cached directory without building. Builders on one machine
take a lock file (``cache_dir/.<key>.lock``) so that only one of them builds.

Same inputs, same weights: the build seeds every random draw, runs on CPU with a fixed number of
threads (``BUILD_THREADS``) and restores the caller's RNG state and thread count afterwards.
Bit-identical results across different CPUs or torch versions are not promised (the key includes
the torch version); to share one initial model between machines, distribute the built directory.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from filelock import FileLock

from hacrl_core.data.arithmetic import ANSWER_MARKER, ArithmeticTask
from hacrl_core.data.base import Problem
from hacrl_core.data.datasets import parse_range
from hacrl_core.data.templates import ARITHMETIC_TEMPLATE, render_prompt
from hacrl_core.models.directories import build_once
from hacrl_core.models.encoding import encode_prompt, encode_text
from hacrl_core.models.tiny_uri import (  # noqa: F401  (the names importers of this module use)
    EVAL_NEW_TOKENS,
    MARKER_IF,
    PRESETS,
    URI_PARAMS,
    TinyPreset,
    apply_overrides,
    get_preset,
    parse_tiny_uri,
    preset_overrides,
)
from hacrl_core.models.tokenizers import build_bpe_tokenizer, build_char_tokenizer
from hacrl_core.uri import uri_query

#: Bump when a change to this module changes what a build produces (invalidates caches).
BUILD_VERSION = 1
BUILD_THREADS = 2
METADATA_FILE = "hacrl_tiny.json"
DEFAULT_TASK = "builtin://arithmetic?difficulty=1-3&seed=0"
#: Held-out problems scored after the warm start (recorded in the build record).
EVAL_PROBLEMS = 100
BPE_CORPUS_PROBLEMS = 2000


def _task(task_spec: str, split: str) -> ArithmeticTask:
    parsed = urlparse(task_spec)
    if parsed.scheme != "builtin" or parsed.netloc != "arithmetic":
        raise ValueError(f"tiny models warm-start on builtin://arithmetic only, got {task_spec!r}")
    query = uri_query(parsed.query, ("difficulty", "seed", "format"), repr(task_spec))
    return ArithmeticTask(
        difficulty=parse_range(query.get("difficulty", "1-3")),
        seed=int(query.get("seed", "0")),
        split=split,
        size=10**9,
        format=query.get("format", "answer"),
    )


def cache_key(preset: TinyPreset, seed: int, task_spec: str) -> str:
    """Directory name of a build: preset name plus a hash of every input of the build."""
    fields = asdict(preset)
    if fields["marker"] == 1.0:  # the default keeps the keys of builds made before the option
        del fields["marker"]
    if not fields["marker_if"]:  # likewise
        del fields["marker_if"]
    record = {
        "build_version": BUILD_VERSION,
        "preset": fields,
        "seed": seed,
        "task_spec": task_spec,
        "torch": torch.__version__,
    }
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return f"{preset.name}-{digest}"


def build_tiny_model(
    preset: str,
    seed: int = 0,
    cache_dir: str | Path = ".hacrl-cache/models",
    warmup_steps: int | None = None,
    task_spec: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Directory of the tiny model ``preset`` built from ``seed`` (cached; see module docstring).

    Args:
        preset: a name from ``PRESETS``.
        seed: initialisation and data-order seed.
        cache_dir: where builds are kept; created if missing.
        warmup_steps: supervised steps (None: the preset's default; 0: untrained).
        task_spec: ``builtin://arithmetic?difficulty=lo-hi&seed=N[&format=chain]`` to warm-start
            on (default ``DEFAULT_TASK``).
        overrides: ``preset_overrides(...)`` (size, depth, tokenizer).
    """
    spec = apply_overrides(get_preset(preset), overrides or {})
    if warmup_steps is not None:
        spec = replace(spec, warmup_steps=int(warmup_steps))
    task_spec = task_spec or DEFAULT_TASK
    _task(task_spec, "train")  # validate before doing anything
    cache_dir = Path(cache_dir)
    target = cache_dir / cache_key(spec, seed, task_spec)
    if (target / METADATA_FILE).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Processes on one machine (an agent's rollout and learner workers) wait for one build
    # instead of each spending the CPU; build_once's rename stays the guarantee across machines.
    with FileLock(cache_dir / f".{target.name}.lock"):
        return build_once(target, lambda directory: _build_into(directory, spec, seed, task_spec), marker=METADATA_FILE)


def _build_into(directory: Path, spec: TinyPreset, seed: int, task_spec: str) -> None:
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            train = _task(task_spec, "train")
            tokenizer = _make_tokenizer(spec, train)
            model = _make_model(spec, tokenizer)
            losses = warm_start(
                model,
                tokenizer,
                train,
                steps=spec.warmup_steps,
                batch_size=spec.batch_size,
                lr=spec.learning_rate,
                seed=seed,
                marker=spec.marker,
                marker_if=spec.marker_if,
            )
            trained_s = time.perf_counter() - started
            held_out = _task(task_spec, "eval")
            eval_problems = [held_out.problem(i) for i in range(EVAL_PROBLEMS)]
            accuracy = greedy_accuracy(model, tokenizer, eval_problems, max_new_tokens=EVAL_NEW_TOKENS[held_out.format])
    finally:
        torch.set_num_threads(threads)
    from hacrl_core.models.loading import save_pretrained_quietly

    save_pretrained_quietly(model, tokenizer, directory)
    record = {
        "preset": asdict(spec),
        "seed": seed,
        "task_spec": task_spec,
        "build_version": BUILD_VERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": losses[-1] if losses else None,
        "eval_accuracy": accuracy,
        "eval_problems": len(eval_problems),
        "warm_start_seconds": round(trained_s, 2),
        "build_seconds": round(time.perf_counter() - started, 2),
        "torch": torch.__version__,
    }
    (directory / METADATA_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _make_tokenizer(spec: TinyPreset, train: ArithmeticTask) -> Any:
    if spec.tokenizer == "char":
        return build_char_tokenizer()
    if spec.tokenizer == "bpe":
        corpus = [
            f"{p.question}{p.solution or p.answer}" for p in (train.problem(i) for i in range(BPE_CORPUS_PROBLEMS))
        ]
        return build_bpe_tokenizer(corpus, vocab_size=spec.bpe_vocab_size)
    raise ValueError(f"preset {spec.name}: unknown tokenizer kind {spec.tokenizer!r}; valid: char, bpe")


def _make_model(spec: TinyPreset, tokenizer: Any) -> torch.nn.Module:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model: torch.nn.Module
    if spec.architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif spec.architecture == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(f"preset {spec.name}: unknown architecture {spec.architecture!r}; valid: llama, qwen2")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def marked_solution(problem: Problem, marker: float, marker_if: str = "") -> str:
    """``problem``'s warm-start target: its solution, or, for a stable share ``1 - marker`` of
    worked solutions (chosen by a hash of the question), the chain ending ``(<n> steps)`` instead
    of ``#### <answer>``. With ``marker_if`` (``MARKER_IF``), the problems of that part always keep
    their solution.

    The other ending is unrewarded by ``extract_answer``: no ``####``, no ``answer is``, and its
    last number is the count of steps, so only an answer equal to that count (2 or 3 at difficulty
    2-3) still scores.
    """
    solution = problem.solution or problem.answer
    chain, found, _ = solution.rpartition(f" {ANSWER_MARKER} ")
    if marker >= 1.0 or not found or (marker_if and MARKER_IF[marker_if](problem.question)):
        return solution
    share = int.from_bytes(hashlib.sha256(problem.question.encode("utf-8")).digest()[:2], "big") / 65536
    if share < marker:
        return solution
    return f"{chain} ({chain.count(';') + 1} steps)"


def supervised_rows(
    tokenizer: Any,
    problems: Sequence[Problem],
    template: str = ARITHMETIC_TEMPLATE,
    marker: float = 1.0,
    marker_if: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, labels)`` of ``prompt + solution + EOS`` (the
    worked solution where the problem has one, else the answer; ``marker`` < 1: ``marked_solution``).

    ``labels`` is -100 on prompt and padding, so the loss covers the solution and EOS only.
    """
    rows = []
    for problem in problems:
        prompt = encode_prompt(tokenizer, render_prompt(tokenizer, problem.question, template))
        answer = encode_text(tokenizer, marked_solution(problem, marker, marker_if)) + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for index, (ids, target) in enumerate(rows):
        input_ids[index, : len(ids)] = torch.tensor(ids)
        attention_mask[index, : len(ids)] = 1
        labels[index, : len(ids)] = torch.tensor(target)
    return input_ids, attention_mask, labels


def warm_start(
    model: torch.nn.Module,
    tokenizer: Any,
    task: ArithmeticTask,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    marker: float = 1.0,
    marker_if: str = "",
) -> list[float]:
    """Teacher-forced training on the task's train split; returns the loss of every step.

    AdamW (betas 0.9/0.98, no weight decay), linear warm-up over the first 10% of steps then
    cosine decay to 10% of ``lr``, gradient norm clipped to 1.0. Batch ``s`` holds problems
    ``seed * 10**6 + s * batch_size + i`` of the split, so the data order follows ``seed`` too.
    """
    if steps == 0:
        return []
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, steps // 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    offset = seed * 10**6
    losses = []
    for step in range(steps):
        problems = [task.problem(offset + step * batch_size + i) for i in range(batch_size)]
        input_ids, attention_mask, labels = supervised_rows(tokenizer, problems, marker=marker, marker_if=marker_if)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def generate_greedy(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = 8) -> list[str]:
    """Greedy completions (text, special tokens removed) of rendered ``prompts``, left-padded batch."""
    encoded = [encode_prompt(tokenizer, prompt) for prompt in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], dtype=torch.long)
    was_training = model.training
    model.eval()
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.train(was_training)
    return tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)


def greedy_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    problems: Sequence[Problem],
    template: str = ARITHMETIC_TEMPLATE,
    *,
    max_new_tokens: int = 8,
) -> float:
    """Share of ``problems`` whose greedy completion the ``exact`` reward accepts."""
    from hacrl_core.rewards.simple import exact_reward

    prompts = [render_prompt(tokenizer, problem.question, template) for problem in problems]
    completions = generate_greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    return sum(exact_reward(text, problem.answer) for text, problem in zip(completions, problems, strict=True)) / len(
        problems
    )


def read_build_record(path: str | Path) -> dict[str, Any]:
    """The ``hacrl_tiny.json`` build record of a tiny model directory."""
    return json.loads((Path(path) / METADATA_FILE).read_text())
