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

Second table, per ordered pair of models (``--pairs``; default: the learning benchmark's teams):
how far apart two agents are where HACPO looks, before any RL step. The source samples (T=1);
each sample is scored by the source and, re-encoded with its own tokenizer as a learner encodes a
peer's row, by the learner. ``log s`` = learner's per-token mean log-prob minus the source's:
the log of the cross row's sequence ratio at the first update (docs/algorithm.md). Its mean is
minus the per-token KL(source || learner) when the two share a tokenizer (docs/algorithm.md, "When does sharing help?":
the window [1 - delta, 1] admits rows from peers within about 0.22 nats/token); ``inside`` is the
share of rows with s in [1 - delta, 1], the rows HACPO can learn from at the first update, over
all rows and over the rewarded ones.

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
#: (source, learner) pairs of the second table: both directions of each benchmark team.
PAIRS = [(MODELS[a], MODELS[b]) for a, b in ((1, 0), (0, 1), (2, 0), (0, 2), (4, 3), (3, 4), (5, 3), (3, 5))]
QUICK_MODELS = [
    f"tiny://llama-char?seed=0&warmup_steps=0&{CHAIN}",
    f"tiny://qwen2-bpe?seed=0&warmup_steps=0&{CHAIN}&marker=0.3",
]
LAST_RESULT = re.compile(r"=\s*(-?\d+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--models", nargs="+", help="tiny:// (or other) model URIs; default: the learning benchmark's agents"
    )
    p.add_argument("--problems", type=int, default=200, help="held-out problems (difficulty 2-3)")
    p.add_argument("--samples", type=int, default=8, help="samples per problem at temperature 1 (the group size)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument(
        "--pairs",
        nargs="*",
        metavar="SOURCE>LEARNER",
        help="ordered model pairs of the second table, "
        "as 'SOURCE_URI>LEARNER_URI'; default: both directions of the learning benchmark's teams; none: skip it",
    )
    p.add_argument("--delta", type=float, default=0.2, help="HACPO's clipping window [1 - delta, 1] (the paper's 0.2)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="HACRL_CACHE (tiny models are built once)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--work", type=Path, help="unused (nothing is written but the results); taken like every benchmark's"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.problems, args.samples, args.max_new_tokens = 16, 4, 24
        args.models = args.models or QUICK_MODELS
        args.pairs = [f"{QUICK_MODELS[0]}>{QUICK_MODELS[1]}"] if args.pairs is None else args.pairs
    args.models = args.models or MODELS
    args.pairs = [tuple(pair.split(">", 1)) for pair in args.pairs] if args.pairs is not None else PAIRS
    bad = [pair for pair in args.pairs if len(pair) != 2]
    if bad:
        p.error(f"--pairs: {bad[0][0]!r} is not SOURCE_URI>LEARNER_URI")
    return args


def knows(text: str, answer: str) -> bool:
    """The chain's last computed value is the answer, whatever the chain's ending says."""
    values = LAST_RESULT.findall(text)
    return bool(values) and values[-1] == answer.strip()


def held_out_problems(count: int) -> list[Any]:
    """The first ``count`` held-out problems at difficulty 2-3 (the learning benchmark's evaluation set)."""
    from hacrl_core.data.datasets import open_source

    source = open_source(f"builtin://arithmetic?difficulty=2-3&seed=0&split=eval&size={count}")
    return [source[i] for i in range(min(len(source), count))]


def measure(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    from hacrl_core.data.templates import render_prompt
    from hacrl_core.models.uri import resolve_model
    from hacrl_core.rewards import get_reward
    from hacrl_core.rollout.engine import SamplingParams
    from hacrl_core.rollout.hf_engine import HFEngine

    reward = get_reward("exact")
    problems = held_out_problems(args.problems)
    engine = HFEngine(batch_size=128)
    engine.load(resolve_model(uri, args.cache / "models"))
    prompts = [render_prompt(engine.tokenizer, p.question) for p in problems]
    began = time.perf_counter()
    greedy = engine.generate(
        prompts, SamplingParams(n=1, greedy=True, max_new_tokens=args.max_new_tokens, seed=args.seed)
    )
    sampled = engine.generate(
        prompts,
        SamplingParams(
            n=args.samples, greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed
        ),
    )
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
        "sampled_knows": sum(knows(s.text, p.answer) for p, group in zip(problems, sampled) for s in group)
        / len(texts),
        "samples_with_marker": sum("####" in t for t in texts) / len(texts),
        "mixed_groups": sum(0 < sum(r) < len(r) for r in rewards),
        "seconds": seconds,
    }


def per_token_logprob(engine: Any, rows: list[tuple[list[int], list[int]]], batch: int = 64) -> list[float]:
    """Each row's mean log-prob per response token under ``engine``'s model, scored as the learner
    scores rows (``learner.batch.score_rows``)."""
    from hacrl_core.learner.batch import TrainRow, score_rows
    from hacrl_core.learner.micro_batches import MicroBatching
    from hacrl_core.learner.state import pad_id

    train_rows = [TrainRow(0, "", 0.0, ids, mask, True) for ids, mask in rows]
    packing = MicroBatching(
        max_tokens=batch * max(len(ids) for ids, _ in rows), max_rows=batch
    )  # ``batch`` rows at a time
    sums, counts, _ = score_rows(engine.model, train_rows, pad_id(engine.tokenizer), packing)
    return [total / max(count, 1) for total, count in zip(sums, counts)]


def pair_divergence(source_uri: str, learner_uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Where the learner's HACPO window puts the source's rows before any RL step (second table)."""
    import math
    import statistics

    from hacrl_core.data.templates import render_prompt
    from hacrl_core.models.encoding import encode_row_for
    from hacrl_core.models.uri import resolve_model
    from hacrl_core.rewards import get_reward
    from hacrl_core.rollout.engine import SamplingParams
    from hacrl_core.rollout.hf_engine import HFEngine

    reward = get_reward("exact")
    problems = held_out_problems(args.problems)
    source, learner = HFEngine(batch_size=128), HFEngine(batch_size=128)
    source.load(resolve_model(source_uri, args.cache / "models"))
    learner.load(resolve_model(learner_uri, args.cache / "models"))
    source_prompts = [render_prompt(source.tokenizer, p.question) for p in problems]
    learner_prompts = [render_prompt(learner.tokenizer, p.question) for p in problems]
    sampled = source.generate(
        source_prompts,
        SamplingParams(
            n=args.samples, greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed
        ),
    )
    own_rows, peer_rows, rewards = [], [], []
    for problem, source_prompt, learner_prompt, group in zip(problems, source_prompts, learner_prompts, sampled):
        for sample in group:
            own_rows.append(encode_row_for(source.tokenizer, source_prompt, sample.text, sample.token_ids))
            peer_rows.append(
                encode_row_for(learner.tokenizer, learner_prompt, sample.text, finish_reason=sample.finish_reason)
            )
            rewards.append(reward(sample.text, problem.answer))
    log_s = [
        mine - theirs
        for mine, theirs in zip(per_token_logprob(learner, peer_rows), per_token_logprob(source, own_rows))
    ]
    low = math.log(1 - args.delta)
    inside = [low <= value <= 0 for value in log_s]
    rewarded = [flag for flag, r in zip(inside, rewards) if r > 0]
    return {
        "source": source_uri,
        "learner": learner_uri,
        "rows": len(log_s),
        "log_s_mean": statistics.fmean(log_s),
        "log_s_sd": statistics.stdev(log_s) if len(log_s) > 1 else 0.0,
        "inside": sum(inside) / len(inside),
        "inside_rewarded": sum(rewarded) / len(rewarded) if rewarded else None,
        "rewarded_rows": len(rewarded),
    }


def short(uri: str) -> str:
    """A table's name for a tiny:// model: preset, warm-start steps and options."""
    if not uri.startswith("tiny://"):
        return uri
    preset, _, query = uri.removeprefix("tiny://").partition("?")
    options = dict(item.partition("=")[::2] for item in query.split("&") if item)
    extra = "".join(f", {key}={options[key]}" for key in ("marker", "hidden", "layers") if key in options)
    return f"{preset} {options.get('warmup_steps', '?')}{extra}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.cache = args.cache.resolve()
    build_seconds = build_models(args.models, args.cache)
    results = []
    for uri in args.models:
        result = measure(uri, args)
        results.append(result)
        print(
            f"{uri}: greedy {result['greedy_reward']:.3f} (knows {result['greedy_knows']:.3f}), "
            f"sampled {result['sampled_reward']:.3f}, pass@{args.samples} {result['pass_at_k']:.3f}",
            flush=True,
        )
    headers = [
        "model",
        "greedy reward",
        "greedy knows",
        "sampled reward",
        f"pass@{args.samples}",
        "sampled knows",
        "samples with ####",
        f"mixed groups of {args.problems}",
    ]
    rows = [
        [
            r["model"].removeprefix("tiny://"),
            f"{r['greedy_reward']:.3f}",
            f"{r['greedy_knows']:.3f}",
            f"{r['sampled_reward']:.3f}",
            f"{r['pass_at_k']:.3f}",
            f"{r['sampled_knows']:.3f}",
            f"{r['samples_with_marker']:.1%}",
            r["mixed_groups"],
        ]
        for r in results
    ]
    text = table(headers, rows)
    print(
        f"\nheadroom ({args.problems} held-out problems, difficulty 2-3; {args.samples} samples at T=1, "
        f"{args.max_new_tokens} new tokens)\n{text}"
    )
    pairs = []
    if args.pairs:
        build_seconds.update(build_models([uri for pair in args.pairs for uri in pair], args.cache))
    for source_uri, learner_uri in args.pairs:
        pairs.append(pair_divergence(source_uri, learner_uri, args))
        print(
            f"{short(source_uri)} -> {short(learner_uri)}: log s {pairs[-1]['log_s_mean']:+.3f}, inside {pairs[-1]['inside']:.1%}",
            flush=True,
        )
    pair_table = (
        table(
            [
                "source (samples)",
                "learner (scores)",
                "rows",
                "mean log s (nats/token)",
                "sd log s",
                f"inside [{1 - args.delta:g}, 1]",
                "inside, rewarded rows",
            ],
            [
                [
                    short(r["source"]),
                    short(r["learner"]),
                    r["rows"],
                    f"{r['log_s_mean']:+.3f}",
                    f"{r['log_s_sd']:.3f}",
                    f"{r['inside']:.1%}",
                    "-" if r["inside_rewarded"] is None else f"{r['inside_rewarded']:.1%} of {r['rewarded_rows']}",
                ]
                for r in pairs
            ],
        )
        if pairs
        else ""
    )
    if pairs:
        print(
            f"\npairs before RL: the cross rows' log ratio at the first update ({args.problems} problems x {args.samples} samples "
            f"of the source at T=1)\n{pair_table}"
        )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "headroom-quick" if args.quick else "headroom",
        {
            "settings": settings,
            "build_seconds": build_seconds,
            "results": results,
            "table": text,
            "pairs": pairs,
            "pair_table": pair_table,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
