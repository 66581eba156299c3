"""The learner worker: `hacrl worker learner --spec S --agent A`.

The worker is the step's I/O: it runs the one learner step (``learner.step.learner_step``) on the
store's shards through the store's ports (``learner.step_ports.StorePorts``), then does what
follows a step. One step:

    learner_step: read own rollouts -> read peers' rollouts -> gather_rows -> update_capability
        -> assign_advantages -> plan_updates -> score_pi_old
        -> exchange scores (write own scores, read peers' scores) -> run_updates
    -> publish weights -> evaluate -> write metrics -> checkpoint -> write progress

The score exchange is the step between the pi_old stage and the updates: the peers need this
learner's scores before they can train on its rows, and it needs theirs. The pi_old stage trains
the first update's own micro-batches as it scores them (``score_pi_old``), so the scores go out
as early as the old scoring pass would have put them out, one no-grad pass sooner.

A restarted learner restores its latest checkpoint (N completed steps) and runs step N next;
shards already in the store are reused, never written twice.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hacrl_core.algorithms import Algorithm, resolve_algorithm
from hacrl_core.context import WorkerContext
from hacrl_core.evaluation import evaluate_policy
from hacrl_core.learner import distributed
from hacrl_core.learner.backends import backend_factory, create_backend
from hacrl_core.learner.checkpoint import restore_checkpoint, save_checkpoint
from hacrl_core.learner.guards import ensure_finite_weights
from hacrl_core.learner.stages import LearnerState, start_state
from hacrl_core.learner.step import StepSetup, learner_step, run_step
from hacrl_core.learner.step_ports import StorePorts
from hacrl_core.metrics import WorkerMetrics, store_retries
from hacrl_core.models.loading import default_device, load_policy
from hacrl_core.models.lora import AdapterDisabled, load_lora_policy, save_trained
from hacrl_core.sharing import shared_rows_used, sharing_warning
from hacrl_core.store.weight_chain import directory_bytes, publish_policy
from hacrl_core.tracking import open_tracking, steps_jsonl

log = logging.getLogger("hacrl")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

#: Set to "false" by the learner: a peer shard's responses are tokenized in one batch call
#: (``batch.encode_rows``), which the fast tokenizer otherwise spreads over a thread pool of
#: every core; the learner's share of the CPUs is its torch threads, and on shared cores the
#: pool's threads spin against the other workers (a 512-row batch: 5-40 ms with the pool, 2-3 ms without).
SERIAL_TOKENIZER_ENV = "TOKENIZERS_PARALLELISM"


def initialize(context: WorkerContext, device: str | None = None) -> LearnerState:
    """The policy, optimizer and capability history at the latest checkpoint, or fresh."""
    device = device or default_device()
    spec, settings = context.spec, context.agent.learner
    dtype = DTYPES[settings.dtype]
    load_model = model_loader(context, dtype, device)
    latest = context.store.latest_checkpoint(context.agent_name)
    if latest is None:
        model, tokenizer = load_model(None)
        backend = create_backend(settings.backend, model, settings)
        capability_state = None
    else:  # restores the RNG state too, so nothing random may happen before this
        factory = backend_factory(settings.backend)
        model, tokenizer, optimizer_state, capability_state, local = restore_checkpoint(
            context.store,
            context.agent_name,
            latest,
            context.work_dir,
            device,
            dtype,
            factory.checkpoint_globals,
            rank=distributed.world()[0],
            load_model=load_model,
        )
        backend = factory(model, settings)
        backend.load_optimizer_state(optimizer_state)
        shutil.rmtree(local, ignore_errors=True)
        log.info("learner %s: resumed from checkpoint after %d steps", context.agent_name, latest)
    reference = None
    if spec.algorithm.kl_coef > 0:  # 0 must skip loading the reference entirely
        if settings.lora:  # the frozen reference is the base model itself: no second copy
            reference = AdapterDisabled(backend.unwrapped_model())
        else:
            reference, _ = load_policy(context.initial_model_dir(), dtype=dtype, device=device)
            reference.eval().requires_grad_(False)
    state = start_state(
        model,
        tokenizer,
        backend,
        spec.algorithm,
        len(spec.agents),
        next_step=latest or 0,
        reference=reference,
        device=device,
        learner=settings,
    )
    if capability_state is not None:
        state.tracker.load_state_dict(capability_state)
    return state


def model_loader(context: WorkerContext, dtype: torch.dtype, device: str) -> Callable[[Path | None], tuple[Any, Any]]:
    """How the learner gets its ``(model, tokenizer)``: from a checkpoint's weights directory, or
    from the agent's initial model when None. A LoRA agent (``learner.lora``) reads its base
    model from the agent's ``model`` either way and adds the adapter (the checkpoint's, or a
    fresh one): its checkpoints hold the adapter alone (``models.lora``)."""
    lora = context.agent.learner.lora
    if lora is None:
        return lambda weights: load_policy(weights or context.initial_model_dir(), dtype=dtype, device=device)
    field = f"spec.agents[{context.agent_index}].learner.lora"
    return lambda weights: load_lora_policy(
        context.initial_model_dir(), lora, adapter_dir=weights, dtype=dtype, device=device, field=field
    )


def publish_weights(context: WorkerContext, state: LearnerState, version: int) -> dict[str, float]:
    """Weights version ``version`` into the store. Several learner ranks all call it (ZeRO-3 gathers
    the weights from every rank); rank 0 publishes. Returns its bytes as step metrics: what it
    wrote (a delta or in full) and that as a share of a full publish (none on the other ranks)."""
    local = context.work_dir / f"publish-{version:06d}"
    with state.backend.gathered_weights() as model:
        if not distributed.is_writer():
            return {}
        shutil.rmtree(local, ignore_errors=True)
        ensure_finite_weights(model, context.agent_name, f"publish weights version {version}")
        save_trained(model, state.tokenizer, local)  # a LoRA agent's: the adapter alone
    try:
        if (
            context.agent.learner.lora is not None
        ):  # an adapter is small and most of it moves each step: published whole
            size = float(directory_bytes(local))
            context.store.publish_weights(context.agent_name, version, local)
            return {"learner/weights_bytes_written": size, "learner/weights_publish_share": 1.0}
        # A delta against the previous publish, or in full (store/weight_chain.py; docs/architecture.md, "Weight publishes").
        published = publish_policy(
            context.store,
            context.agent_name,
            version,
            local,
            context.work_dir / "published-weights",
            full_every=context.agent.learner.full_publish_every,
        )
    finally:  # a failed publish leaves no copy of the model behind either
        shutil.rmtree(local, ignore_errors=True)
    log.info(
        "learner %s: weights version %d published %s, %.1f MB of %.1f MB%s",
        context.agent_name,
        version,
        published.kind,
        published.bytes_written / 1e6,
        published.full_bytes / 1e6,
        "" if published.changed_fraction is None else f", {published.changed_fraction:.2%} of elements changed",
    )
    return {
        "learner/weights_bytes_written": float(published.bytes_written),
        "learner/weights_publish_share": published.bytes_written / max(published.full_bytes, 1),
    }


def step_setup(context: WorkerContext, algorithm: Algorithm) -> StepSetup:
    """Who this learner is among the agents, for ``learner_step``."""
    return StepSetup(context.agent_index, tuple(context.agent_names), algorithm, context.spec.algorithm)


def store_ports(context: WorkerContext, state: LearnerState) -> StorePorts:
    """The step's I/O on the trajectory store, rows encoded in this learner's tokenizer."""
    return StorePorts(
        context.store,
        context.experiment.name,
        tuple(context.agent_names),
        context.agent_index,
        state.tokenizer,
        context.spec.data.template,
        context.wait_seconds,
    )


def evaluate(context: WorkerContext, state: LearnerState, *, suffix: str = "") -> dict[str, float]:
    """The live policy's accuracy on the spec's eval sets (``evaluation.evaluate_policy``); rank 0
    of several learner ranks evaluates (the others return {})."""
    with state.backend.gathered_weights() as model:
        if not distributed.is_writer():
            return {}
        return {f"{key}{suffix}": value for key, value in evaluate_policy(context, model, state.tokenizer).items()}


def evaluation_due(context: WorkerContext, completed: int) -> bool:
    every = context.spec.evaluation.every_steps
    return bool(context.spec.data.eval) and (
        completed == context.spec.algorithm.steps or bool(every and completed % every == 0)
    )


def checkpoint(context: WorkerContext, state: LearnerState, completed: int) -> None:
    """Save the state after ``completed`` steps and drop checkpoints beyond ``keepLast``. Several
    learner ranks all call it: the optimizer state is consolidated from every rank's shard and
    rank 0 saves the whole state (weights and optimizer), which restores at any number of ranks."""
    with state.backend.gathered_weights() as model:
        optimizer_state = state.backend.optimizer_state()  # a collective with several ranks
        if not distributed.is_writer():
            return
        ensure_finite_weights(model, context.agent_name, f"checkpoint after {completed} steps")
        save_checkpoint(
            context.store,
            context.agent_name,
            completed,
            model,
            state.tokenizer,
            optimizer_state,
            state.tracker,
            context.work_dir,
        )
    prune_checkpoints(context)


def prune_checkpoints(context: WorkerContext) -> None:
    keep = context.spec.checkpoint.keep_last
    store = context.store
    for old in store.list_checkpoints(context.agent_name)[:-keep]:
        store.delete_checkpoint(context.agent_name, old)


def progress_record(
    context: WorkerContext,
    state: LearnerState,
    values: dict,
    completed: int,
    last_checkpoint: int | None,
    datasets: list,
) -> dict:
    """The agent's progress file: what `hacrl status`, the live display and the operator read."""
    accuracy = next((v for k, v in values.items() if k.startswith("eval/") and k.endswith("/accuracy")), None)
    return {
        "agent": context.agent_name,
        "step": completed,
        "steps": context.spec.algorithm.steps,
        "weights_version": completed,
        "reward": values["rollout/reward_mean"],
        "accuracy": accuracy,
        "capability": float(state.tracker.capability[context.agent_index]),
        "shared_rows_used": shared_rows_used(values),
        "last_checkpoint": last_checkpoint,
        "done": completed == context.spec.algorithm.steps,
        "time": time.time(),
        "data": [report.as_dict() for report in datasets],
    }


#: Which ``learner/seconds_*`` each stage of ``learner_step`` (``step.STAGES``) counts in.
CLOCK_STAGES = {
    "read_own": "score",
    "read_peers": "wait_peers",
    "plan": "score",
    "pi_old": "score",
    "publish_scores": "score",
    "read_peer_scores": "wait_peers",
    "update": "update",
}


class StageClock:
    """Seconds spent in each named stage of a step, for the ``learner/seconds_*`` metrics."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> float:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now
        return self.seconds[stage]

    def lap_step_stage(self, stage: str) -> float:
        """A stage of ``learner_step`` ended: into its ``learner/seconds_*`` (``CLOCK_STAGES``)."""
        return self.lap(CLOCK_STAGES[stage])

    def metrics(self) -> dict[str, float]:
        # Spelled out: dashboards and docs/metrics.md name these series (tests look them up here).
        return {
            "learner/seconds_sample": self.seconds["sample"],
            "learner/seconds_score": self.seconds["score"],
            "learner/seconds_wait_peers": self.seconds["wait_peers"],
            "learner/seconds_update": self.seconds["update"],
            "learner/seconds_publish": self.seconds["publish"],
            "learner/seconds_eval": self.seconds["eval"],
        }


def train_step(
    context: WorkerContext, state: LearnerState, step: int, algorithm: Algorithm, clock: StageClock
) -> dict[str, float]:
    """One step's training from the store's shards (``learner_step`` on ``StorePorts``); its metrics."""
    running = learner_step(
        state, step_setup(context, algorithm), store_ports(context, state), step, lap=clock.lap_step_stage
    )
    return run_step(running).metrics


def run_learner_worker(
    context: WorkerContext, *, sampler: Callable[[LearnerState, int], dict[str, float]] | None = None
) -> None:
    """The learner's step loop. ``sampler``: the colocated worker's (``hacrl_core.colocated``),
    which samples the step's own rollouts with the live model before the step trains on them
    (its metrics join the step's); then weights are published only with each checkpoint, since no
    rollout worker loads them."""
    torch.manual_seed(context.spec.algorithm.seed * 1000 + context.agent_index)
    os.environ.setdefault(SERIAL_TOKENIZER_ENV, "false")
    spec, agent = context.spec, context.agent
    colocated = sampler is not None
    algorithm = resolve_algorithm(spec.algorithm)
    metrics = WorkerMetrics(context.experiment.name, agent.name, "learner")
    device = distributed.join_ranks(context)  # several learner ranks: the process group (one rank: nothing)
    metrics.count_from(
        "hacrl_store_retries",
        "Store requests sent again after a transient failure.",
        lambda: store_retries(context.store),
    )
    if distributed.is_writer():  # one metrics endpoint per learner
        metrics.serve(spec.metrics.port, spec.metrics.bind_address)
    state = initialize(context, device)
    tracking = (
        open_tracking(context, state.next_step) if distributed.is_writer() else None
    )  # rank 0 logs for the learner
    if tracking:
        metrics.count_from(
            "hacrl_tracker_drops",
            "Steps of metrics a tracker never got: pushed out of its queue while it was down.",
            lambda: tracking.dropped,
        )
    store = context.store
    # The learner reads the training set too (the rollout worker samples from it) so that its
    # heartbeat tells the operator what every dataset of the spec lost to bad rows.
    datasets = context.dataset_reports()
    data_metrics = {key: value for report in datasets for key, value in report.metrics().items()}
    metrics.publish(data_metrics)
    if distributed.decide(state.next_step == 0 and store.latest_weights_version(agent.name) is None):
        publish_weights(context, state, 0)
    initial_eval = evaluate(context, state, suffix="_initial") if state.next_step == 0 and spec.data.eval else {}
    last_checkpoint = store.latest_checkpoint(agent.name)
    steps_metrics: list[dict] = []  # this process's steps, for the sharing warning (said once)
    warned = False
    for step in range(state.next_step, spec.algorithm.steps):
        clock = StageClock()
        sampled = sampler(state, step) if sampler else {}
        clock.lap("sample")
        values = train_step(context, state, step, algorithm, clock)
        completed = step + 1
        checkpoint_due = completed % spec.checkpoint.every_steps == 0 or completed == spec.algorithm.steps
        published = {}
        if not colocated or checkpoint_due:  # colocated: nobody loads the weights of every step
            published = publish_weights(context, state, completed)
        clock.lap("publish")
        evaluation = evaluate(context, state) if evaluation_due(context, completed) else {}
        clock.lap("eval")

        values.update({"step": step, "weights_version": completed, **sampled, **evaluation, **published})
        values.update(clock.metrics())
        if step == 0:
            values.update(initial_eval)
            values.update(data_metrics)
        writer = distributed.is_writer()  # several learner ranks: rank 0 writes, all checkpoint
        if writer:
            store.write_metrics(step, agent.name, values)
        metrics.publish_step(values)
        if tracking:
            tracking.log(step, values)
        steps_metrics.append(values)
        warning = (
            None if warned or not writer else sharing_warning(agent.name, steps_metrics, delta=spec.algorithm.delta)
        )
        if warning:
            log.warning(warning)
            warned = True

        if checkpoint_due:
            checkpoint(context, state, completed)
            last_checkpoint = completed
            if tracking:  # the steps up to here are durable: a resume never trains them again
                tracking.release()
        if not writer:
            continue
        store.write_progress(agent.name, progress_record(context, state, values, completed, last_checkpoint, datasets))
        log.info(
            "learner %s step %d: reward %.3f loss %.4f",
            agent.name,
            step,
            values["rollout/reward_mean"],
            values.get("learner/pg_loss", 0.0),
        )
    if tracking:
        tracking.artifact(steps_jsonl(context))
        tracking.finish()
    distributed.leave_ranks()
