"""The rollout side of a step as stages: sample the step's prompts, then turn the samples into
scored rollout rows (docs/architecture.md, "One step", step 1). No store, no files: the rollout worker
writes what ``rollout_rows`` returns, and in-memory loops use the rows directly."""

from __future__ import annotations

import json
from collections.abc import Sequence

from hacrl_core.data.base import Problem
from hacrl_core.data.templates import render_prompt
from hacrl_core.models.tokenizers import tokenizer_fingerprint
from hacrl_core.rewards.scoring import RewardItem, Scorer
from hacrl_core.rollout.engine import RolloutEngine, Sample, SamplingParams


def sampling_version(step: int, max_staleness: int) -> int:
    """The weights version that samples ``step``: the step's own (on-policy), or up to
    ``max_staleness`` versions older so that sampling overlaps the learner's update. A fixed lag,
    not "the newest there is", so that a run and its resume sample with the same weights."""
    return max(0, step - max_staleness)


def sampling_seed(base_seed: int, step: int, agent_index: int) -> int:
    return (base_seed * 1_000_003 + step * 7919 + agent_index * 104_729) % (2**31)


def sampling_params(
    settings, *, group_size: int, seed: int, step: int, agent_index: int, first_prompt: int = 0
) -> SamplingParams:
    """G samples per prompt with the agent's rollout settings, seeded by (seed, step, agent).

    ``first_prompt``: the index in the step of the first prompt sampled with these parameters (a
    rollout replica's slice starts there). Its seed moves by ``first_prompt * G`` so that an
    engine that seeds each prompt of a call (vllm: prompt i gets ``seed + i * G``) gives every
    prompt of the step the same samples however the step is split among replicas. The hf engine
    draws one batch's samples from one torch generator, so its samples of a prompt depend on the
    batch it shares and differ between splits (still reproducible for a given split).
    """
    return SamplingParams(
        n=group_size,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=sampling_seed(seed, step, agent_index) + first_prompt * group_size,
    )


def sample_step(
    engine: RolloutEngine, problems: Sequence[Problem], template: str, params: SamplingParams
) -> tuple[list[str], list[list[Sample]]]:
    """Each problem rendered with the agent's own chat template, and its G samples."""
    prompts = [render_prompt(engine.tokenizer, p.question, template) for p in problems]
    return prompts, engine.generate(prompts, params)


def rollout_rows(
    problems: Sequence[Problem],
    prompts: Sequence[str],
    samples: Sequence[Sequence[Sample]],
    score: Scorer,
    *,
    experiment: str,
    agent: str,
    step: int,
    tokenizer,
    policy_version: int | None = None,
) -> list[dict]:
    """The step's rollout shard: one row per sample, its reward scored on the response text
    (``score``: every sample of the step in one call, ``rewards.scoring``); ``policy_version``: the
    weights that sampled it (default: the step's own)."""
    tokenizer_id = tokenizer_fingerprint(tokenizer)
    items = [
        RewardItem(
            prompt, sample.text, problem.answer, {"question": problem.question}, f"prompt {problem.uid} sample {index}"
        )
        for problem, prompt, group in zip(problems, prompts, samples)
        for index, sample in enumerate(group)
    ]
    rewards = iter(score(items))
    rows = []
    for problem, prompt, group in zip(problems, prompts, samples):
        for index, sample in enumerate(group):
            rows.append(
                {
                    "experiment": experiment,
                    "step": step,
                    "source_agent": agent,
                    "policy_version": step if policy_version is None else policy_version,
                    "tokenizer_id": tokenizer_id,
                    "prompt_uid": problem.uid,
                    "sample_index": index,
                    "prompt": prompt,
                    "response": sample.text,
                    "token_ids": sample.token_ids,
                    "reward": next(rewards),
                    "finish_reason": sample.finish_reason,
                    "extra": json.dumps({"question": problem.question, "answer": problem.answer}),
                }
            )
    return rows


def rollout_metrics(
    rows: Sequence[dict], step: int, seconds: dict[str, float], retries: dict[str, int] | None = None
) -> dict[str, float]:
    """The ``rollout/*`` metrics of a step's shard; ``seconds``: time per stage (load_weights,
    generate, reward, write); ``retries``: the reward server's retried requests by reason
    (``rewards.remote.take_retries``)."""
    tokens = sum(len(r["token_ids"]) for r in rows)
    return {
        "rollout/step": step,
        "rollout/weights_version": rows[0]["policy_version"],
        "rollout/reward_mean": sum(r["reward"] for r in rows) / len(rows),
        "rollout/responses": len(rows),
        "rollout/response_tokens": tokens,
        "rollout/response_tokens_mean": tokens / len(rows),
        "rollout/stop_fraction": sum(r["finish_reason"] == "stop" for r in rows) / len(rows),
        "rollout/tokens_per_second": tokens / max(seconds["generate"], 1e-9),
        # Spelled out: dashboards and docs/metrics.md name these series (tests look them up here).
        "rollout/seconds_load_weights": seconds["load_weights"],
        "rollout/seconds_generate": seconds["generate"],
        "rollout/seconds_reward": seconds["reward"],
        "rollout/seconds_write": seconds["write"],
        **(retries or {}),
    }
