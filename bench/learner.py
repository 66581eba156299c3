"""Learner throughput: one HACPO (or GSPO) learner step against a plain forward+backward.

A one-step ``hacrl run`` of the quickstart's two agents fills a file store with real rollouts
and scores of step 0. Then, in this process, for each agent:

- ``algo``: the one learner step on those shards, exactly as the worker runs it
  (``learner.step.learner_step`` on the store's ports) — ``gather_rows`` (own and peer shards read, peer rows re-encoded with this learner's
  tokenizer), ``update_capability``, ``assign_advantages``, ``plan_updates``, ``score_pi_old``
  (no-grad scoring of the own rows outside the first update; the first update's own
  micro-batches score and train at once), the scores exchange (own scores published, the
  peers' read) and ``run_updates`` (micro-batches, policy loss, AdamW);
- ``algo, scoring pass``: the same with every own row scored in a no-grad pass
  (``plan_updates(score_in_first_update=False)``): what training the first update's own
  micro-batches inside the pi_old stage saves;
- ``plain``: a plain torch loop over exactly the same token batches (the same rows in the same
  mini-batches and micro-batches, collated the same way): forward, next-token cross-entropy on
  the response tokens, backward, grad clip and AdamW step per mini-batch.

Both start from the same weights and optimizer state; repetitions are interleaved
(plain, algo, plain, algo, ...) and the median is taken, so machine load hits both alike.
Ratio = (trained tokens / algo seconds) / (trained tokens / plain seconds) = plain / algo;
the limit is 1.0, of the medians; "paired" is the median of each repetition's plain / algo, which
load that drifts between repetitions moves less. A per-stage breakdown and a cProfile of one algo
step show where the rest goes.

    python bench/learner.py            # both agents, hacpo and gspo, 5 repetitions
    python bench/learner.py --quick    # 16 prompts, 2 repetitions
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
    LLAMA,
    QWEN,
    RESULTS,
    agent_entry,
    bench_env,
    build_models,
    experiment,
    hacrl_run,
    save,
    table,
    write_spec,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (a learner worker of a 2-agent hacrl run gets 1 on 2 CPUs)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/learner"))
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.reps = 16, 2
    return args


def make_store(args: argparse.Namespace) -> tuple[Path, str]:
    """A one-step hacpo run: step 0's rollouts and scores of both agents in a file store."""
    import shutil

    name = "bench-learner-q" if args.quick else "bench-learner"
    store_dir = args.work / "store"
    shutil.rmtree(store_dir / name, ignore_errors=True)
    agents = [
        agent_entry(LLAMA, warmup_steps=400),
        agent_entry(QWEN, warmup_steps=200),
    ]  # the learning benchmark's models
    algorithm = {
        "name": "hacpo",
        "groupSize": args.group_size,
        "promptsPerStep": args.prompts,
        "miniBatchPrompts": max(1, args.prompts // 2),
        "steps": 1,
        "seed": 0,
    }
    doc = experiment(name, agents, algorithm, store_uri=f"file://{store_dir}", eval_prompts=0)
    spec_path = write_spec(doc, args.work / f"{name}.yaml")
    build_models([a["model"] for a in agents], args.cache.resolve())
    hacrl_run(spec_path, args.work / "workdir" / name, bench_env(args.cache.resolve()))
    return spec_path, name


def contexts(spec_path: Path, agent: str, algorithm: str):
    from hacrl_core.context import WorkerContext

    context = WorkerContext.from_spec_file(spec_path, agent)
    context.experiment = copy.deepcopy(context.experiment)
    context.experiment.spec.algorithm.name = algorithm
    return context


def initial_weights(context) -> dict[str, Any]:
    from hacrl_core.models.loading import load_policy

    model, _ = load_policy(context.initial_model_dir())
    return {k: v.clone() for k, v in model.state_dict().items()}


def fresh_state(context, initial: dict[str, Any]):
    """Learner state at weights version 0 with a fresh optimizer (same for every repetition)."""
    from hacrl_core.learner.worker import initialize

    state = initialize(context)
    state.model.load_state_dict(initial)
    state.backend.model.train()
    return state


STAGES = ("gather_rows", "assign_advantages", "score_pi_old", "exchange_scores", "run_updates")
#: This benchmark's column of each stage of the learner step (``learner.step.STAGES``).
STEP_COLUMNS = {
    "read_own": "gather_rows",
    "read_peers": "gather_rows",
    "plan": "assign_advantages",
    "pi_old": "score_pi_old",
    "publish_scores": "exchange_scores",
    "read_peer_scores": "exchange_scores",
    "update": "run_updates",
}


def algo_step(
    context, state, step: int = 0, *, score_in_first_update: bool = True
) -> tuple[dict[str, float], int, list, object]:
    """One learner step, timed stage by stage, as the learner worker runs it
    (``learner.step.learner_step`` on ``StorePorts``); returns (seconds per stage, trained
    tokens, rows, the step's plan)."""
    import dataclasses

    from hacrl_core.algorithms import resolve_algorithm
    from hacrl_core.learner.step import learner_step, run_step
    from hacrl_core.learner.worker import step_setup, store_ports

    members = tuple(context.spec.team())  # step 0's members: every agent of the spec
    setup = dataclasses.replace(
        step_setup(context, resolve_algorithm(context.spec.algorithm), members),
        score_in_first_update=score_in_first_update,
    )
    stages = dict.fromkeys(STAGES, 0.0)
    last = [time.perf_counter()]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        stages[STEP_COLUMNS[stage]] += now - last[0]
        last[0] = now

    result = run_step(learner_step(state, setup, store_ports(context, state, members), step, lap=lap))
    stages["total"] = sum(stages[k] for k in STAGES)
    return stages, sum(len(r.input_ids) for r in result.rows), result.rows, result.plan


def plain_step(context, state, rows, plan) -> float:
    """Forward (the logits of the response positions only), response-token cross-entropy, backward,
    clip, AdamW: the same batches, nothing else."""
    import torch

    from hacrl_core.learner.batch import collate_rows
    from hacrl_core.learner.state import pad_id

    pad = pad_id(state.tokenizer)
    model, backend = state.backend.model, state.backend
    began = time.perf_counter()
    for micro in plan.micro_batches:  # the same micro-batches as the algo step's
        backend.zero_grad()
        for chunk in micro:
            input_ids, attention, response = collate_rows([rows[i] for i in chunk], pad)
            position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
            # Logits of the response positions only, as the algo step (and TRL) asks for them.
            first = max(int(response.any(0).long().argmax()), 1)
            logits = model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=input_ids.shape[1] - first + 1,
            ).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, first:, None]).squeeze(-1)
            mask = response[:, first:].float()
            loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
            backend.backward(loss)
        backend.step()
    return time.perf_counter() - began


def profile_step(context, initial) -> list[str]:
    state = fresh_state(context, initial)
    profiler = cProfile.Profile()
    profiler.enable()
    algo_step(context, state)
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(18)
    lines = [ln for ln in stream.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    return lines[start : start + 19]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import os

    os.environ["HACRL_CACHE"] = str(args.cache.resolve())
    os.environ.setdefault(
        "TOKENIZERS_PARALLELISM", "false"
    )  # as the learner worker sets it (learner.worker.SERIAL_TOKENIZER_ENV)
    import torch

    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    spec_path, _name = make_store(args)
    results: dict[str, Any] = {}
    rows_out = []
    for agent in (LLAMA["name"], QWEN["name"]):
        for algorithm in ("hacpo", "gspo"):
            context = contexts(spec_path, agent, algorithm)
            initial = initial_weights(context)
            plain_s, algo_s, scoring_pass_s, stage_runs = [], [], [], []
            tokens = 0
            for _rep in range(args.reps):
                state = fresh_state(context, initial)
                stages, tokens, rows, plan = algo_step(context, state)
                state = fresh_state(context, initial)
                plain_s.append(plain_step(context, state, rows, plan))
                algo_s.append(stages["total"])
                stage_runs.append(stages)
                state = fresh_state(context, initial)
                scoring_pass_s.append(algo_step(context, state, score_in_first_update=False)[0]["total"])
            plain, algo = statistics.median(plain_s), statistics.median(algo_s)
            scoring_pass = statistics.median(scoring_pass_s)
            saving = statistics.median(1 - a / b for a, b in zip(algo_s, scoring_pass_s))  # paired, as ``paired`` below
            stage_median = {k: statistics.median(s[k] for s in stage_runs) for k in stage_runs[0]}
            ratio = plain / algo
            paired = statistics.median(
                p / a for p, a in zip(plain_s, algo_s)
            )  # each rep's plain / algo: robust to load drifting between reps
            update_ratio = plain / stage_median["run_updates"]
            key = f"{agent}/{algorithm}"
            results[key] = {
                "tokens": tokens,
                "rows": len(rows),
                "cross_rows": sum(not r.is_own for r in rows),
                "plain_seconds": plain_s,
                "algo_seconds": algo_s,
                "scoring_pass_seconds": scoring_pass_s,
                "score_and_train_saving": saving,
                "stages": stage_runs,
                "stage_median": stage_median,
                "ratio": ratio,
                "ratio_paired": paired,
                "ratio_updates_only": update_ratio,
                "plain_tokens_per_second": tokens / plain,
                "algo_tokens_per_second": tokens / algo,
            }
            rows_out.append(
                [
                    agent,
                    algorithm,
                    len(rows),
                    tokens,
                    f"{tokens / plain:,.0f}",
                    f"{tokens / algo:,.0f}",
                    f"{ratio:.2f}",
                    f"{paired:.2f}",
                    f"{update_ratio:.2f}",
                    f"{algo:.3f}",
                    f"{scoring_pass:.3f}",
                    f"{saving:+.1%}",
                ]
                + [f"{stage_median[k] / algo:.0%}" for k in STAGES]
            )
            print(f"{key}: ratio {ratio:.2f} (paired {paired:.2f}, updates only {update_ratio:.2f})", flush=True)
    profiles = {}
    for agent in (LLAMA["name"],):
        context = contexts(spec_path, agent, "hacpo")
        profiles[f"{agent}/hacpo"] = profile_step(context, initial_weights(context))
    text = table(
        [
            "agent",
            "algorithm",
            "rows",
            "tokens",
            "plain tok/s",
            "algo tok/s",
            "ratio",
            "ratio (paired)",
            "ratio (updates only)",
            "algo s",
            "scoring pass s",
            "score-and-train saves (paired)",
            "gather",
            "advantages + plan",
            "pi_old",
            "exchange",
            "updates",
        ],
        rows_out,
    )
    print(
        f"\nlearner throughput ({args.prompts} prompts x G {args.group_size}, torch threads {args.threads}, median of {args.reps} interleaved reps; "
        f"stage columns: share of the algo step)\n{text}"
    )
    print("\ncProfile of one llama-char hacpo step (by own time):\n" + "\n".join(profiles[f"{LLAMA['name']}/hacpo"]))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "learner-quick" if args.quick else "learner",
        {
            "settings": settings,
            "table": text,
            "results": results,
            "profiles": profiles,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
