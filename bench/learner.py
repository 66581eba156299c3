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
import contextlib
import copy
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from dataclasses import dataclass, field
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
    p.add_argument("--itemise-reps", type=int, default=None, help="repetitions of the itemised comparison (--reps)")
    p.add_argument(
        "--itemise-only", action="store_true", help="only the itemised comparison (no stage table, no profile)"
    )
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="the itemised comparison's clock: wall, or this process's CPU time (with --threads 1 the "
        "time torch computes, less sensitive to other processes on a loaded machine)",
    )
    p.add_argument(
        "--keep-store", action="store_true", help="reuse the store an earlier run left in --work (no new hacrl run)"
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/learner"))
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.reps = 16, 2
        args.itemise_reps = args.itemise_reps or 1
    return args


def make_store(args: argparse.Namespace) -> tuple[Path, str]:
    """A one-step hacpo run: step 0's rollouts and scores of both agents in a file store."""
    import shutil

    name = "bench-learner-q" if args.quick else "bench-learner"
    store_dir = args.work / "store"
    spec_file = args.work / f"{name}.yaml"
    if args.keep_store and (store_dir / name).is_dir() and spec_file.is_file():
        return spec_file, name
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
    spec_path = write_spec(doc, spec_file)
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


def plain_step(context, state, rows, plan, clock: Itemised | None = None) -> float:
    """Forward (the logits of the response positions only), response-token cross-entropy, backward,
    clip, AdamW: the same batches, nothing else. ``clock``: each item's seconds into it (the
    log-softmax, gather and loss count as "log-prob gather")."""
    import torch

    from hacrl_core.learner.batch import collate_rows
    from hacrl_core.learner.state import pad_id

    pad = pad_id(state.tokenizer)
    model, backend = state.backend.model, state.backend
    clock = clock or Itemised()
    began = clock.now()
    last = [began]

    def lap(item: str) -> None:
        now = clock.now()
        clock.add(item, now - last[0])
        last[0] = now

    for micro in plan.micro_batches:  # the same micro-batches as the algo step's
        backend.zero_grad()
        lap("zero_grad")
        for chunk in micro:
            input_ids, attention, response = collate_rows([rows[i] for i in chunk], pad)
            lap("collate (padding)")
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
            lap("forward")
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, first:, None]).squeeze(-1)
            mask = response[:, first:].float()
            loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
            lap("log-prob gather")
            backend.backward(loss)
            lap("backward")
        backend.step()
        lap("optimizer (clip + AdamW)")
    return clock.now() - began


class Itemised:
    """Seconds per item of a step, exclusive: each wrapped call's time less that of the wrapped
    calls inside it; inside a call wrapped with ``scope`` everything counts as the scope's item."""

    def __init__(self, now=time.perf_counter) -> None:
        self.now = now  # the clock: ``time.perf_counter`` (wall) or ``time.process_time`` (CPU)
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open call: [start, seconds of wrapped calls inside]
        self._scope = False

    def add(self, item: str, seconds: float) -> None:
        self.seconds[item] = self.seconds.get(item, 0.0) + seconds

    def wrap(self, item: str, function, *, scope: bool = False):
        def timed(*args, **kwargs):
            if self._scope:  # inside a scope: the scope's clock counts this call
                return function(*args, **kwargs)
            self._scope = scope
            self._stack.append([self.now(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                start, inside = self._stack.pop()
                spent = self.now() - start
                self.add(item, spent - inside)
                if self._stack:
                    self._stack[-1][1] += spent
                self._scope = False

        return timed


_UNSET = object()


@contextlib.contextmanager
def patched(targets: list[tuple[Any, str, Any]]):
    """``setattr(owner, name, value)`` for each target for the block, then the old values back."""
    saved = [(owner, name, vars(owner).get(name, _UNSET)) for owner, name, _ in targets]
    try:
        for owner, name, value in targets:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, old in reversed(saved):
            if old is _UNSET:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


#: The items of a step, in the order they are printed (``itemised_algo_step``, ``plain_step``).
ITEMS = (
    "collate (padding)",
    "forward",
    "log-prob gather",
    "loss + metrics",
    "backward",
    "optimizer (clip + AdamW)",
    "zero_grad",
    "pi_old scoring pass",
    "pi_old from the first forward",
    "per-micro-batch inputs",
    "other",
)


def itemised_algo_step(
    context, state, ports=None, setup=None, now=time.perf_counter
) -> tuple[dict[str, float], list, Any]:
    """``algo_step`` (or ``learner_step`` on ``ports`` and ``setup``) with each item of
    ``ITEMS`` timed: the learner's functions wrapped for the step. "pi_old scoring pass" is the
    no-grad scoring of own rows outside the first update, all of it (its collate, forward and
    gather); "pi_old from the first forward" is ``score_and_train``'s own work (reading each
    row's pi_old out of the first update's forward); "per-micro-batch inputs" is
    ``train_micro_batch``'s own (pi_old into a tensor, the loss inputs); "other" is the rest of
    the step (reading and encoding shards, advantages, the plan, the exchange, the loop)."""
    from hacrl_core.learner import batch, stages, updates

    clock = Itemised(now)
    backend, model = state.backend, state.backend.model
    train = clock.wrap("per-micro-batch inputs", updates.train_micro_batch)
    targets = [
        (batch, "collate_rows", clock.wrap("collate (padding)", batch.collate_rows)),
        (updates, "collate_rows", clock.wrap("collate (padding)", updates.collate_rows)),
        (model, "forward", clock.wrap("forward", model.forward)),
        (updates, "sequence_logprobs", clock.wrap("log-prob gather", updates.sequence_logprobs)),
        (stages, "score_sliced", clock.wrap("pi_old scoring pass", stages.score_sliced, scope=True)),
        (stages, "score_and_train", clock.wrap("pi_old from the first forward", stages.score_and_train)),
        (updates, "train_micro_batch", train),
        (stages, "train_micro_batch", train),
        (updates, "micro_batch_loss", clock.wrap("loss + metrics", updates.micro_batch_loss)),
        (backend, "backward", clock.wrap("backward", backend.backward)),
        (backend, "step", clock.wrap("optimizer (clip + AdamW)", backend.step)),
        (backend, "zero_grad", clock.wrap("zero_grad", backend.zero_grad)),
    ]
    with patched(targets):
        began = now()
        if ports is None:
            _stages, _tokens, rows, plan = algo_step(context, state)
        else:
            from hacrl_core.learner.step import learner_step, run_step

            result = run_step(learner_step(state, setup, ports, 0))
            rows, plan = result.rows, result.plan
        total = now() - began
    clock.add("other", total - sum(clock.seconds.values()))
    clock.seconds["total"] = total
    return clock.seconds, rows, plan


@dataclass
class SyntheticPorts:
    """``StepPorts`` of one isolated learner whose own rows are given (no store, no peers)."""

    rows: list
    agents: int
    rollouts: list = field(init=False)

    def __post_init__(self) -> None:
        self.rollouts = [{"policy_version": 0} for _ in self.rows]

    def read_own_rows(self, step: int):
        return self.rollouts, self.rows

    def read_peer_rows(self, step: int):
        return [None] * self.agents, [None] * self.agents

    def publish_scores(self, scores) -> None:
        return None

    def read_peer_scores(self, step: int, rollouts) -> list:
        return [None] * self.agents


def raw_setup_step(context, *, prompts: int = 16, group: int = 8, prompt_tokens: int = 16, new_tokens: int = 16):
    """``bench/peer_trl.py``'s raw setup at ``prompt_tokens`` prompt tokens as a learner step:
    GRPO, ``prompts`` x G ``group`` own rows, one optimizer update, the learner's default
    micro-batching (on a CPU all rows in one micro-batch). The token ids are drawn at random (a
    step's cost depends on the shapes, not on which tokens): every prompt ``prompt_tokens`` long,
    responses ``new_tokens`` long but for one row in five one shorter (15.8 a row, as sampled
    there). Returns (setup, ports) for ``learner_step``."""
    import dataclasses
    import random

    from hacrl_core.algorithms import resolve_algorithm
    from hacrl_core.learner.batch import TrainRow
    from hacrl_core.learner.worker import step_setup

    spec = context.spec
    spec.algorithm.mini_batch_prompts = prompts
    members = tuple(spec.team())
    setup = dataclasses.replace(
        step_setup(context, resolve_algorithm(spec.algorithm), members), score_in_first_update=True
    )
    draw = random.Random(0)
    vocab = 300  # under every tiny tokenizer's size
    rows = []
    for p in range(prompts):
        prompt = [draw.randrange(3, vocab) for _ in range(prompt_tokens)]
        for g in range(group):
            length = new_tokens - (1 if (p * group + g) % 5 == 0 else 0)
            response = [draw.randrange(3, vocab) for _ in range(length)]
            rows.append(
                TrainRow(
                    setup.agent_index,
                    f"p{p}",
                    float(draw.random() < 0.5),
                    prompt + response,
                    [0] * prompt_tokens + [1] * length,
                    True,
                )
            )
    return setup, SyntheticPorts(rows, len(members))


def step_batches(context, state, ports=None, setup=None) -> tuple[list, Any]:
    """The rows and plan of a step (``algo_step``, or ``learner_step`` on ``ports``), for the plain loop."""
    if ports is None:
        _stages, _tokens, rows, plan = algo_step(context, state)
        return rows, plan
    from hacrl_core.learner.step import learner_step, run_step

    result = run_step(learner_step(state, setup, ports, 0))
    return result.rows, result.plan


def itemise(cases, reps: int, now=time.perf_counter) -> tuple[dict[str, Any], list[list[Any]]]:
    """Per case (label, context, initial weights, ports or None, setup or None): ``reps``
    interleaved algo / plain steps on the same batches, each itemised; medians per item."""
    results: dict[str, Any] = {}
    table_rows: list[list[Any]] = []
    for label, context, initial, ports, setup in cases:
        algo_runs, plain_runs = [], []
        for rep in range(reps):
            # Each order every other repetition; every state frozen out of the cyclic collector
            # once built, as the learner worker freezes its own (``freeze_long_lived_objects``).
            for side in ("algo", "plain") if rep % 2 == 0 else ("plain", "algo"):
                state = fresh_state(context, initial)
                gc.collect()
                gc.freeze()
                if side == "algo":
                    seconds, rows, plan = itemised_algo_step(context, state, ports, setup, now)
                    algo_runs.append(seconds)
                    continue
                if rep % 2 == 1:  # plain first: the step's batches from an unclocked algo step
                    rows, plan = step_batches(context, fresh_state(context, initial), ports, setup)
                clock = Itemised(now)
                clock.seconds["total"] = plain_step(context, state, rows, plan, clock)
                plain_runs.append(clock.seconds)
        algo = {k: statistics.median(r.get(k, 0.0) for r in algo_runs) for k in (*ITEMS, "total")}
        plain = {k: statistics.median(r.get(k, 0.0) for r in plain_runs) for k in (*ITEMS, "total")}
        ratio = statistics.median(p["total"] / a["total"] for p, a in zip(plain_runs, algo_runs))
        padded = sum(
            len(max((rows[i] for i in c), key=lambda r: len(r.input_ids)).input_ids) * len(c)
            for micro in plan.micro_batches
            for c in micro
        )
        real = sum(len(rows[i].input_ids) for micro in plan.micro_batches for c in micro for i in c)
        results[label] = {
            "algo": algo,
            "plain": plain,
            "algo_runs": algo_runs,
            "plain_runs": plain_runs,
            "ratio_paired": ratio,
            "micro_batches": sum(len(m) for m in plan.micro_batches),
            "padding_share": 1 - real / padded,
        }
        gap = algo["total"] - plain["total"]
        for item in (*ITEMS, "total"):
            extra = algo[item] - plain[item]
            table_rows.append(
                [
                    label if item == ITEMS[0] else "",
                    item,
                    f"{plain[item] * 1000:.1f}",
                    f"{algo[item] * 1000:.1f}",
                    f"{extra * 1000:+.1f}",
                    f"{extra / gap:.0%}" if item != "total" and gap > 0 else "",
                    f"{ratio:.2f}" if item == "total" else "",
                ]
            )
        print(
            f"{label}: plain / algo {plain['total'] / algo['total']:.2f} (paired {ratio:.2f}), "
            f"{results[label]['micro_batches']} micro-batches, padding {results[label]['padding_share']:.1%}",
            flush=True,
        )
    return results, table_rows


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


def stage_comparison(args: argparse.Namespace, spec_path: Path) -> tuple[dict[str, Any], str, dict[str, list[str]]]:
    """The algo step stage by stage against the plain loop, per agent and algorithm (``--reps``
    interleaved repetitions), and a cProfile of one llama-char hacpo step."""
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
            update_ratio = plain / (stage_median["score_pi_old"] + stage_median["run_updates"])
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
            print(f"{key}: ratio {ratio:.2f} (paired {paired:.2f}, pi_old + updates {update_ratio:.2f})", flush=True)
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
            "ratio (pi_old + updates)",
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
    return results, text, profiles


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
    text, profiles = "", dict[str, list[str]]()
    if not args.itemise_only:
        results, text, profiles = stage_comparison(args, spec_path)
    cases = []
    for agent in (LLAMA["name"], QWEN["name"]):
        for algorithm in ("hacpo", "gspo"):
            context = contexts(spec_path, agent, algorithm)
            cases.append((f"{agent}/{algorithm}", context, initial_weights(context), None, None))
    context = contexts(spec_path, QWEN["name"], "grpo")
    setup, ports = raw_setup_step(context)
    cases.append(("raw16 (peer_trl) qwen-bpe/grpo", context, initial_weights(context), ports, setup))
    now = time.process_time if args.clock == "cpu" else time.perf_counter
    itemised, item_rows = itemise(cases, args.itemise_reps or args.reps, now)
    items_text = table(
        ["case", "item", "plain ms", "algo ms", "algo - plain ms", "share of gap", "plain / algo (paired)"], item_rows
    )
    print(
        f"\nwhere the algo step's time goes against the plain loop ({args.clock} seconds, torch threads {args.threads}, median of "
        f"{args.itemise_reps or args.reps} interleaved reps per item; exclusive times)\n{items_text}"
    )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "learner-quick" if args.quick else "learner",
        {
            "settings": settings,
            "table": text,
            "results": results,
            "itemised_table": items_text,
            "itemised": itemised,
            "profiles": profiles,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
