"""The learner worker: `hacrl worker learner --spec S --agent A`.

The worker is the step's I/O: it runs the one learner step (``learner.step.learner_step``) on the
store's shards through the store's ports (``learner.step_ports.StorePorts``), then does what
follows a step. One step:

    learner_step: read own rollouts -> read peers' rollouts -> gather_rows -> update_capability
        -> assign_advantages -> plan_updates -> score_pi_old
        -> exchange scores (write own scores, read peers' scores) -> run_updates
    then the sinks (``learner.sinks``, in order): publish weights -> evaluate -> record
        (store, Prometheus, trackers, sharing warning) -> checkpoint -> write progress

The loop is start-up (``start_learner``), then per step: sample (colocated), train, and hand the
step's end to each sink in turn (``worker_loop.step_ended``). A job done after every step is one
more sink in the list ``learner_sinks`` builds, not another branch of the loop.

The score exchange is the step between the pi_old stage and the updates: the peers need this
learner's scores before they can train on its rows, and it needs theirs. The pi_old stage trains
the first update's own micro-batches as it scores them (``score_pi_old``), so the scores go out
as early as the old scoring pass would have put them out, one no-grad pass sooner.

A restarted learner restores its latest checkpoint (N completed steps) and runs step N next;
shards already in the store are reused, never written twice.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hacrl_core.algorithms import Algorithm, resolve_algorithm
from hacrl_core.context import WorkerContext
from hacrl_core.learner import distributed, team
from hacrl_core.learner.backends import backend_factory, create_backend
from hacrl_core.learner.checkpoint import restore_checkpoint
from hacrl_core.learner.clock import StageClock
from hacrl_core.learner.sinks import (
    LearnerStepEnd,
    SinkParts,
    checkpoint,
    evaluate,
    learner_sinks,
    publish_weights,
)
from hacrl_core.learner.state import LearnerState, start_state
from hacrl_core.learner.step import StepSetup, learner_step, run_step
from hacrl_core.learner.step_ports import StorePorts
from hacrl_core.metrics import WorkerMetrics, store_retries
from hacrl_core.models.loading import default_device
from hacrl_core.preemption import LearnerStop, serve_count
from hacrl_core.tracking import open_tracking
from hacrl_core.tracking.hub import TrackingHub
from hacrl_core.worker_loop import StepSink, run_ended, step_ended

log = logging.getLogger("hacrl")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

#: Set to "false" by the learner: a peer shard's responses are tokenized in one batch call
#: (``batch.encode_rows``), which the fast tokenizer otherwise spreads over a thread pool of
#: every core; the learner's share of the CPUs is its torch threads, and on shared cores the
#: pool's threads spin against the other workers (a 512-row batch: 5-40 ms with the pool, 2-3 ms without).
SERIAL_TOKENIZER_ENV = "TOKENIZERS_PARALLELISM"

#: The colocated worker's sampler (``hacrl_core.colocated``): the step's own rollouts sampled with
#: the live model before the step trains on them; their metrics.
Sampler = Callable[[LearnerState, int], dict[str, float]]

__all__ = ["checkpoint", "initialize", "publish_weights", "run_learner_worker", "start_learner"]


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
        reference = context.weights().reference(backend.unwrapped_model(), dtype, device)
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
    from the agent's initial model when None, as its weight format reads them (``weight_formats``:
    a LoRA agent's checkpoints hold the adapter alone, over the base model its ``model`` names)."""
    weights_format = context.weights()
    return lambda weights: weights_format.load_model(weights, dtype, device)


def step_setup(context: WorkerContext, algorithm: Algorithm, members: tuple[str, ...]) -> StepSetup:
    """Who this learner is among the step's ``members`` (``learner.team``), for ``learner_step``."""
    return StepSetup(members.index(context.agent_name), members, algorithm, context.spec.algorithm)


def store_ports(context: WorkerContext, state: LearnerState, members: tuple[str, ...]) -> StorePorts:
    """The step's I/O on the trajectory store (the shards of the step's ``members``), rows encoded
    in this learner's tokenizer."""
    return StorePorts(
        context.store,
        context.experiment.name,
        members,
        members.index(context.agent_name),
        state.tokenizer,
        context.spec.data.template,
        context.wait_seconds,
    )


def train_step(
    context: WorkerContext, state: LearnerState, step: int, algorithm: Algorithm, clock: StageClock
) -> dict[str, float]:
    """One step's training from the store's shards (``learner_step`` on ``StorePorts``) of the
    step's members; its metrics."""
    members = team.members(context, step)
    setup, ports = step_setup(context, algorithm, members), store_ports(context, state, members)
    running = learner_step(state, setup, ports, step, lap=clock.lap_step_stage)
    return run_step(running).metrics


@dataclass(frozen=True)
class LearnerRun:
    """What the learner's step loop runs with, made at start-up (``start_learner``)."""

    state: LearnerState
    algorithm: Algorithm
    sinks: list[StepSink]
    first: int | None = 0  # the first step it trains (``team.first_step``); None: not in the team


def seed_process(context: WorkerContext) -> None:
    """Torch's seed for this agent, and the tokenizer's thread pool off (``SERIAL_TOKENIZER_ENV``)."""
    torch.manual_seed(context.spec.algorithm.seed * 1000 + context.agent_index)
    os.environ.setdefault(SERIAL_TOKENIZER_ENV, "false")


def learner_metrics(context: WorkerContext) -> WorkerMetrics:
    """The learner's Prometheus metrics; rank 0 serves them (one endpoint per learner). Call after
    the ranks joined (``distributed.join_ranks``)."""
    metrics = WorkerMetrics(context.experiment.name, context.agent_name, "learner")
    metrics.count_from(
        "hacrl_store_retries",
        "Store requests sent again after a transient failure.",
        lambda: store_retries(context.store),
    )
    if distributed.is_writer():
        serve_count(metrics, context.store, context.agent_name, "learner")
        metrics.serve(context.spec.metrics.port, context.spec.metrics.bind_address)
    return metrics


def learner_tracking(context: WorkerContext, state: LearnerState, metrics: WorkerMetrics) -> TrackingHub | None:
    """The spec's trackers, continuing a resumed learner's runs; rank 0 logs for the learner."""
    if not distributed.is_writer():
        return None
    tracking = open_tracking(
        context.spec,
        experiment=context.experiment.name,
        agent=context.agent_name,
        store=context.store,
        work_dir=context.work_dir,
        next_step=state.next_step,
    )
    if tracking:
        metrics.count_from(
            "hacrl_tracker_drops",
            "Steps of metrics a tracker never got: pushed out of its queue while it was down.",
            lambda: tracking.dropped,
        )
    return tracking


def first_weights(context: WorkerContext, state: LearnerState, first: int | None) -> dict[str, float]:
    """A fresh learner publishes weights version 0 (the initial model) and evaluates it; returns
    that evaluation (``*_initial``), which the first step's record carries. One that joins the
    team at step ``first`` > 0 (a newcomer, or back from a pause) publishes its weights as the
    version its rollouts of that step sample (``team.first_version``)."""
    if first is not None and team.needs_first_weights(context, first):
        publish_weights(context, state, team.first_version(context, first))
    if state.next_step == 0 and context.spec.data.eval:
        return evaluate(context, state, suffix="_initial")
    return {}


def start_learner(context: WorkerContext, *, colocated: bool) -> LearnerRun:
    """Start-up: seed, join the ranks, metrics, the state (restored or fresh), trackers, the
    datasets' reports, the initial weights and evaluation; then the sinks each step ends in."""
    seed_process(context)
    algorithm = resolve_algorithm(context.spec.algorithm)
    # Several learner ranks: the process group, and on ranks > 0 a read-only store (one rank: the device alone).
    device, context.store, context.work_dir = distributed.join_ranks(context.store, context.work_dir)
    metrics = learner_metrics(context)
    state = initialize(context, device)
    tracking = learner_tracking(context, state, metrics)
    # The learner reads the training set too (the rollout worker samples from it) so that its
    # heartbeat tells the operator what every dataset of the spec lost to bad rows.
    datasets = context.dataset_reports()
    data_metrics = {key: value for report in datasets for key, value in report.metrics().items()}
    metrics.publish(data_metrics)
    first = team.first_step(context, state.next_step)
    initial_eval = first_weights(context, state, first)
    parts = SinkParts(
        context,
        state,
        metrics,
        tracking,
        datasets,
        first_step={**initial_eval, **data_metrics},
        first_step_at=first if first is not None and state.next_step == 0 else 0,
        last_checkpoint=context.store.latest_checkpoint(context.agent_name),
        colocated=colocated,
    )
    return LearnerRun(state, algorithm, learner_sinks(parts), first)


def freeze_long_lived_objects() -> None:
    """Move every object alive now (after a collection) into the permanent generation, which
    Python's cyclic collector never walks (``gc.freeze``).

    A full collection walks every tracked object: once the model, its tokenizer, torch and
    transformers are loaded that is about 400,000 of them, 0.22 s of CPU per collection, and the
    allocations of a learner step set one off every few steps (bench/learner.py's qwen-bpe and
    llama-char steps: one in 4-8 steps, 3-6% of their time). What start-up and the first step
    leave alive lives as long as the worker; what a step allocates later is still collected."""
    gc.collect()
    gc.freeze()


def run_learner_worker(context: WorkerContext, *, sampler: Sampler | None = None) -> None:
    """The learner's step loop: start-up, then per step sample (colocated), train, and the sinks
    (``learner.sinks``: publish, evaluate, record, checkpoint, progress). ``sampler``: the
    colocated worker's (``hacrl_core.colocated``), which samples the step's own rollouts with the
    live model before the step trains on them (its metrics join the step's); then weights are
    published only with each checkpoint, since no rollout worker loads them."""
    run = start_learner(context, colocated=sampler is not None)
    freeze_long_lived_objects()
    frozen_after_first_step = False  # the colocated engine and the caches a first step fills
    steps = context.spec.algorithm.steps
    away = False  # the steps before this one were recorded without the agent (``learner.team``)
    # SIGTERM (hacrl_core/preemption.py): a step waiting for data is abandoned, one training finishes,
    # and the finished steps are checkpointed as the worker exits (``preempted_exit``).
    latest = partial(context.store.latest_checkpoint, context.agent_name)
    stop = LearnerStop(run.state.tracker, partial(checkpoint, context, run.state), latest)
    for step in range(steps if run.first is None else run.first, steps):
        stop.begin(step)
        if not team.is_member(context, step):
            if not team.sits_out(context, step, partial(checkpoint, context, run.state, step)):
                break  # removed or suspended: it left the team at this step
            away = True
            continue
        if away:
            team.rejoined(context, step, partial(publish_weights, context, run.state))
            away = False
        clock = StageClock()
        sampled = sampler(run.state, step) if sampler else {}
        clock.lap("sample")
        trained = train_step(context, run.state, step, run.algorithm, clock)
        stop.trained()
        completed = step + 1
        checkpoint_due = completed % context.spec.checkpoint.every_steps == 0 or completed == steps
        step_ended(run.sinks, LearnerStepEnd(step, trained, sampled, clock, checkpoint_due))
        if not frozen_after_first_step:
            freeze_long_lived_objects()
            frozen_after_first_step = True
    run_ended(run.sinks)
    distributed.leave_ranks()
