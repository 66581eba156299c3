"""A peer, side by side: TRL's GRPOTrainer against `hacrl run` on the same tiny model, by phase.

What a single-agent RL user would otherwise run is TRL. Both sides train the same tiny Qwen2
(``tiny://qwen2-bpe``, hidden 128, 3 layers, byte-level BPE), on the same prompts in the same order
(the built-in arithmetic task rendered with our template), with the same group size, completion
budget, prompts per optimizer step, learning rate, no KL, the `exact` reward, temperature 1, on the
CPU, each side with its defaults otherwise.

Setups (``--setups``): ``templated`` is the above (the arithmetic question in the model's chat
template: about 8 prompt tokens); ``raw`` is issue 42's second side-by-side, as a new user would
try it: the same architecture and byte-level BPE tokenizer of 384 tokens trained on the task's
text, but its chat template removed (a copy of the model folder), so both sides see the prompt
``What is a+b=`` given raw. ``--prompt-tokens`` (e.g. ``8,16,64``) lengthens the prompt of
either setup to about that many tokens with a fixed instruction before the question (the same
text on both sides: the shortest prefix, in characters, of the repeated instruction whose mean prompt length
reaches the target on the first step's prompts); unset, each setup's own prompt. Setups and prompt lengths are measured in turn,
the configurations interleaved within each.

Lengths (``--lengths``): ``2`` is the warm-started model with a 16-token budget (it answers in about
2 tokens, so fixed per-step costs decide); 16, 64, 256 are the same architecture untrained (random
init, ``warmup_steps=0``), which rarely samples its eos, so completions fill most of the budget
(the mean length of each side is reported).

Configurations (``--configs``), interleaved per length (trl, ours, ..., trl, ours, ...) so that
machine load hits all alike:

- ``trl``: ``trl.GRPOTrainer`` (pinned version, installed by this script into its own virtual
  environment, never a dependency of ours), one process, torch on every CPU.
- ``colocated`` (`hacrl run --colocate`), ``split`` (a rollout and a learner worker, on-policy),
  ``stale1`` (split, ``maxStaleness: 1``): one agent, GRPO, a file store.
- ``colocated-2``, ``split-2``, ``stale1-2``: two agents (the same model twice), HACPO.
- a suffix ``@ACTIVE`` or ``@PASSIVE`` sets ``OMP_WAIT_POLICY`` for that run (``trl@PASSIVE`` too);
  without one it is unset, so TRL gets libgomp's default and `hacrl run` its own choice
  (``hacrl_core/runtime/cpus.py``).

Per configuration: the median step time in steady state (steps after the first two) and the median
of each phase: generate, reward, train (pi_old scoring, forward, backward, optimizer), store (our
rollout write and weight publish; TRL has none) and other (the rest of the step: advantages,
batching, logging). TRL's phases are timed around its own methods (``_generate``,
``_calculate_rewards``, ``_get_per_token_logps_and_entropies`` without grad, ``compute_loss``, the
optimizer callbacks); ours are the workers' stage clocks (``learner/seconds_*``,
``rollout/seconds_*``), which cover the whole step loop including its waits. Ratio = TRL's step
time / ours (> 1: faster than TRL). As a cross-check of the stage clocks, ours is also taken from
the wall clock between consecutive steps (the modification times of the store's per-step metrics
objects, written once each step ends; ``wall s/step`` and ``vs TRL (wall)``; TRL's step time is
already the wall clock between its ``on_step_end`` callbacks). Start-up is excluded and reported apart as wall time.

Every run records the load average (``os.getloadavg()``) before and after it; a run whose 1-minute
load exceeded the CPU count (the run itself accounts for at most that) is flagged ``loaded``.

    python bench/peer_trl.py --lengths 16,64,256 --reps 2   # the tables of docs/benchmarks.md section 7
    python bench/peer_trl.py --quick                        # 3 steps, 16 tokens, trl and colocated
    python bench/peer_trl.py --setups templated,raw --prompt-tokens 8,16,64 --lengths 16 --reps 3 \
        --configs trl@PASSIVE,colocated@PASSIVE,stale1@PASSIVE   # issue 42's table (section 7)
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
    REPO,
    RESULTS,
    bench_env,
    build_models,
    experiment,
    hacrl_run,
    save,
    table,
    write_spec,
)

TRL_VERSION = "1.16.0"
TRAINED = "tiny://qwen2-bpe?seed=0&hidden=128&layers=3"
UNTRAINED = TRAINED + "&warmup_steps=0"
#: The warm-started model's case: it answers in about 2 tokens within this budget.
ANSWER_LENGTH, ANSWER_BUDGET = 2, 16


@dataclass(frozen=True)
class Placement:
    algorithm: str
    agents: int
    staleness: int
    colocated: bool


PLACEMENTS = {
    "colocated": Placement("grpo", 1, 0, True),
    "split": Placement("grpo", 1, 0, False),
    "stale1": Placement("grpo", 1, 1, False),
    "colocated-2": Placement("hacpo", 2, 0, True),
    "split-2": Placement("hacpo", 2, 0, False),
    "stale1-2": Placement("hacpo", 2, 1, False),
}
POLICIES = ("ACTIVE", "PASSIVE")
DEFAULT_CONFIGS = "trl,colocated,split,stale1"
PHASES = ("generate", "reward", "train", "store", "other")
WARM_STEPS = 2  # steps left out of the steady state (first sampling, lazy allocations)
SETUPS = ("templated", "raw")
#: The raw setup's prompt, as issue 42's side-by-side wrote it (the built-in questions end in ``=``).
RAW_TEMPLATE = "What is {question}"
#: Before the question, cut to lengthen a prompt to ``--prompt-tokens`` (repeated as needed).
FILLER = "Add the numbers and give only the result. "


def parse_config(name: str) -> tuple[str, str | None]:
    """``colocated@ACTIVE`` -> (``colocated``, ``ACTIVE``); a clear error for anything else."""
    base, _, policy = name.partition("@")
    if base != "trl" and base not in PLACEMENTS:
        raise SystemExit(
            f"--configs: unknown {base!r}; valid: trl, {', '.join(PLACEMENTS)} (each with an optional @ACTIVE or @PASSIVE)"
        )
    if policy and policy not in POLICIES:
        raise SystemExit(f"--configs: {name!r}: the suffix must be @ACTIVE or @PASSIVE")
    return base, policy or None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="3 steps, 1 repetition, 16 tokens, trl and colocated (the smoke test)"
    )
    p.add_argument("--steps", type=int, default=12)
    p.add_argument(
        "--prompts", type=int, default=16, help="prompts per step (one optimizer update per step on both sides)"
    )
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--lengths",
        default="2,16,64,256",
        help=f"completion budgets; {ANSWER_LENGTH}: the warm-started model "
        f"(about {ANSWER_LENGTH}-token answers in a {ANSWER_BUDGET}-token budget)",
    )
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument(
        "--setups", default="templated", help=f"comma-separated: {', '.join(SETUPS)} (see the module docstring)"
    )
    p.add_argument(
        "--prompt-tokens",
        default="",
        help="comma-separated prompt lengths in tokens (about; e.g. 8,16,64); unset: each setup's own prompt",
    )
    p.add_argument("--reps", type=int, default=2)
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help="comma-separated: trl, "
        + ", ".join(PLACEMENTS)
        + "; each with an optional @ACTIVE or @PASSIVE (OMP_WAIT_POLICY)",
    )
    p.add_argument("--trl-version", default=TRL_VERSION)
    p.add_argument(
        "--venv",
        type=Path,
        default=Path("/tmp/hacrl-bench/trl-venv"),
        help="TRL's own virtual environment (created if missing)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/peer-trl"))
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default=None, help="result file name (default peer_trl, or peer_trl-quick)")
    p.add_argument(
        "--sampling", action="store_true", help="instead: our hf engine's generate against TRL's on one step's batch"
    )
    p.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--sampling-child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.reps, args.lengths, args.configs = 3, 1, "16", "trl,colocated"
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--lengths: comma-separated token counts, got {args.lengths!r}") from None
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in args.setups if s not in SETUPS]
    if unknown or not args.setups:
        raise SystemExit(f"--setups: unknown {unknown}; valid: {', '.join(SETUPS)}")
    try:
        args.prompt_tokens = [int(x) for x in args.prompt_tokens.split(",") if x.strip()] or [None]
    except ValueError:
        raise SystemExit(f"--prompt-tokens: comma-separated token counts, got {args.prompt_tokens!r}") from None
    for config in args.configs:
        parse_config(config)
    return args


def case(length: int) -> tuple[str, int]:
    """(model, maxNewTokens) of a length: the warm-started model for the answer case, else untrained."""
    return (TRAINED, ANSWER_BUDGET) if length == ANSWER_LENGTH else (UNTRAINED, length)


def raw_model(model_dir: Path) -> Path:
    """A copy of a tiny model's folder without its chat template (the raw setup): prompts are then
    given as plain text on both sides (``render_prompt`` and TRL's non-conversational path)."""
    raw = model_dir.parent / f"{model_dir.name}-raw"
    if not (raw / "config.json").exists():
        shutil.rmtree(raw, ignore_errors=True)
        shutil.copytree(model_dir, raw, ignore=shutil.ignore_patterns("chat_template.jinja"))
        config_path = raw / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config.pop("chat_template", None)
        config_path.write_text(json.dumps(config, indent=2))
    return raw


def prompt_template(model_dir: Path, setup: str, target: int | None, questions: list[str]) -> tuple[str, float]:
    """The data template of a setup lengthened to about ``target`` prompt tokens (None: as it
    is), and the mean prompt length it gives on ``questions``, in ``model_dir``'s tokenizer."""
    from transformers import AutoTokenizer

    from hacrl_core.data.templates import ARITHMETIC_TEMPLATE, render_prompt
    from hacrl_core.models.encoding import encode_prompts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = RAW_TEMPLATE if setup == "raw" else ARITHMETIC_TEMPLATE

    def mean_tokens(template: str) -> float:
        ids = encode_prompts(tokenizer, [render_prompt(tokenizer, q, template) for q in questions])
        return statistics.fmean(len(i) for i in ids)

    template, filler = base, FILLER * 64
    for cut in range(1, len(filler)):  # a character at a time: a word of this tokenizer is several tokens
        if target is None or mean_tokens(template) >= target - 0.5:
            break
        template = filler[:cut].strip() + " " + base
    return template, mean_tokens(template)


# --------------------------------------------------------------------------- TRL, in its own venv


def trl_python(venv: Path, version: str) -> Path:
    """The interpreter of a virtual environment holding torch 2.13.0 and TRL ``version``."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import trl, sys; sys.exit(trl.__version__ != {version!r})"]
    if python.exists() and subprocess.run(check, capture_output=True, check=False).returncode == 0:
        return python
    print(f"installing trl=={version} into {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"trl=={version}"], check=True)
    subprocess.run(check, check=True)
    return python


def trl_child(config_path: Path) -> int:
    """Runs inside TRL's venv: GRPOTrainer on the prompts file; prints one JSON line per step with
    the step's seconds and its phases, each timed around the trainer's own method for it."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hacrl_core.rewards.simple import exact_reward  # standard library only: the same verifier

    cfg = json.loads(config_path.read_text())
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    rows = [json.loads(line) for line in Path(cfg["prompts"]).read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], torch_dtype=torch.float32)

    def reward(completions, answer, **_):
        return [exact_reward(text, gold) for text, gold in zip(completions, answer)]

    batch = cfg["prompts_per_step"] * cfg["group_size"]
    options = dict(
        output_dir=cfg["output"],
        max_steps=cfg["steps"],
        learning_rate=cfg["lr"],
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=cfg["group_size"],
        max_completion_length=cfg["max_new_tokens"],
        temperature=1.0,
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        shuffle_dataset=False,
    )
    known = set(GRPOConfig.__dataclass_fields__)
    config = GRPOConfig(**{k: v for k, v in options.items() if k in known})
    phases: dict[str, float] = collections.defaultdict(float)

    def timed(name, method, grad: bool | None = None):
        """``method`` with its seconds added to ``phases[name]`` (only the calls with grad on or
        off, when ``grad`` says which: the same log-prob method scores pi_old and computes the loss)."""

        def wrapper(*a, **k):
            if grad is not None and torch.is_grad_enabled() != grad:
                return method(*a, **k)
            began = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                phases[name] += time.perf_counter() - began

        return wrapper

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.last = time.perf_counter()
            self.pending: dict | None = None

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.optimizer_began = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            phases["optimizer"] += time.perf_counter() - self.optimizer_began

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.pending = {"step": state.global_step - 1, "seconds": now - self.last, **phases}
            phases.clear()
            self.last = now

        def on_log(self, args, state, control, logs=None, **kwargs):
            # The step's log follows its on_step_end: it carries the step's mean completion length.
            if self.pending is not None and logs and "completions/mean_length" in logs:
                self.pending["tokens"] = logs["completions/mean_length"] * batch
                print("STEP " + json.dumps(self.pending), flush=True)
                self.pending = None

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
        callbacks=[StepClock()],
    )
    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed("score", trainer._get_per_token_logps_and_entropies, grad=False)
    trainer._generate_and_score_completions = timed("prepare", trainer._generate_and_score_completions)
    trainer.compute_loss = timed("forward", trainer.compute_loss)
    trainer.training_step = timed("training_step", trainer.training_step)
    trainer.train()
    return 0


def sampling_child(config_path: Path) -> int:
    """Runs inside TRL's venv: one step's batch sampled by TRL's ``_generate`` (each prompt repeated
    G times, its GenerationConfig) and by our hf engine (``num_return_sequences`` G, one seed per
    call) on the same model object, interleaved; ours also without its seeding. Prints one JSON line."""
    import timeit

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from hacrl_core.rollout.engine import SamplingParams
    from hacrl_core.rollout.hf_engine import HFEngine

    cfg = json.loads(config_path.read_text())
    torch.set_num_threads(cfg["threads"])
    rows = [json.loads(line) for line in Path(cfg["prompts"]).read_text().splitlines()][: cfg["prompts_per_step"]]
    prompts = [r["prompt"] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], torch_dtype=torch.float32)
    g = cfg["group_size"]
    config = GRPOConfig(
        output_dir=cfg["output"],
        per_device_train_batch_size=len(prompts) * g,
        num_generations=g,
        max_completion_length=cfg["max_new_tokens"],
        temperature=1.0,
        beta=0.0,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list(rows),
    )
    engine = HFEngine(batch_size=64)
    engine.set_policy(trainer.model, tokenizer)
    params = SamplingParams(n=g, temperature=1.0, top_p=1.0, max_new_tokens=cfg["max_new_tokens"], seed=12345)
    seed = torch.manual_seed

    def trl() -> int:
        trainer.model.train()  # as in a training step
        return sum(len(c) for c in trainer._generate([p for p in prompts for _ in range(g)])[1])

    def ours() -> int:
        return sum(len(s.token_ids) for group in engine.generate(prompts, params) for s in group)

    def ours_unseeded() -> int:
        torch.manual_seed = lambda _: None  # the engine's one seeding call per generate batch
        try:
            return ours()
        finally:
            torch.manual_seed = seed

    sides = {"trl": trl, "ours": ours, "ours_unseeded": ours_unseeded}
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, list[int]] = {k: [] for k in sides}
    for _ in range(cfg["reps"]):
        for name, side in sides.items():
            began = time.perf_counter()
            tokens[name].append(side())
            seconds[name].append(time.perf_counter() - began)
    seed_us = (
        min(timeit.repeat(lambda: torch.manual_seed(1), number=1000, repeat=5)) * 1000
    )  # us per call (1000 calls / 1e-6 s)
    print("SAMPLING " + json.dumps({"seconds": seconds, "tokens": tokens, "manual_seed_us": seed_us}), flush=True)
    return 0


def run_sampling(
    python: Path, model_dir: Path, prompts: Path, args: argparse.Namespace, workdir: Path, max_new_tokens: int
) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model": str(model_dir),
        "prompts": str(prompts),
        "group_size": args.group_size,
        "prompts_per_step": args.prompts,
        "max_new_tokens": max_new_tokens,
        "output": str(workdir / "out"),
        "threads": len(os.sched_getaffinity(0)),
        "reps": max(3, args.reps),
    }
    config_path = workdir / "sampling.json"
    config_path.write_text(json.dumps(cfg))
    env = run_env(args, "PASSIVE", {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    done = subprocess.run(
        [str(python), "-P", __file__, "--sampling-child", str(config_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(
            f"sampling comparison failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SAMPLING "))[9:])


def sampling_main(args: argparse.Namespace, python: Path, began: float) -> int:
    """``--sampling``: item by item, what our generate does differently from TRL's, timed on one step's batch."""
    from hacrl_core.models.uri import resolve_model

    rows, results = [], {}
    for length in args.lengths:
        model, budget = case(length)
        model_dir = resolve_model(model, args.cache.resolve() / "models")
        before = os.getloadavg()
        result = run_sampling(
            python, model_dir, prompts_file(args, model, model_dir), args, args.work / f"sampling-{length}", budget
        )
        result["load"] = [before, os.getloadavg()]
        results[str(length)] = result
        med = {k: statistics.median(v) for k, v in result["seconds"].items()}
        toks = {k: statistics.median(v) / (args.prompts * args.group_size) for k, v in result["tokens"].items()}
        rows.append(
            [
                length,
                f"{med['trl']:.3f}",
                f"{med['ours']:.3f}",
                f"{med['ours_unseeded']:.3f}",
                f"{med['trl'] / med['ours']:.2f}",
                f"{toks['trl']:.1f} / {toks['ours']:.1f}",
                f"{result['manual_seed_us']:.1f}",
                f"{before[0]:.1f}-{result['load'][1][0]:.1f}",
            ]
        )
    text = table(
        [
            "length",
            "TRL _generate s",
            "ours s",
            "ours unseeded s",
            "TRL / ours",
            "tokens/completion TRL / ours",
            "manual_seed us",
            "load 1-min",
        ],
        rows,
    )
    print(
        f"\nsampling, one step's batch ({args.prompts} prompts x G {args.group_size}), same model object, OMP_WAIT_POLICY=PASSIVE, "
        f"median of {max(3, args.reps)} interleaved reps\n{text}"
    )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        args.name or "peer_trl-sampling",
        {"settings": settings, "table": text, "results": results, "total_seconds": time.perf_counter() - began},
        args.out,
    )
    print(f"wrote {path}")
    return 0


def run_trl(
    python: Path,
    model_dir: Path,
    prompts: Path,
    args: argparse.Namespace,
    workdir: Path,
    max_new_tokens: int,
    policy: str | None,
) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model": str(model_dir),
        "prompts": str(prompts),
        "steps": args.steps,
        "lr": args.lr,
        "group_size": args.group_size,
        "prompts_per_step": args.prompts,
        "max_new_tokens": max_new_tokens,
        "output": str(workdir / "out"),
        "threads": len(os.sched_getaffinity(0)),
    }
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(cfg))
    env = run_env(args, policy, {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    began = time.perf_counter()
    # -P: bench/ must not lead sys.path, its operator.py would shadow the standard library's.
    done = subprocess.run(
        [str(python), "-P", __file__, "--trl-child", str(config_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - began
    if done.returncode:
        raise RuntimeError(f"TRL run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    steps = []
    for line in done.stdout.splitlines():
        if line.startswith("STEP "):
            s = json.loads(line[5:])
            t = collections.defaultdict(float, s)
            backward = (
                t["training_step"] - t["prepare"] - t["forward"]
            )  # prepare (generate, reward, score) runs inside training_step
            train = t["score"] + t["forward"] + backward + t["optimizer"]
            phases = {"generate": t["generate"], "reward": t["reward"], "train": train, "store": 0.0}
            phases["other"] = s["seconds"] - sum(phases.values())
            steps.append(
                {
                    "step": s["step"],
                    "seconds": s["seconds"],
                    "wall_seconds": s["seconds"],  # TRL's step clock is the wall clock between on_step_end callbacks
                    "tokens": s.get("tokens"),
                    "phases": phases,
                    "train_detail": {
                        "score": t["score"],
                        "forward": t["forward"],
                        "backward": backward,
                        "optimizer": t["optimizer"],
                    },
                }
            )
    return {"wall": wall, "steps": steps}


# --------------------------------------------------------------------------- ours


def run_env(args: argparse.Namespace, policy: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one run: ``OMP_WAIT_POLICY`` as the configuration names it, or unset so
    that each side chooses as it would for a user (libgomp's default for TRL, `hacrl run`'s own rule)."""
    env = bench_env(args.cache.resolve(), extra)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    return env


def agent_entry(name: str, model: str, args: argparse.Namespace, max_new_tokens: int) -> dict:
    """An agent with the spec's defaults (micro-batches, rollout batch) but the benchmark's lr and length."""
    return {"name": name, "model": model, "rollout": {"maxNewTokens": max_new_tokens}, "learner": {"lr": args.lr}}


def run_ours(
    placement: Placement,
    args: argparse.Namespace,
    name: str,
    model: str,
    max_new_tokens: int,
    policy: str | None,
    template: str | None = None,
) -> dict:
    from hacrl_core.store import open_trajectory_store

    store_dir = args.work / "store"
    agents = [agent_entry(f"a{i}", model, args, max_new_tokens) for i in range(placement.agents)]
    doc = experiment(
        name,
        agents,
        {
            "name": placement.algorithm,
            "groupSize": args.group_size,
            "promptsPerStep": args.prompts,
            "miniBatchPrompts": args.prompts,
            "steps": args.steps,
            "seed": 0,
            "maxStaleness": placement.staleness,
        },
        store_uri=f"file://{store_dir}",
        eval_prompts=0,
    )
    if template:
        doc["spec"]["data"]["template"] = template
    spec_path = write_spec(doc, args.work / "specs" / f"{name}.yaml")
    wall = hacrl_run(
        spec_path,
        args.work / "workdirs" / name,
        run_env(args, policy),
        args=["--colocate" if placement.colocated else "--split"],
    )
    store = open_trajectory_store(f"file://{store_dir}", name)
    ended = metrics_times(store_dir / name, args.steps, placement.agents)
    steps = []
    for step in range(args.steps):
        per_agent = [store.read_metrics(step, f"a{i}") for i in range(placement.agents)]
        steps.append(
            {
                "step": step,
                "seconds": statistics.fmean(step_seconds(m) for m in per_agent),
                "wall_seconds": ended[step] - ended[step - 1] if step and ended[step] and ended[step - 1] else None,
                "tokens": statistics.fmean(m["learner/trained_tokens"] for m in per_agent),
                "phases": {k: statistics.fmean(phases_of(m)[k] for m in per_agent) for k in PHASES},
            }
        )
    return {"wall": wall, "steps": steps}


def metrics_times(experiment_dir: Path, steps: int, agents: int) -> list[float | None]:
    """When each step ended, by the wall clock: the latest modification time of the step's metrics
    objects in the file store (one per agent, written once the agent's step is done); None where
    missing."""
    times: list[float | None] = []
    for step in range(steps):
        found = [p.stat().st_mtime for p in (experiment_dir / "steps" / f"{step:06d}" / "metrics").glob("*.json")]
        times.append(max(found) if len(found) >= agents else None)
    return times


def step_seconds(m: dict) -> float:
    """The learner's step: every stage of its clock (``learner/seconds_*``), waits included."""
    return sum(v for k, v in m.items() if k.startswith("learner/seconds_"))


def phases_of(m: dict) -> dict[str, float]:
    """One of our steps in TRL's phases, from the learner's metrics. Colocated, the sampling
    stages are the learner's own (``rollout/seconds_*`` in its metrics); split, they run in the
    rollout worker and only their wait shows (in ``score``, which reads the step's rows first).
    ``train`` is score + update: the score stage holds pi_old's no-grad passes and also the first
    update's forward and backward, whose log-probs give pi_old exactly (learner/stages.py), so
    only their sum compares with TRL's (score, forward, backward, optimizer); it also holds the
    read of the step's rows from the store."""
    generate, reward, write = (m.get(f"rollout/seconds_{k}", 0.0) for k in ("generate", "reward", "write"))
    phases = {
        "generate": generate,
        "reward": reward,
        "train": m["learner/seconds_score"] + m["learner/seconds_update"],
        "store": write + m["learner/seconds_publish"],
    }
    phases["other"] = step_seconds(m) - sum(phases.values())
    return phases


# --------------------------------------------------------------------------- report


def probe_spec(args: argparse.Namespace, model: str) -> Any:
    """The spec our workers would run for ``model`` with this benchmark's data settings: what
    draws the steps' problems and renders their prompts."""
    from hacrl_core.spec import parse_experiment

    doc = experiment(
        "probe",
        [agent_entry("a0", model, args, 16)],
        {
            "name": "grpo",
            "groupSize": args.group_size,
            "promptsPerStep": args.prompts,
            "miniBatchPrompts": args.prompts,
            "steps": args.steps,
            "seed": 0,
        },
        store_uri="file:///unused",
        eval_prompts=0,
    )
    return parse_experiment(doc).spec


def step_questions(args: argparse.Namespace, model: str, steps: int | None = None, spec: Any = None) -> list:
    """The problems of the first ``steps`` (all) steps in step order, as our workers draw them."""
    from hacrl_core.context import step_problems
    from hacrl_core.data.report import open_dataset

    spec = spec or probe_spec(args, model)
    source = open_dataset(spec.data, spec.data.train)
    return [
        p for step in range(args.steps if steps is None else steps) for p in step_problems(source, spec.algorithm, step)
    ]


def prompts_file(args: argparse.Namespace, model: str, model_dir: Path, template: str | None = None) -> Path:
    """The prompts of every step in step order, rendered as our rollout worker renders them."""
    from transformers import AutoTokenizer

    from hacrl_core.data.templates import render_prompt

    spec = probe_spec(args, model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lines = [
        json.dumps({"prompt": render_prompt(tokenizer, p.question, template or spec.data.template), "answer": p.answer})
        for p in step_questions(args, model, spec=spec)
    ]
    path = args.work / f"prompts-{model_dir.name}-{zlib.crc32((template or '').encode()):08x}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def steady_steps(run: dict) -> list[dict]:
    return [s for s in run["steps"] if s["step"] >= WARM_STEPS] or run["steps"]


def steady(run: dict) -> float:
    """Median seconds per step after the warm steps."""
    return statistics.median(s["seconds"] for s in steady_steps(run))


def median_of(runs: list[dict], value) -> float:
    """The median over repetitions of each run's median over its steady steps."""
    return statistics.median(statistics.median(value(s) for s in steady_steps(r)) for r in runs)


def measured(run, *, label: str) -> dict:
    """``run()`` with the load average before and after it; ``loaded``: the 1-minute load went over
    the CPU count, which this run alone (at most one busy thread per CPU) cannot cause."""
    before = os.getloadavg()
    record = run()
    after = os.getloadavg()
    cpus = len(os.sched_getaffinity(0))
    record.update(load_before=before, load_after=after, loaded=max(before[0], after[0]) > cpus)
    print(
        f"{label}: {steady(record):.3f} s/step steady, wall {record['wall']:.1f} s, load {before[0]:.2f} -> {after[0]:.2f}"
        + (" (loaded)" if record["loaded"] else ""),
        flush=True,
    )
    return record


def report(length: int, runs: dict[str, list[dict]], args: argparse.Namespace) -> tuple[str, dict]:
    """The table of one length: step time, ratio against TRL, each phase, completion length, load."""
    completions = args.prompts * args.group_size
    trl = next((c for c in runs if parse_config(c)[0] == "trl"), None)  # the first TRL configuration is the baseline
    base = steady_of(runs[trl]) if trl else None
    base_wall = wall_of(runs[trl]) if trl else None
    summary, rows = {}, []
    for config, records in runs.items():
        step_s = steady_of(records)
        wall_s = wall_of(records)
        tokens = median_of(records, lambda s: s["tokens"] if s["tokens"] is not None else float("nan"))
        phases = {k: median_of(records, lambda s, k=k: s["phases"][k]) for k in PHASES}
        loads = [r["load_before"][0] for r in records] + [r["load_after"][0] for r in records]
        ratio = base / step_s if base else float("nan")
        wall_ratio = base_wall / wall_s if base else float("nan")
        summary[config] = {
            "step_seconds": step_s,
            "ratio_vs_trl": ratio,
            "wall_step_seconds": wall_s,
            "wall_ratio_vs_trl": wall_ratio,
            "ratio_per_rep": [steady(t) / steady(r) for t, r in zip(runs[trl], records)] if trl else [],
            "phases": phases,
            "completion_tokens_mean": tokens / completions,
            "trained_tokens_per_second": tokens / step_s,
            "wall_seconds": statistics.median(r["wall"] for r in records),
            "load_min": min(loads),
            "load_max": max(loads),
            "loaded_runs": sum(r["loaded"] for r in records),
        }
        rows.append(
            [
                config,
                f"{step_s:.3f}",
                f"{ratio:.2f}" if base else "-",
                " ".join(f"{r:.2f}" for r in summary[config]["ratio_per_rep"]) or "-",
                f"{wall_s:.3f}",
                f"{wall_ratio:.2f}" if base else "-",
                *(f"{phases[k]:.3f}" for k in PHASES),
                f"{tokens / completions:.1f}",
                f"{tokens / step_s:.0f}",
                f"{min(loads):.1f}-{max(loads):.1f}"
                + (f" ({summary[config]['loaded_runs']} loaded)" if summary[config]["loaded_runs"] else ""),
            ]
        )
    text = table(
        [
            "config",
            "s/step",
            "vs TRL",
            "per rep",
            "wall s/step",
            "vs TRL (wall)",
            *(f"{k} s" for k in PHASES),
            "tokens/completion",
            "trained tok/s",
            "load 1-min",
        ],
        rows,
    )
    if trl:
        detail = {
            k: median_of(runs[trl], lambda s, k=k: s["train_detail"][k])
            for k in ("score", "forward", "backward", "optimizer")
        }
        summary[trl]["train_detail"] = detail
        text += f"\n{trl}'s train phase: " + ", ".join(f"{k} {v:.3f} s" for k, v in detail.items())
    if any(PLACEMENTS[parse_config(c)[0]].colocated is False for c in runs if parse_config(c)[0] != "trl"):
        text += "\nsplit placements: generate and reward run in the rollout worker, beside the learner's stages (their wait shows in train)"
    return text, summary


def steady_of(records: list[dict]) -> float:
    return statistics.median(steady(r) for r in records)


def wall_of(records: list[dict]) -> float:
    """The median over repetitions of the median wall-clock step (between consecutive step ends)."""
    walls = []
    for r in records:
        values = [s["wall_seconds"] for s in steady_steps(r) if s.get("wall_seconds") is not None]
        if values:
            walls.append(statistics.median(values))
    return statistics.median(walls) if walls else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trl_child:
        return trl_child(args.trl_child)
    if args.sampling_child:
        return sampling_child(args.sampling_child)
    began = time.perf_counter()
    # Before torch loads here (the model builds): idle OpenMP threads sleep, as for `hacrl run`'s
    # own builds (docs/benchmarks.md); each run's policy is set apart (run_env).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cache = args.cache.resolve()
    for stale in ("store", "workdirs"):  # runs of an earlier invocation would refuse to start (names repeat)
        shutil.rmtree(args.work / stale, ignore_errors=True)
    models = {length: case(length) for length in args.lengths}
    build_models([m for m, _ in models.values()], cache)
    from hacrl_core.models.uri import resolve_model

    if args.sampling:
        return sampling_main(args, trl_python(args.venv, args.trl_version), began)
    python = trl_python(args.venv, args.trl_version) if any(parse_config(c)[0] == "trl" for c in args.configs) else None
    tables, summaries, all_runs = [], {}, {}
    cases = [(setup, target, length) for setup in args.setups for target in args.prompt_tokens for length in models]
    for setup, target, length in cases:
        model, budget = models[length]
        model_dir = resolve_model(model, cache / "models")
        if setup == "raw":
            model_dir = raw_model(model_dir)
            model = str(model_dir)
        questions = [p.question for p in step_questions(args, model, steps=1)]
        template, prompt_tokens = prompt_template(model_dir, setup, target, questions)
        prompts = prompts_file(args, model, model_dir, template)
        key = f"{setup}-p{target or 'own'}-{length}"
        runs: dict[str, list[dict]] = {c: [] for c in args.configs}
        for rep in range(args.reps):
            for config in args.configs:
                base, policy = parse_config(config)
                # Experiment names are at most 40 characters: the setup by its initial.
                name = f"peer-{setup[0]}{target or ''}-{length}-{base}-{(policy or 'default').lower()}-{rep}"
                if base == "trl":
                    run = functools.partial(run_trl, python, model_dir, prompts, args, args.work / name, budget, policy)
                else:
                    run = functools.partial(run_ours, PLACEMENTS[base], args, name, model, budget, policy, template)
                record = measured(run, label=name)
                runs[config].append(record)
        text, summary = report(length, runs, args)
        title = (
            f"{setup} setup, {prompt_tokens:.1f} prompt tokens, {length} tokens: "
            + (f"warm-started model, {budget}-token budget" if length == ANSWER_LENGTH else "untrained model")
            + f"; {args.prompts} prompts x G {args.group_size}, lr {args.lr}, no KL, {args.steps} steps, median of {args.reps} "
            "interleaved reps"
        )
        print(f"\n{title}\n{text}\n", flush=True)
        tables.append(f"{title}\n{text}")
        summary["_case"] = {
            "setup": setup,
            "prompt_tokens_target": target,
            "prompt_tokens_mean": prompt_tokens,
            "template": template,
        }
        summaries[key], all_runs[key] = summary, runs
        path = save_results(
            args, tables, summaries, all_runs, began
        )  # after every case: a cut-short run keeps its cases
    print(f"wrote {path} ({time.perf_counter() - began:.0f} s)")
    return 0


def save_results(args: argparse.Namespace, tables: list[str], summaries: dict, all_runs: dict, began: float) -> Path:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    name = args.name or ("peer_trl-quick" if args.quick else "peer_trl")
    return save(
        name,
        {
            "settings": settings,
            "table": "\n\n".join(tables),
            "summary": summaries,
            "runs": all_runs,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )


if __name__ == "__main__":
    raise SystemExit(main())
