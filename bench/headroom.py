"""Headroom before RL: what a warm-started model knows against what its reward shows.

GSPO (or HACPO) can only raise a model's reward towards what its samples already reach
sometimes. This script measures that for tiny models on the worked-chain task, before any RL
step, on held-out problems:

- ``greedy reward`` / ``sampled reward``: the ``exact`` reward (answer after ``####``, then "answer
  is", then the last number: docs/algorithm.md) of the greedy completion and the mean over
  ``--samples`` samples at temperature 1 (what a rollout group sees);
- ``pass@k``: the share of problems with at least one rewarded sample among the ``k``;
- ``greedy knows`` / ``sampled knows``: the chain's last ``= <n>`` value equals the answer, whatever
  the chain's ending (a ``marker=F`` model ends most chains with the unrewarded ``(<n> steps)``:
  docs/runtime.md);
- ``samples with ####``: the share of samples that end in the rewarded form;
- ``mixed groups``: problems whose samples are neither all right nor all wrong, the only groups
  that give GSPO's group-normalised advantage a signal.

A large gap between ``knows`` and ``reward`` (or between ``pass@k`` and ``sampled reward``) is
headroom RL can take; when they are equal the errors are arithmetic the model does not know, and
RL on this task moves little (docs/benchmarks.md section 1 measured both regimes).

    python bench/headroom.py                 # the learning benchmark's models, 200 problems x 8 samples
    python bench/headroom.py --quick         # two untrained models, 16 problems x 4 samples
    python bench/headroom.py --models 'tiny://llama-char?seed=0&warmup_steps=300&format=chain&difficulty=2-3&marker=0.3'

Results: ``bench/results/headroom.json``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_CACHE, RESULTS, build_models, save, table

CHAIN = "format=chain&difficulty=2-3"
#: The learning benchmark's agents (bench/learning.py TEAMS), plain and with ``marker=0.3``.
MODELS = [
    f"tiny://llama-char?seed=0&warmup_steps=300&{CHAIN}",
    f"tiny://llama-char?seed=0&warmup_steps=500&{CHAIN}",
    f"tiny://qwen2-bpe?seed=0&warmup_steps=600&{CHAIN}",
    f"tiny://llama-char?seed=0&warmup_steps=300&{CHAIN}&marker=0.3",
    f"tiny://llama-char?seed=0&warmup_steps=500&{CHAIN}&marker=0.3",
    f"tiny://qwen2-bpe?seed=0&warmup_steps=600&{CHAIN}&marker=0.3",
]
#: The smoke test checks the script, not the models: untrained ones are built in a second.
QUICK_MODELS = [f"tiny://llama-char?seed=0&warmup_steps=0&{CHAIN}", f"tiny://qwen2-bpe?seed=0&warmup_steps=0&{CHAIN}&marker=0.3"]
LAST_RESULT = re.compile(r"=\s*(-?\d+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", nargs="+", help="tiny:// (or other) model URIs; default: the learning benchmark's agents")
    p.add_argument("--problems", type=int, default=200, help="held-out problems (difficulty 2-3)")
    p.add_argument("--samples", type=int, default=8, help="samples per problem at temperature 1 (the group size)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="HACRL_CACHE (tiny models are built once)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, help="unused (nothing is written but the results); taken like every benchmark's")
    args = p.parse_args(argv)
    if args.quick:
        args.problems, args.samples, args.max_new_tokens = 16, 4, 24
        args.models = args.models or QUICK_MODELS
    args.models = args.models or MODELS
    return args


def knows(text: str, answer: str) -> bool:
    """The chain's last computed value is the answer, whatever the chain's ending says."""
    values = LAST_RESULT.findall(text)
    return bool(values) and values[-1] == answer.strip()


def measure(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    from hacrl_core.data.datasets import open_source
    from hacrl_core.data.templates import render_prompt
    from hacrl_core.models.uri import resolve_model
    from hacrl_core.rewards import get_reward
    from hacrl_core.rollout.engine import SamplingParams
    from hacrl_core.rollout.hf_engine import HFEngine

    reward = get_reward("exact")
    source = open_source(f"builtin://arithmetic?difficulty=2-3&seed=0&split=eval&size={args.problems}")
    problems = [source[i] for i in range(min(len(source), args.problems))]
    engine = HFEngine(batch_size=128)
    engine.load(resolve_model(uri, args.cache / "models"))
    prompts = [render_prompt(engine.tokenizer, p.question) for p in problems]
    began = time.perf_counter()
    greedy = engine.generate(prompts, SamplingParams(n=1, greedy=True, max_new_tokens=args.max_new_tokens, seed=args.seed))
    sampled = engine.generate(prompts, SamplingParams(n=args.samples, greedy=False, temperature=1.0, top_p=1.0,
                                                      max_new_tokens=args.max_new_tokens, seed=args.seed))
    seconds = time.perf_counter() - began
    n = len(problems)
    greedy_texts = [group[0].text for group in greedy]
    rewards = [[reward(s.text, p.answer) for s in group] for p, group in zip(problems, sampled)]
    texts = [s.text for group in sampled for s in group]
    return {
        "model": uri,
        "problems": n,
        "samples": args.samples,
        "greedy_reward": sum(reward(t, p.answer) for t, p in zip(greedy_texts, problems)) / n,
        "greedy_knows": sum(knows(t, p.answer) for t, p in zip(greedy_texts, problems)) / n,
        "sampled_reward": sum(sum(r) for r in rewards) / (n * args.samples),
        "pass_at_k": sum(max(r) > 0 for r in rewards) / n,
        "sampled_knows": sum(knows(s.text, p.answer) for p, group in zip(problems, sampled) for s in group) / len(texts),
        "samples_with_marker": sum("####" in t for t in texts) / len(texts),
        "mixed_groups": sum(0 < sum(r) < len(r) for r in rewards),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.cache = args.cache.resolve()
    build_seconds = build_models(args.models, args.cache)
    results = []
    for uri in args.models:
        result = measure(uri, args)
        results.append(result)
        print(f"{uri}: greedy {result['greedy_reward']:.3f} (knows {result['greedy_knows']:.3f}), "
              f"sampled {result['sampled_reward']:.3f}, pass@{args.samples} {result['pass_at_k']:.3f}", flush=True)
    headers = ["model", "greedy reward", "greedy knows", "sampled reward", f"pass@{args.samples}", "sampled knows",
               "samples with ####", f"mixed groups of {args.problems}"]
    rows = [[r["model"].removeprefix("tiny://"), f"{r['greedy_reward']:.3f}", f"{r['greedy_knows']:.3f}", f"{r['sampled_reward']:.3f}",
             f"{r['pass_at_k']:.3f}", f"{r['sampled_knows']:.3f}", f"{r['samples_with_marker']:.1%}", r["mixed_groups"]] for r in results]
    text = table(headers, rows)
    print(f"\nheadroom ({args.problems} held-out problems, difficulty 2-3; {args.samples} samples at T=1, "
          f"{args.max_new_tokens} new tokens)\n{text}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save("headroom-quick" if args.quick else "headroom", {"settings": settings, "build_seconds": build_seconds,
                                                                  "results": results, "table": text}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
