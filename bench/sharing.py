"""When does sharing help? The share of cross rows HACPO can use, by response length and tokenizer pairing.

HACPO trains an agent on a peer's row only while the per-token-mean sequence ratio of that row
sits inside the clipping window ([1 - delta, 1] at the first update, docs/algorithm.md). This
script measures how many cross rows do, on the two response formats of the built-in arithmetic
task and three tokenizer pairings:

- ``answer`` (difficulty 1, the bare answer: 2-3 response tokens) and ``chain`` (difficulty 2-3,
  a worked solution ``4*2=8; 3+8=11 #### 11``: 15-40 tokens);
- char + char (two Llama agents with the character tokenizer, different seeds or warm starts),
  bpe + bpe (two Qwen2 agents with byte-level BPE), char + bpe (one of each).

Each cell is a real one-step ``hacrl run`` (HACPO, paper defaults); the table reads each agent's
``learner/cross_clip_frac`` (share of cross rows outside the window, over the step's two updates)
and ``learner/cross_ratio_mean`` back from the store, with the mean response length in tokens.

    python bench/sharing.py            # full: 6 cells, 64 prompts x G 8
    python bench/sharing.py --quick    # smoke test: the answer format only, 8 prompts, short warm starts

Results: ``bench/results/sharing.json``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
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

#: format -> (task difficulty, rollout max new tokens, {pairing: [(agent name, tiny:// URI), ...]})
CELLS: dict[str, tuple[str, int, dict[str, list[tuple[str, str]]]]] = {
    "answer": (
        "1",
        8,
        {
            "char + char": [("char-a", "tiny://llama-char?seed=0"), ("char-b", "tiny://llama-char?seed=1")],
            "bpe + bpe": [("bpe-a", "tiny://qwen2-bpe?seed=0"), ("bpe-b", "tiny://qwen2-bpe?seed=1")],
            "char + bpe": [("char-a", "tiny://llama-char?seed=0"), ("bpe-a", "tiny://qwen2-bpe?seed=0")],
        },
    ),
    "chain": (
        "2-3",
        48,
        {
            "char + char": [
                ("char-a", "tiny://llama-char?seed=0&warmup_steps=500&format=chain&difficulty=2-3"),
                ("char-b", "tiny://llama-char?seed=0&warmup_steps=300&format=chain&difficulty=2-3"),
            ],
            "bpe + bpe": [
                ("bpe-a", "tiny://qwen2-bpe?seed=0&warmup_steps=600&format=chain&difficulty=2-3"),
                ("bpe-b", "tiny://qwen2-bpe?seed=0&warmup_steps=300&format=chain&difficulty=2-3"),
            ],
            "char + bpe": [
                ("char-a", "tiny://llama-char?seed=0&warmup_steps=500&format=chain&difficulty=2-3"),
                ("bpe-a", "tiny://qwen2-bpe?seed=0&warmup_steps=600&format=chain&difficulty=2-3"),
            ],
        },
    ),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: answer format, 8 prompts, untrained models")
    p.add_argument("--formats", default=",".join(CELLS), help="comma-separated subset of: " + ", ".join(CELLS))
    p.add_argument("--prompts", type=int, default=64, help="promptsPerStep (two updates of half each)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/sharing"), help="stores and logs")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="HACRL_CACHE (tiny models are built once)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.formats, args.prompts = "answer", 8
    return args


def with_warmup(uri: str, steps: int) -> str:
    return f"{uri}&warmup_steps={steps}" if "warmup_steps=" not in uri else uri


def spec(
    name: str,
    difficulty: str,
    max_new_tokens: int,
    agents: list[tuple[str, str]],
    args: argparse.Namespace,
    store_dir: Path,
) -> dict[str, Any]:
    algorithm = {
        "name": "hacpo",
        "groupSize": args.group_size,
        "promptsPerStep": args.prompts,
        "miniBatchPrompts": max(1, args.prompts // 2),
        "steps": 1,
        "seed": 0,
    }
    documents = [agent_document(agent, uri, lr=1e-4, max_new_tokens=max_new_tokens) for agent, uri in agents]
    return experiment(
        name, documents, algorithm, store_uri=f"file://{store_dir}", difficulty=difficulty, eval_prompts=0
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from hacrl_core.store import open_trajectory_store

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    store_dir = args.work / "store"
    env = bench_env(args.cache.resolve())
    began = time.perf_counter()
    cells = []
    for fmt_name in formats:
        difficulty, max_new_tokens, pairings = CELLS[fmt_name]
        for pairing, agents in pairings.items():
            if args.quick:
                agents = [(agent, with_warmup(uri, 0)) for agent, uri in agents]  # the script, not the models
            cells.append((fmt_name, difficulty, max_new_tokens, pairing, agents))
    build_seconds = build_models([uri for *_, agents in cells for _, uri in agents], args.cache.resolve())
    print(f"models ready: {build_seconds}", flush=True)

    rows, results = [], []
    for fmt_name, difficulty, max_new_tokens, pairing, agents in cells:
        name = f"sharing-{fmt_name}-{pairing.replace(' + ', '-')}"
        shutil.rmtree(store_dir / name, ignore_errors=True)
        path = write_spec(
            spec(name, difficulty, max_new_tokens, agents, args, store_dir), args.work / "specs" / f"{name}.yaml"
        )
        wall = hacrl_run(path, args.work / "workdirs" / name, env)
        store = open_trajectory_store(f"file://{store_dir}", name)
        lengths = {
            agent: statistics.fmean(len(r["token_ids"]) for r in store.read_rollouts(0, agent)) for agent, _ in agents
        }
        for agent, uri in agents:
            metrics = store.read_metrics(0, agent)
            peer = next(a for a, _ in agents if a != agent)
            used = 1.0 - metrics["learner/cross_clip_frac"]
            result = {
                "format": fmt_name,
                "pairing": pairing,
                "learner": agent,
                "model": uri,
                "peer": peer,
                "learner_tokens": lengths[agent],
                "peer_tokens": lengths[peer],
                "shared_rows_used": used,
                "cross_ratio_mean": metrics.get("learner/cross_ratio_mean"),
                "cross_rows": metrics["learner/cross_rows"],
                "cross_grad_share": metrics.get("learner/cross_grad_share"),
                "wall_seconds": wall,
            }
            results.append(result)
            rows.append(
                [
                    fmt_name,
                    pairing,
                    f"{agent} <- {peer}",
                    f"{lengths[agent]:.1f}",
                    f"{lengths[peer]:.1f}",
                    f"{used:.0%}",
                    f"{result['cross_ratio_mean']:.3f}",
                    f"{result['cross_grad_share']:.2f}",
                ]
            )
        print(f"{name}: {wall:.0f}s", flush=True)
        shutil.rmtree(store_dir / name, ignore_errors=True)

    text = table(
        [
            "format",
            "tokenizers",
            "learner <- peer",
            "own tokens",
            "peer tokens",
            "shared rows used",
            "cross ratio mean",
            "cross grad share",
        ],
        rows,
    )
    print(
        f"\nshare of cross rows inside HACPO's clipping window at the first step ({args.prompts} prompts x G {args.group_size} "
        f"per agent; delta 0.2)\n{text}"
    )
    path = save(
        "sharing-quick" if args.quick else "sharing",
        {
            "settings": {k: str(v) for k, v in vars(args).items()},
            "build_seconds": build_seconds,
            "total_seconds": time.perf_counter() - began,
            "table": text,
            "cells": results,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
