"""What the learner does after each step: one sink per job (``worker_loop.StepSink``), called in
the order of the list ``learner_sinks`` builds (docs/architecture.md, "The worker loop"):

    publish weights -> evaluate -> assemble the step's record -> write it to the store
    -> serve it as Prometheus metrics -> log it to the trackers -> sharing warning -> checkpoint
    -> release the tracked steps -> write the progress file

Several learner ranks all run the collective sinks (publish, evaluate, checkpoint: each gathers
the weights from every rank); only rank 0 (the writer) gets the sinks that write.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from hacrl_core.context import RunDescription, WorkerContext
from hacrl_core.evaluation import EvalSampling, eval_sets, evaluate_policy
from hacrl_core.learner import distributed
from hacrl_core.learner.checkpoint import save_checkpoint
from hacrl_core.learner.clock import StageClock
from hacrl_core.learner.guards import ensure_finite_weights
from hacrl_core.learner.state import LearnerState
from hacrl_core.metrics import WorkerMetrics
from hacrl_core.models.lora import save_trained
from hacrl_core.sharing import shared_rows_used, sharing_warning
from hacrl_core.tracking import steps_jsonl
from hacrl_core.tracking.hub import TrackingHub
from hacrl_core.worker_loop import StepSink

log = logging.getLogger("hacrl")


@dataclass
class LearnerStepEnd:
    """One finished learner step as the sinks see it. ``trained`` and ``sampled``: the step's
    training and (colocated) sampling metrics; ``published`` and ``evaluation`` are filled in by
    their sinks, and ``values`` (the step's record, what is written and logged) by ``AssembleRecord``."""

    step: int
    trained: dict[str, float]
    sampled: dict[str, float]
    clock: StageClock
    checkpoint_due: bool
    published: dict[str, float] = field(default_factory=dict)
    evaluation: dict[str, float] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        """Steps done, this one included: the weights version it trained."""
        return self.step + 1


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
    try:  # the format's publish (weight_formats): a chain's delta or full publish, an adapter whole
        return context.weights().publish(local, version, context.work_dir)
    finally:  # a failed publish leaves no copy of the model behind either
        shutil.rmtree(local, ignore_errors=True)


def evaluate(context: WorkerContext, state: LearnerState, *, suffix: str = "") -> dict[str, float]:
    """The live policy's accuracy on the spec's eval sets (``evaluation.evaluate_policy``); rank 0
    of several learner ranks evaluates (the others return {})."""
    with state.backend.gathered_weights() as model:
        if not distributed.is_writer():
            return {}
        sampling = EvalSampling.of(context.spec, context.agent)
        sets = eval_sets(context.spec.data.eval, context.eval_source)
        results = evaluate_policy(model, state.tokenizer, sets, context.score, sampling)
        return {f"{key}{suffix}": value for key, value in results.items()}


def evaluation_due(run: RunDescription, completed: int) -> bool:
    """Whether the policy is evaluated after ``completed`` steps (``evaluation.everySteps``, the last)."""
    every = run.spec.evaluation.every_steps
    return bool(run.spec.data.eval) and (
        completed == run.spec.algorithm.steps or bool(every and completed % every == 0)
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
    run: RunDescription,
    state: LearnerState,
    values: dict,
    completed: int,
    last_checkpoint: int | None,
    datasets: list,
) -> dict:
    """The agent's progress file: what `hacrl status`, the live display and the operator read."""
    accuracy = next((v for k, v in values.items() if k.startswith("eval/") and k.endswith("/accuracy")), None)
    return {
        "agent": run.agent_name,
        "step": completed,
        "steps": run.spec.algorithm.steps,
        "weights_version": completed,
        "reward": values["rollout/reward_mean"],
        "accuracy": accuracy,
        "capability": float(state.tracker.capability[state.tracker.team.index(run.agent_name)]),
        "shared_rows_used": shared_rows_used(values),
        "last_checkpoint": last_checkpoint,
        "done": completed == run.spec.algorithm.steps,
        "time": time.time(),
        "data": [report.as_dict() for report in datasets],
    }


class PublishWeights(StepSink[LearnerStepEnd]):
    """The step's weights into the store (colocated: only with a checkpoint, since no rollout
    worker loads the weights of every step)."""

    def __init__(self, context: WorkerContext, state: LearnerState, *, colocated: bool) -> None:
        self.context, self.state, self.colocated = context, state, colocated

    def on_step_end(self, end: LearnerStepEnd) -> None:
        if not self.colocated or end.checkpoint_due:
            end.published = publish_weights(self.context, self.state, end.completed)
        end.clock.lap("publish")


class Evaluate(StepSink[LearnerStepEnd]):
    """The live policy on the eval sets, when ``evaluation.everySteps`` (or the last step) says so."""

    def __init__(self, context: WorkerContext, state: LearnerState) -> None:
        self.context, self.state = context, state

    def on_step_end(self, end: LearnerStepEnd) -> None:
        if evaluation_due(self.context.run, end.completed):
            end.evaluation = evaluate(self.context, self.state)
        end.clock.lap("eval")


class AssembleRecord(StepSink[LearnerStepEnd]):
    """The step's record (``end.values``): its training, sampling, evaluation and publish metrics
    and the seconds of its stages; the first step's also carries ``first_step`` (the initial
    evaluation and what the datasets lost to bad rows)."""

    def __init__(self, first_step: dict[str, float], at: int = 0) -> None:
        self.first_step = first_step
        self.at = at  # the step it goes with: 0, or a fresh newcomer's join step (``learner.team``)

    def on_step_end(self, end: LearnerStepEnd) -> None:
        values: dict[str, Any] = dict(end.trained)
        values.update(
            {"step": end.step, "weights_version": end.completed, **end.sampled, **end.evaluation, **end.published}
        )
        values.update(end.clock.metrics())
        if end.step == self.at:
            values.update(self.first_step)
        end.values = values


class WriteMetrics(StepSink[LearnerStepEnd]):
    """The step's record into the store (rank 0)."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context

    def on_step_end(self, end: LearnerStepEnd) -> None:
        self.context.store.write_metrics(end.step, self.context.agent_name, end.values)


class ServeMetrics(StepSink[LearnerStepEnd]):
    """The step's record on the worker's Prometheus endpoint."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def on_step_end(self, end: LearnerStepEnd) -> None:
        self.metrics.publish_step(end.values)


class TrackStep(StepSink[LearnerStepEnd]):
    """The step's record to the spec's trackers (MLflow, W&B, TensorBoard; rank 0)."""

    def __init__(self, tracking: TrackingHub) -> None:
        self.tracking = tracking

    def on_step_end(self, end: LearnerStepEnd) -> None:
        self.tracking.log(end.step, end.values)


class WarnOnSharing(StepSink[LearnerStepEnd]):
    """Once per process: a warning when the peers' rows keep falling outside HACPO's window
    (``sharing.sharing_warning`` over this process's steps; rank 0)."""

    def __init__(self, agent: str, delta: float) -> None:
        self.agent, self.delta = agent, delta
        self.steps: list[dict] = []
        self.warned = False

    def on_step_end(self, end: LearnerStepEnd) -> None:
        self.steps.append(end.values)
        warning = None if self.warned else sharing_warning(self.agent, self.steps, delta=self.delta)
        if warning:
            log.warning(warning)
            self.warned = True


class Checkpoint(StepSink[LearnerStepEnd]):
    """The state into the store every ``checkpoint.everySteps`` steps and after the last (all ranks)."""

    def __init__(self, context: WorkerContext, state: LearnerState) -> None:
        self.context, self.state = context, state

    def on_step_end(self, end: LearnerStepEnd) -> None:
        if end.checkpoint_due:
            checkpoint(self.context, self.state, end.completed)


class ReleaseTracked(StepSink[LearnerStepEnd]):
    """After a checkpoint the tracked steps up to it are durable (a resume never trains them
    again): the trackers may let them go. At the end: the steps file as an artifact, the runs closed."""

    def __init__(self, tracking: TrackingHub, context: WorkerContext) -> None:
        self.tracking, self.context = tracking, context

    def on_step_end(self, end: LearnerStepEnd) -> None:
        if end.checkpoint_due:
            self.tracking.release()

    def on_run_end(self) -> None:
        context = self.context
        self.tracking.artifact(
            steps_jsonl(context.store, context.agent_name, context.spec.algorithm.steps, context.work_dir)
        )
        self.tracking.finish()


class WriteProgress(StepSink[LearnerStepEnd]):
    """The agent's progress file and the step's log line (rank 0)."""

    def __init__(
        self, context: WorkerContext, state: LearnerState, datasets: list, last_checkpoint: int | None
    ) -> None:
        self.context, self.state, self.datasets = context, state, datasets
        self.last_checkpoint = last_checkpoint

    def on_step_end(self, end: LearnerStepEnd) -> None:
        if end.checkpoint_due:
            self.last_checkpoint = end.completed
        record = progress_record(
            self.context.run, self.state, end.values, end.completed, self.last_checkpoint, self.datasets
        )
        self.context.store.write_progress(self.context.agent_name, record)
        log.info(
            "learner %s step %d: reward %.3f loss %.4f",
            self.context.agent_name,
            end.step,
            end.values["rollout/reward_mean"],
            end.values.get("learner/pg_loss", 0.0),
        )


@dataclass(frozen=True)
class SinkParts:
    """What the sinks are built from, made at the learner's start-up."""

    context: WorkerContext
    state: LearnerState
    metrics: WorkerMetrics
    tracking: TrackingHub | None
    datasets: list
    first_step: dict[str, float]
    last_checkpoint: int | None
    colocated: bool
    first_step_at: int = 0  # the step ``first_step`` goes with (``AssembleRecord``)


def learner_sinks(parts: SinkParts) -> list[StepSink]:
    """The learner's sinks in order; rank 0 (the writer) gets those that write."""
    context, state, tracking = parts.context, parts.state, parts.tracking
    is_writer = distributed.is_writer()
    sinks: list[StepSink] = [
        PublishWeights(context, state, colocated=parts.colocated),
        Evaluate(context, state),
        AssembleRecord(parts.first_step, parts.first_step_at),
    ]
    if is_writer:
        sinks.append(WriteMetrics(context))
    sinks.append(ServeMetrics(parts.metrics))
    if tracking:
        sinks.append(TrackStep(tracking))
    if is_writer:
        sinks.append(WarnOnSharing(context.agent_name, context.spec.algorithm.delta))
    sinks.append(Checkpoint(context, state))
    if tracking:
        sinks.append(ReleaseTracked(tracking, context))
    if is_writer:
        sinks.append(WriteProgress(context, state, parts.datasets, parts.last_checkpoint))
    return sinks
