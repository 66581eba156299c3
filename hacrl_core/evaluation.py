"""Evaluation of one policy on the spec's eval sets: greedy avg@1, or avg@k and pass@k."""

from __future__ import annotations

from hacrl_core.context import WorkerContext
from hacrl_core.data.templates import render_prompt
from hacrl_core.rewards.scoring import RewardItem
from hacrl_core.rollout.engine import RolloutEngine, SamplingParams, create_engine


def evaluate_policy(
    context: WorkerContext, model, tokenizer, *, samples: int | None = None, sets: list[str] | None = None
) -> dict[str, float]:
    """`evaluate_engine` of a model already in memory (the learner's live policy), with `hf`."""
    engine = create_engine("hf", batch_size=context.agent.rollout.batch_size)  # its module is imported on use
    engine.set_policy(model, tokenizer)
    return evaluate_engine(context, engine, samples=samples, sets=sets)


def evaluate_engine(
    context: WorkerContext, engine: RolloutEngine, *, samples: int | None = None, sets: list[str] | None = None
) -> dict[str, float]:
    """`{"eval/<set>/accuracy": avg@k, "eval/<set>/pass@k": ...}` for every eval set of the spec,
    sampled by ``engine`` (which holds the policy and its tokenizer)."""
    spec = context.spec
    tokenizer = engine.tokenizer
    k = samples or spec.evaluation.samples
    results: dict[str, float] = {}
    for eval_set in spec.data.eval:
        if sets and eval_set.name not in sets:
            continue
        source = context.eval_source(eval_set.name)
        problems = [source[i] for i in range(min(len(source), eval_set.max_prompts))]
        prompts = [render_prompt(tokenizer, p.question, spec.data.template) for p in problems]
        params = SamplingParams(
            n=k,
            greedy=k == 1,
            temperature=context.agent.rollout.temperature,
            top_p=context.agent.rollout.top_p,
            max_new_tokens=context.agent.rollout.max_new_tokens,
            seed=spec.algorithm.seed,
        )
        outputs = engine.generate(prompts, params)
        flat = context.score(
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
        results[f"eval/{eval_set.name}/accuracy"] = sum(sum(s) / len(s) for s in scores) / max(len(scores), 1)
        if k > 1:
            results[f"eval/{eval_set.name}/pass@{k}"] = sum(max(s) for s in scores) / max(len(scores), 1)
    return results
