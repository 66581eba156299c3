"""The rollout worker: `hacrl worker rollout --spec S --agent A`.

For each step t: wait for the agent's weights version t (step 0: the initial checkpoint, which is
what version 0 holds), sample G responses for each of the
step's prompts with the agent's own chat template, score the response text, write the shard.
A restarted worker continues at the first step whose shard is missing.
"""

from __future__ import annotations

import json
import shutil
import time

from hacrl_core.data.templates import render_prompt
from hacrl_core.metrics import WorkerMetrics
from hacrl_core.models.tokenizers import tokenizer_fingerprint
from hacrl_core.rollout.engine import SamplingParams, engine_for
from hacrl_core.runtime.context import WorkerContext, log


def sampling_seed(base_seed: int, step: int, agent_index: int) -> int:
    return (base_seed * 1_000_003 + step * 7919 + agent_index * 104_729) % (2**31)


def first_missing_step(context: WorkerContext) -> int:
    step = 0
    while step < context.spec.algorithm.steps and context.store.rollouts_ready(step, context.agent_name):
        step += 1
    return step


def run_rollout_worker(context: WorkerContext) -> None:
    spec, agent = context.spec, context.agent
    settings = agent.rollout
    metrics = WorkerMetrics(context.experiment.name, agent.name, "rollout")
    metrics.serve(spec.metrics.port, spec.metrics.bind_address)
    for report in context.dataset_reports(include_eval=False):  # logs what the reader skipped
        metrics.publish(report.metrics())
    engine = engine_for(settings)
    reward = context.reward_fn
    start = first_missing_step(context)
    if start:
        log.info("rollout %s: steps 0..%d already written, resuming at %d", agent.name, start - 1, start)
    weights_root = context.work_dir / "rollout-weights"
    for step in range(start, spec.algorithm.steps):
        began = time.perf_counter()
        local = weights_root / f"{step:06d}"
        if step == 0:
            # Version 0 is the initial model, which the learner is still loading to publish:
            # sampling from the same checkpoint now takes the learner's start-up off the critical
            # path (its pi_old is the learner's own scoring either way).
            engine.load(context.initial_model_dir())
        else:
            context.store.fetch_weights(agent.name, step, local, wait=context.wait_seconds)
            engine.load(local)
        shutil.rmtree(weights_root / f"{step - 1:06d}", ignore_errors=True)
        loaded = time.perf_counter()

        problems = context.step_problems(step)
        prompts = [render_prompt(engine.tokenizer, p.question, spec.data.template) for p in problems]
        params = SamplingParams(
            n=spec.algorithm.group_size,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_new_tokens=settings.max_new_tokens,
            seed=sampling_seed(spec.algorithm.seed, step, context.agent_index),
        )
        samples = engine.generate(prompts, params)
        generated = time.perf_counter()

        tok_id = tokenizer_fingerprint(engine.tokenizer)
        rows = []
        for problem, prompt, group in zip(problems, prompts, samples):
            for index, sample in enumerate(group):
                rows.append(
                    {
                        "experiment": context.experiment.name,
                        "step": step,
                        "source_agent": agent.name,
                        "policy_version": step,
                        "tokenizer_id": tok_id,
                        "prompt_uid": problem.uid,
                        "sample_index": index,
                        "prompt": prompt,
                        "response": sample.text,
                        "token_ids": sample.token_ids,
                        "reward": float(reward(sample.text, problem.answer)),
                        "finish_reason": sample.finish_reason,
                        "extra": json.dumps({"question": problem.question, "answer": problem.answer}),
                    }
                )
        scored = time.perf_counter()
        context.store.write_rollouts(step, agent.name, rows)
        written = time.perf_counter()

        tokens = sum(len(r["token_ids"]) for r in rows)
        values = {
            "rollout/step": step,
            "rollout/weights_version": step,
            "rollout/reward_mean": sum(r["reward"] for r in rows) / len(rows),
            "rollout/response_tokens_mean": tokens / len(rows),
            "rollout/stop_fraction": sum(r["finish_reason"] == "stop" for r in rows) / len(rows),
            "rollout/tokens_per_second": tokens / max(generated - loaded, 1e-9),
            "rollout/seconds_load_weights": loaded - began,
            "rollout/seconds_generate": generated - loaded,
            "rollout/seconds_reward": scored - generated,
            "rollout/seconds_write": written - scored,
        }
        metrics.publish(values)
        log.info("rollout %s step %d: reward %.3f, %d tokens", agent.name, step, values["rollout/reward_mean"], tokens)
