"""A peer, side by side: TRL's GRPOTrainer against `hacrl run` with one agent on the same tiny model.

What a single-agent RL user would otherwise run is TRL. Both sides train the same tiny Qwen2
(``tiny://qwen2-bpe``, hidden 128, 3 layers, byte-level BPE, warm-started), on the same prompts in
the same order (the built-in arithmetic task rendered with our template), with the same group
size, completion length, prompts per optimizer step, learning rate, no KL, the `exact` reward,
temperature 1, on the CPU. Configurations, interleaved (trl, grpo, ..., trl, grpo, ...) so that
machine load hits all alike:

- ``trl``: ``trl.GRPOTrainer`` (pinned version, installed by this script into its own virtual
  environment, never a dependency of ours), one process, torch on every CPU.
- ``grpo``, ``gspo``: `hacrl run --quiet`, one agent, a file store: a rollout and a learner
  worker (threads from ``hacrl_core.runtime.cpus``).
- ``grpo-stale1``: ``grpo`` with ``algorithm.maxStaleness: 1`` (sampling overlaps training).
- ``grpo-colocated``: ``grpo`` with `hacrl run --colocate` (one process samples with the live model
  and trains: no weight publish/load, every CPU for whichever stage runs).

Per configuration: the median step time in steady state (steps after the first two), completions
per second (prompts x G / step time) and trained completion tokens per second; ratio = TRL's step
time / ours (> 1: faster than TRL). Our step time is the learner's own stage clock
(``learner/seconds_*``, which covers the whole step loop including its waits); TRL's the time
between ``on_step_end`` callbacks. Start-up (imports, model load, worker start) is excluded on both
sides and reported apart as wall time.

    python bench/peer_trl.py            # 20 steps, 2 repetitions
    python bench/peer_trl.py --quick    # 4 steps, 1 repetition, grpo and trl only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
    REPO,
    RESULTS,
    agent_document,
    bench_env,
    build_models,
    experiment,
    hacrl_run,
    save,
    table,
    write_spec,
)

TRL_VERSION = "1.16.0"
MODEL = "tiny://qwen2-bpe?seed=0&hidden=128&layers=3"
#: name: (algorithm, maxStaleness, colocated)
CONFIGS = {"trl": None, "grpo": ("grpo", 0, False), "gspo": ("gspo", 0, False), "grpo-stale1": ("grpo", 1, False),
           "grpo-colocated": ("grpo", 0, True)}
WARM_STEPS = 2  # steps left out of the steady state (first sampling, lazy allocations)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 steps, 1 repetition, trl and grpo (the smoke test)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (one optimizer update per step on both sides)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--trl-version", default=TRL_VERSION)
    p.add_argument("--venv", type=Path, default=Path("/tmp/hacrl-bench/trl-venv"), help="TRL's own virtual environment (created if missing)")
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/peer-trl"))
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.reps, args.configs = 4, 1, "trl,grpo"
    return args


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
    """Runs inside TRL's venv: GRPOTrainer on the prompts file; prints one JSON line per step."""
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
        output_dir=cfg["output"], max_steps=cfg["steps"], learning_rate=cfg["lr"], per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=cfg["group_size"], max_completion_length=cfg["max_new_tokens"],
        temperature=1.0, beta=0.0, num_iterations=1, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        bf16=False, seed=0, dataloader_num_workers=0, shuffle_dataset=False,
    )
    known = set(GRPOConfig.__dataclass_fields__)
    config = GRPOConfig(**{k: v for k, v in options.items() if k in known})

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.last = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.tokens = logs["completions/mean_length"] * batch

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            print("STEP " + json.dumps({"step": state.global_step - 1, "seconds": now - self.last,
                                        "tokens": getattr(self, "tokens", None)}), flush=True)
            self.last = now

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(rows), callbacks=[StepClock()])
    trainer.train()
    return 0


def run_trl(python: Path, model_dir: Path, prompts: Path, args: argparse.Namespace, workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = {"model": str(model_dir), "prompts": str(prompts), "steps": args.steps, "lr": args.lr, "group_size": args.group_size,
           "prompts_per_step": args.prompts, "max_new_tokens": args.max_new_tokens, "output": str(workdir / "out"),
           "threads": len(os.sched_getaffinity(0))}
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(cfg))
    env = bench_env(args.cache.resolve(), {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    began = time.perf_counter()
    # -P: bench/ must not lead sys.path, its operator.py would shadow the standard library's.
    done = subprocess.run([str(python), "-P", __file__, "--trl-child", str(config_path)], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode:
        raise RuntimeError(f"TRL run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    steps = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("STEP ")]
    return {"wall": wall, "steps": steps}


# --------------------------------------------------------------------------- ours


def run_ours(algorithm: str, staleness: int, colocated: bool, args: argparse.Namespace, name: str) -> dict:
    from hacrl_core.store import open_trajectory_store

    store_dir = args.work / "store"
    doc = experiment(name, [agent_document("solo", MODEL, lr=args.lr, max_new_tokens=args.max_new_tokens)],
                     {"name": algorithm, "groupSize": args.group_size, "promptsPerStep": args.prompts,
                      "miniBatchPrompts": args.prompts, "steps": args.steps, "seed": 0, "maxStaleness": staleness},
                     store_uri=f"file://{store_dir}", eval_prompts=0)
    spec_path = write_spec(doc, args.work / "specs" / f"{name}.yaml")
    wall = hacrl_run(spec_path, args.work / "workdirs" / name, bench_env(args.cache.resolve()), args=["--colocate" if colocated else "--split"])
    store = open_trajectory_store(f"file://{store_dir}", name)
    steps = []
    for step in range(args.steps):
        m = store.read_metrics(step, "solo")
        seconds = sum(v for k, v in m.items() if k.startswith("learner/seconds_"))
        tokens = m["learner/tokens_per_second"] * m["learner/seconds_update"]  # response tokens trained
        steps.append({"step": step, "seconds": seconds, "tokens": tokens})
    return {"wall": wall, "steps": steps}


# --------------------------------------------------------------------------- report


def prompts_file(args: argparse.Namespace, model_dir: Path) -> Path:
    """The prompts of every step in step order, rendered as our rollout worker renders them."""
    from transformers import AutoTokenizer

    from hacrl_core.context import step_problems
    from hacrl_core.data.report import open_dataset
    from hacrl_core.data.templates import render_prompt
    from hacrl_core.spec import parse_experiment

    doc = experiment("probe", [agent_document("solo", MODEL, lr=args.lr)], {"name": "grpo", "groupSize": args.group_size,
                     "promptsPerStep": args.prompts, "miniBatchPrompts": args.prompts, "steps": args.steps, "seed": 0},
                     store_uri="file:///unused", eval_prompts=0)
    spec = parse_experiment(doc).spec
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    source = open_dataset(spec.data, spec.data.train)
    lines = [json.dumps({"prompt": render_prompt(tokenizer, p.question, spec.data.template), "answer": p.answer})
             for step in range(args.steps) for p in step_problems(source, spec.algorithm, step)]
    path = args.work / "prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def steady(run: dict) -> tuple[float, float]:
    """Median seconds per step and median completion tokens per step after the warm steps."""
    steps = [s for s in run["steps"] if s["step"] >= WARM_STEPS] or run["steps"]
    tokens = [s["tokens"] for s in steps if s["tokens"] is not None]
    return statistics.median(s["seconds"] for s in steps), (statistics.median(tokens) if tokens else float("nan"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trl_child:
        return trl_child(args.trl_child)
    began = time.perf_counter()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; valid: {', '.join(CONFIGS)}")
    cache = args.cache.resolve()
    for stale in ("store", "workdirs"):  # runs of an earlier invocation would refuse to start (names repeat)
        shutil.rmtree(args.work / stale, ignore_errors=True)
    build_models([MODEL], cache)
    from hacrl_core.models.uri import resolve_model

    model_dir = resolve_model(MODEL, cache / "models")
    prompts = prompts_file(args, model_dir)
    python = trl_python(args.venv, args.trl_version) if "trl" in configs else None
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for rep in range(args.reps):
        for config in configs:
            name = f"peer-{config}-{rep}"
            if config == "trl":
                record = run_trl(python, model_dir, prompts, args, args.work / name)
            else:
                record = run_ours(*CONFIGS[config], args, name)
            runs[config].append(record)
            seconds, _ = steady(record)
            print(f"rep {rep} {config}: {seconds:.3f} s/step steady, wall {record['wall']:.1f} s", flush=True)

    completions = args.prompts * args.group_size
    summary, rows = {}, []
    base = statistics.median(steady(r)[0] for r in runs["trl"]) if runs.get("trl") else None
    for config in configs:
        step_s = statistics.median(steady(r)[0] for r in runs[config])
        tokens = statistics.median(steady(r)[1] for r in runs[config])
        wall = statistics.median(r["wall"] for r in runs[config])
        ratio = base / step_s if base else float("nan")
        summary[config] = {"step_seconds": step_s, "completions_per_second": completions / step_s,
                           "trained_tokens_per_second": tokens / step_s, "wall_seconds": wall, "ratio_vs_trl": ratio}
        rows.append([config, f"{step_s:.3f}", f"{completions / step_s:.0f}", f"{tokens / step_s:.0f}", f"{wall:.1f}",
                     f"{ratio:.2f}" if base else "-"])
    text = table(["config", "s/step (steady, median)", "completions/s", "trained tok/s", "wall s", "ratio vs TRL (step)"], rows)
    print(f"\npeer: TRL {args.trl_version} GRPOTrainer vs hacrl run, one agent ({MODEL}); {args.prompts} prompts x G {args.group_size} "
          f"x {args.max_new_tokens} tokens, lr {args.lr}, no KL, {args.steps} steps, median of {args.reps} interleaved reps\n{text}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save("peer_trl-quick" if args.quick else "peer_trl", {"settings": settings, "table": text, "summary": summary, "runs": runs,
                                                                  "total_seconds": time.perf_counter() - began}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
