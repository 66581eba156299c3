"""The learner worker: `hacrl worker learner --spec S --agent A`.

One training step is a short sequence of named stages (DESIGN.md section 2):

    score_own_rows -> gather_rows -> update_capability -> assign_advantages
    -> run_updates -> publish_weights -> evaluate -> report -> checkpoint

A restarted learner restores its latest checkpoint (N completed steps) and runs step N next;
shards already in the store are reused, never written twice.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from dataclasses import dataclass, field

import torch

from hacrl_core.algorithms import (
    CapabilityTracker,
    PolicyLossInputs,
    get_algorithm,
    group_advantages,
    kl_penalty,
)
from hacrl_core.learner.backends import TrainingBackend, backend_factory, create_backend
from hacrl_core.learner.batch import (
    TrainRow,
    collate_rows,
    encode_rows,
    micro_batches,
    score_rows,
)
from hacrl_core.learner.checkpoint import restore_checkpoint, save_checkpoint
from hacrl_core.learner.guards import ensure_finite_weights, is_finite
from hacrl_core.metrics import WorkerMetrics
from hacrl_core.models.loading import default_device, load_policy, save_policy
from hacrl_core.models.logprobs import sequence_logprobs
from hacrl_core.runtime.context import WorkerContext
from hacrl_core.runtime.evaluation import evaluate_policy
from hacrl_core.runtime.sharing import shared_rows_used, sharing_warning

log = logging.getLogger("hacrl")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class LearnerState:
    model: torch.nn.Module
    tokenizer: object
    backend: TrainingBackend
    tracker: CapabilityTracker
    next_step: int
    reference: torch.nn.Module | None = None
    device: str = "cpu"
    timings: dict[str, float] = field(default_factory=dict)


def initialize(context: WorkerContext, device: str | None = None) -> LearnerState:
    device = device or default_device()
    spec, settings = context.spec, context.agent.learner
    algorithm = spec.algorithm
    dtype = DTYPES[settings.dtype]
    tracker = CapabilityTracker(
        len(spec.agents), algorithm.capability_window, algorithm.capability_floor, tuple(algorithm.ratio_bounds), algorithm.warmup_steps
    )
    latest = context.store.latest_checkpoint(context.agent_name)
    if latest is not None:
        factory = backend_factory(settings.backend)
        model, tokenizer, optimizer_state, capability_state, local = restore_checkpoint(
            context.store, context.agent_name, latest, context.work_dir, device, dtype, factory.checkpoint_globals
        )
        backend = factory(model, settings)
        backend.load_optimizer_state(optimizer_state)
        tracker.load_state_dict(capability_state)
        shutil.rmtree(local, ignore_errors=True)
        next_step = latest
        log.info("learner %s: resumed from checkpoint after %d steps", context.agent_name, latest)
    else:
        model, tokenizer = load_policy(context.initial_model_dir(), dtype=dtype, device=device)
        backend = create_backend(settings.backend, model, settings)
        next_step = 0
    reference = None
    if algorithm.kl_coef > 0:  # 0 must skip loading the reference entirely
        reference, _ = load_policy(context.initial_model_dir(), dtype=dtype, device=device)
        reference.eval().requires_grad_(False)
    backend.model.train()
    return LearnerState(backend.unwrapped_model(), tokenizer, backend, tracker, next_step, reference, device)


def publish_weights(context: WorkerContext, state: LearnerState, version: int) -> None:
    local = context.work_dir / f"publish-{version:06d}"
    shutil.rmtree(local, ignore_errors=True)
    with state.backend.gathered_weights() as model:
        ensure_finite_weights(model, context.agent_name, f"publish weights version {version}")
        save_policy(model, state.tokenizer, local)
    context.store.publish_weights(context.agent_name, version, local)
    shutil.rmtree(local, ignore_errors=True)


def plan_updates(context: WorkerContext, step: int, rows: list[TrainRow]) -> list[list[int]]:
    """Row indices of each optimizer update of the step: per epoch a seeded shuffle of the step's
    prompts, cut into mini-batches of ``miniBatchPrompts`` whole prompt groups."""
    algorithm = context.spec.algorithm
    by_prompt: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        by_prompt.setdefault(row.group, []).append(index)
    prompts = list(by_prompt)
    order = random.Random(f"{algorithm.seed}/{step}/{context.agent_index}")
    updates = []
    for _epoch in range(algorithm.epochs):
        shuffled = prompts[:]
        order.shuffle(shuffled)
        for start in range(0, len(shuffled), algorithm.mini_batch_prompts):
            updates.append([i for uid in shuffled[start : start + algorithm.mini_batch_prompts] for i in by_prompt[uid]])
    return updates


def score_own_rows(context: WorkerContext, state: LearnerState, step: int) -> tuple[list[dict], list[TrainRow]]:
    """The agent's own rows of ``step`` with their old log-probs under weights version ``step``.

    Algorithms that share rows publish these scores at once (peers wait for them). Isolated
    algorithms (nobody else reads them) skip the rows of the step's first update: the weights
    have not moved when that update runs, so its own forward pass gives their pi_old exactly
    (``run_updates`` fills ``logp_old_mean`` from it) and one no-grad pass over those rows is
    saved; their scores are published after the update (``publish_own_scores``).
    """
    own_rollouts = context.store.read_rollouts(step, context.agent_name, wait=context.wait_seconds)
    rows = encode_rows(own_rollouts, source=context.agent_index, is_own=True, tokenizer=state.tokenizer, template=context.spec.data.template)
    shares_rows = get_algorithm(context.spec.algorithm.name).shares_rows
    deferred = set() if shares_rows else set(plan_updates(context, step, rows)[0])
    scored = [row for index, row in enumerate(rows) if index not in deferred]
    sums, counts, tokens = score_rows(state.model, scored, pad_id(state.tokenizer), context.agent.learner.micro_batch_size, state.device)
    for row, total, count, token_logps in zip(scored, sums, counts, tokens):
        row.logp_old_mean = total / max(count, 1)
        row.logp_old_tokens = token_logps
    for index in deferred:
        rows[index].logp_old_mean = None
    if shares_rows:
        publish_own_scores(context, step, own_rollouts, rows)
    return own_rollouts, rows


def publish_own_scores(context: WorkerContext, step: int, own_rollouts: list[dict], rows: list[TrainRow]) -> None:
    """The scores shard of ``step`` (pi_old of every own row), unless a previous attempt wrote it."""
    if context.store.scores_ready(step, context.agent_name):
        return
    context.store.write_scores(
        step,
        context.agent_name,
        [
            {
                "experiment": context.experiment.name,
                "step": step,
                "source_agent": context.agent_name,
                "prompt_uid": rollout["prompt_uid"],
                "sample_index": rollout["sample_index"],
                "logp_sum": row.logp_old_mean * sum(row.response_mask),
                "token_count": sum(row.response_mask),
            }
            for rollout, row in zip(own_rollouts, rows)
        ],
    )


def gather_rows(context: WorkerContext, state: LearnerState, step: int, own_rows: list[TrainRow]):
    """Every agent's rows of the step (shared algorithms) and each agent's mean reward."""
    algorithm = get_algorithm(context.spec.algorithm.name)
    mean_rewards = [0.0] * len(context.agent_names)
    mean_rewards[context.agent_index] = sum(r.reward for r in own_rows) / max(len(own_rows), 1)
    rows = list(own_rows)
    if not algorithm.shares_rows:
        return rows, mean_rewards
    for index, name in enumerate(context.agent_names):
        if name == context.agent_name:
            continue
        rollouts = context.store.read_rollouts(step, name, wait=context.wait_seconds)
        cross = encode_rows(rollouts, source=index, is_own=False, tokenizer=state.tokenizer, template=context.spec.data.template)
        if algorithm.cross_old_logprob == "source":
            scores = context.store.read_scores(step, name, wait=context.wait_seconds)
            by_key = {(s["prompt_uid"], s["sample_index"]): s for s in scores}
            for row, rollout in zip(cross, rollouts):
                score = by_key[(rollout["prompt_uid"], rollout["sample_index"])]
                row.logp_old_mean = score["logp_sum"] / max(score["token_count"], 1)
        else:  # the learner's own pre-update view of the row (naive sharing)
            sums, counts, _ = score_rows(state.model, cross, pad_id(state.tokenizer), context.agent.learner.micro_batch_size, state.device)
            for row, total, count in zip(cross, sums, counts):
                row.logp_old_mean = total / max(count, 1)
        mean_rewards[index] = sum(r.reward for r in cross) / max(len(cross), 1)
        rows.extend(cross)
    return rows, mean_rewards


def assign_advantages(context: WorkerContext, state: LearnerState, rows: list[TrainRow]):
    """Advantages (mechanism 1) and cross-row discrepancy weights (mechanism 2) of every row."""
    spec_algorithm = context.spec.algorithm
    algorithm = get_algorithm(spec_algorithm.name)
    ablations = spec_algorithm.ablations
    mode = algorithm.advantage_mode
    if mode == "hacpo" and not ablations.capability_advantage:
        mode = "naive"
    groups = {uid: i for i, uid in enumerate(dict.fromkeys(r.group for r in rows))}
    capability = torch.ones(len(context.agent_names), dtype=torch.float64) if state.tracker.in_warmup else state.tracker.capability
    advantages = group_advantages(
        torch.tensor([r.reward for r in rows], dtype=torch.float64),
        torch.tensor([groups[r.group] for r in rows]),
        torch.tensor([r.source for r in rows]),
        context.agent_index,
        capability,
        mode=mode,
        bounds=tuple(spec_algorithm.ratio_bounds),
    )
    ratios = state.tracker.ratio_matrix()
    use_discrepancy = algorithm.name == "hacpo" and ablations.discrepancy_coefficient
    discrepancy = torch.tensor(
        [1.0 if r.is_own or not use_discrepancy else float(ratios[r.source, context.agent_index]) for r in rows],
        dtype=torch.float64,
    )
    return advantages, discrepancy


def run_updates(context: WorkerContext, state: LearnerState, step: int, rows: list[TrainRow], advantages, discrepancy):
    """The step's optimizer updates (``plan_updates``), each in micro-batches of rows."""
    spec_algorithm = context.spec.algorithm
    settings = context.agent.learner
    algorithm = get_algorithm(spec_algorithm.name)
    collected: dict[str, list[float]] = {}
    pad = pad_id(state.tokenizer)
    device = state.device
    advantages, discrepancy = advantages.to(device), discrepancy.to(device)
    updates = plan_updates(context, step, rows)
    skipped = 0
    for update_index, members in enumerate(updates):
        norm = _normalizer(algorithm.aggregation, [rows[i] for i in members])
        state.backend.zero_grad()
        finite_loss = True
        for chunk in micro_batches(members, settings.micro_batch_size):
            chunk_rows = [rows[i] for i in chunk]
            input_ids, attention, response = collate_rows(chunk_rows, pad, device)
            logp_new = sequence_logprobs(state.backend.model, input_ids, attention, response)
            response_mask = response.to(logp_new.dtype)
            logp_old = torch.zeros_like(logp_new)
            for j, row in enumerate(chunk_rows):
                if row.logp_old_mean is None:  # deferred by score_own_rows: pi_old is pi_new here
                    if update_index != 0:
                        raise RuntimeError("a row without pi_old reached a later update; score_own_rows deferred the wrong rows")
                    old = logp_new[j].detach()
                    row.logp_old_tokens = old[: len(row.input_ids)].cpu()
                    row.logp_old_mean = float((old * response_mask[j]).sum() / response_mask[j].sum().clamp(min=1))
                if row.logp_old_tokens is not None:
                    logp_old[j, : row.logp_old_tokens.shape[0]] = row.logp_old_tokens
            inputs = PolicyLossInputs(
                logp_new=logp_new,
                response_mask=response_mask,
                logp_old_mean=torch.tensor([r.logp_old_mean for r in chunk_rows], dtype=logp_new.dtype, device=device),
                logp_old=logp_old,
                advantages=advantages[chunk].to(logp_new.dtype),
                is_own=torch.tensor([r.is_own for r in chunk_rows], device=device),
                discrepancy=discrepancy[chunk].to(logp_new.dtype),
                update_index=update_index,
            )
            loss, metrics = algorithm.policy_loss(inputs, spec_algorithm)
            share = _normalizer(algorithm.aggregation, chunk_rows) / norm
            total = loss * share
            if state.reference is not None and inputs.is_own.any():
                with torch.no_grad():
                    ref_logp = sequence_logprobs(state.reference, input_ids, attention, response)
                kl = kl_penalty(logp_new, ref_logp, inputs.response_mask, inputs.is_own)
                total = total + spec_algorithm.kl_coef * kl * (float(inputs.is_own.sum()) / len(chunk_rows)) * share
                metrics["kl"] = float(kl)
            if not is_finite(total):
                finite_loss = False  # no backward: the update is skipped below
                break
            state.backend.backward(total)
            for key, value in metrics.items():
                collected.setdefault(key, []).append(value)
        grad_norm = state.backend.step() if finite_loss else float("nan")  # backends skip a non-finite gradient
        if not is_finite(grad_norm):  # its gradients are dropped by the next update's zero_grad (or the last one)
            skipped += 1
            log.warning("learner %s step %d update %d: non-finite %s; update skipped", context.agent_name, step, update_index,
                        "gradient norm" if finite_loss else "loss")
        else:
            collected.setdefault("grad_norm", []).append(grad_norm)
    state.backend.zero_grad()
    summary = {f"learner/{key}": sum(values) / len(values) for key, values in collected.items()}
    summary["learner/updates"] = len(updates)
    summary["learner/skipped_updates"] = skipped
    return summary


def _normalizer(aggregation: str, rows) -> float:
    if aggregation == "tokens":
        return float(sum(sum(r.response_mask) for r in rows)) or 1.0
    return float(len(rows)) or 1.0


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def run_learner_worker(context: WorkerContext) -> None:
    torch.manual_seed(context.spec.algorithm.seed * 1000 + context.agent_index)
    spec, agent = context.spec, context.agent
    metrics = WorkerMetrics(context.experiment.name, agent.name, "learner")
    metrics.serve(spec.metrics.port, spec.metrics.bind_address)
    state = initialize(context)
    store = context.store
    # The learner reads the training set too (the rollout worker samples from it) so that its
    # heartbeat tells the operator what every dataset of the spec lost to bad rows.
    datasets = context.dataset_reports()
    data_metrics = {key: value for report in datasets for key, value in report.metrics().items()}
    metrics.publish(data_metrics)
    if state.next_step == 0 and store.latest_weights_version(agent.name) is None:
        publish_weights(context, state, 0)
    initial_eval = {}
    if state.next_step == 0 and spec.data.eval:
        with state.backend.gathered_weights() as model:
            initial_eval = {f"{k}_initial": v for k, v in evaluate_policy(context, model, state.tokenizer).items()}
    last_checkpoint = store.latest_checkpoint(agent.name)
    steps_metrics: list[dict] = []  # this process's steps, for the sharing warning (said once)
    warned = False
    for step in range(state.next_step, spec.algorithm.steps):
        clock = [time.perf_counter()]

        def lap() -> float:
            clock.append(time.perf_counter())
            return clock[-1] - clock[-2]

        own_rollouts, own_rows = score_own_rows(context, state, step)
        seconds_score = lap()
        rows, mean_rewards = gather_rows(context, state, step, own_rows)
        seconds_wait = lap()
        shares_rows = get_algorithm(spec.algorithm.name).shares_rows
        if shares_rows:  # isolated algorithms never look at capability
            state.tracker.update(mean_rewards)
        advantages, discrepancy = assign_advantages(context, state, rows)
        values = run_updates(context, state, step, rows, advantages, discrepancy)
        if not shares_rows:  # isolated algorithms publish their scores only now (score_own_rows)
            publish_own_scores(context, step, own_rollouts, own_rows)
        seconds_update = lap()
        publish_weights(context, state, step + 1)
        seconds_publish = lap()
        completed = step + 1
        evaluation = {}
        every = spec.evaluation.every_steps
        if spec.data.eval and (completed == spec.algorithm.steps or (every and completed % every == 0)):
            with state.backend.gathered_weights() as model:
                evaluation = evaluate_policy(context, model, state.tokenizer)
        seconds_eval = lap()

        capability = state.tracker.capability
        tokens = sum(sum(r.response_mask) for r in rows)
        values.update(
            {
                "step": step,
                "weights_version": completed,
                "rollout/reward_mean": mean_rewards[context.agent_index],
                "learner/own_rows": float(sum(r.is_own for r in rows)),
                "learner/cross_rows": float(sum(not r.is_own for r in rows)),
                "learner/advantage_abs_mean": float(advantages.abs().mean()),
                "learner/tokens_per_second": tokens * spec.algorithm.epochs / max(seconds_update, 1e-9),
                "learner/seconds_score": seconds_score,
                "learner/seconds_wait_peers": seconds_wait,
                "learner/seconds_update": seconds_update,
                "learner/seconds_publish": seconds_publish,
                "learner/seconds_eval": seconds_eval,
            }
        )
        for index, name in enumerate(context.agent_names if shares_rows else []):
            values[f"capability/{name}"] = float(capability[index])
            values[f"rollout/reward_mean/{name}"] = mean_rewards[index]
            if index != context.agent_index:
                values[f"capability/ratio/{name}"] = state.tracker.ratio(index, context.agent_index)
        values.update(evaluation)
        if step == 0:
            values.update(initial_eval)
            values.update(data_metrics)
        store.write_metrics(step, agent.name, values)
        metrics.publish(values)
        steps_metrics.append(values)
        warning = None if warned else sharing_warning(agent.name, steps_metrics, delta=spec.algorithm.delta)
        if warning:
            log.warning(warning)
            warned = True

        if completed % spec.checkpoint.every_steps == 0 or completed == spec.algorithm.steps:
            with state.backend.gathered_weights() as model:
                ensure_finite_weights(model, agent.name, f"checkpoint after {completed} steps")
                save_checkpoint(store, agent.name, completed, model, state.tokenizer, state.backend.optimizer_state(), state.tracker, context.work_dir)
            last_checkpoint = completed
            prune_checkpoints(context)
        accuracy = next((v for k, v in evaluation.items() if k.endswith("/accuracy")), None)
        store.write_progress(
            agent.name,
            {
                "agent": agent.name,
                "step": completed,
                "steps": spec.algorithm.steps,
                "weights_version": completed,
                "reward": mean_rewards[context.agent_index],
                "accuracy": accuracy,
                "capability": float(capability[context.agent_index]),
                "shared_rows_used": shared_rows_used(values),
                "last_checkpoint": last_checkpoint,
                "done": completed == spec.algorithm.steps,
                "time": time.time(),
                "data": [report.as_dict() for report in datasets],
            },
        )
        log.info("learner %s step %d: reward %.3f loss %.4f", agent.name, step, mean_rewards[context.agent_index], values.get("learner/pg_loss", 0.0))


def prune_checkpoints(context: WorkerContext) -> None:
    keep = context.spec.checkpoint.keep_last
    store = context.store
    for old in store.list_checkpoints(context.agent_name)[:-keep]:
        store.delete_checkpoint(context.agent_name, old)

