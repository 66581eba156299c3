"""Evaluation of one policy on the spec's eval sets: greedy avg@1, or avg@k and pass@k.

It takes what it uses: the policy (a model and its tokenizer, or an engine holding them), the
eval sets' problems (``EvalSet``), the scorer and how to sample (``EvalSampling``); no worker
context, no store (``eval_sets`` reads the sets' problems through the opener it is given).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from hacrl_core.data import PromptSource
from hacrl_core.data.base import Problem
from hacrl_core.data.templates import render_prompt
from hacrl_core.rewards import Scorer
from hacrl_core.rewards.scoring import RewardItem
from hacrl_core.rollout.engine import RolloutEngine, SamplingParams, create_engine
from hacrl_core.spec import AgentSpec, ExperimentSpec
from hacrl_core.spec import EvalSet as SpecEvalSet

if TYPE_CHECKING:
    from hacrl_core.rollout.hf_engine import HFEngine


@dataclass(frozen=True)
class EvalSet:
    """One eval set of the spec: its name and the problems evaluated (its first ``maxPrompts``)."""

    name: str
    problems: Sequence[Problem]


@dataclass(frozen=True)
class EvalSampling:
    """How an agent samples its eval responses: the spec's template and seed, the agent's rollout
    settings, k samples per prompt (greedy when 1)."""

    template: str
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    samples: int
    batch_size: int

    @classmethod
    def of(cls, spec: ExperimentSpec, agent: AgentSpec, samples: int | None = None) -> EvalSampling:
        """The agent's eval sampling; ``samples`` overrides ``evaluation.samples``."""
        rollout = agent.rollout
        return cls(
            template=spec.data.template,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            max_new_tokens=rollout.max_new_tokens,
            seed=spec.algorithm.seed,
            samples=samples or spec.evaluation.samples,
            batch_size=rollout.batch_size,
        )


def eval_sets(
    spec_sets: Sequence[SpecEvalSet], open_source: Callable[[str], PromptSource], names: Sequence[str] | None = None
) -> list[EvalSet]:
    """The spec's eval sets (``data.eval``; those of ``names`` only, when given), each its first
    ``maxPrompts`` problems; ``open_source``: a set's rows by its name (``WorkerContext.eval_source``)."""
    sets = []
    for spec_set in spec_sets:
        if names and spec_set.name not in names:
            continue
        source = open_source(spec_set.name)
        sets.append(EvalSet(spec_set.name, [source[i] for i in range(min(len(source), spec_set.max_prompts))]))
    return sets


def evaluate_policy(
    model, tokenizer, eval_sets: Sequence[EvalSet], scorer: Scorer, sampling: EvalSampling
) -> dict[str, float]:
    """`evaluate_engine` of a model already in memory (the learner's live policy), with `hf`."""
    engine = cast("HFEngine", create_engine("hf", batch_size=sampling.batch_size))  # imported on use
    engine.set_policy(model, tokenizer)
    return evaluate_engine(engine, eval_sets, scorer, sampling)


def evaluate_engine(
    engine: RolloutEngine, eval_sets: Sequence[EvalSet], scorer: Scorer, sampling: EvalSampling
) -> dict[str, float]:
    """`{"eval/<set>/accuracy": avg@k, "eval/<set>/pass@k": ...}` for every set of ``eval_sets``,
    sampled by ``engine`` (which holds the policy and its tokenizer)."""
    results: dict[str, float] = {}
    for eval_set in eval_sets:
        results.update(evaluate_set(engine, eval_set, scorer, sampling))
    return results


def evaluate_set(engine: RolloutEngine, eval_set: EvalSet, scorer: Scorer, sampling: EvalSampling) -> dict[str, float]:
    """One set's avg@k (and pass@k when k > 1)."""
    k = sampling.samples
    problems = eval_set.problems
    prompts = [render_prompt(engine.tokenizer, p.question, sampling.template) for p in problems]
    params = SamplingParams(
        n=k,
        greedy=k == 1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_new_tokens=sampling.max_new_tokens,
        seed=sampling.seed,
    )
    outputs = engine.generate(prompts, params)
    flat = scorer(
        [
            RewardItem(
                prompt,
                sample.text,
                problem.answer,
                {"question": problem.question},
                f"eval {eval_set.name} prompt {problem.uid} sample {i}",
            )
            for problem, prompt, group in zip(problems, prompts, outputs)
            for i, sample in enumerate(group)
        ]
    )
    scores, start = [], 0
    for group in outputs:
        scores.append(flat[start : start + len(group)])
        start += len(group)
    results = {f"eval/{eval_set.name}/accuracy": sum(sum(s) / len(s) for s in scores) / max(len(scores), 1)}
    if k > 1:
        results[f"eval/{eval_set.name}/pass@{k}"] = sum(max(s) for s in scores) / max(len(scores), 1)
    return results
