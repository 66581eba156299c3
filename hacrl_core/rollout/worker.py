"""The rollout worker: `hacrl worker rollout --spec S --agent A`.

For each step t: wait for the agent's weights version t - maxStaleness (0 and below: the initial
checkpoint, which is what version 0 holds), sample G responses for each of the step's prompts
with the agent's own chat template, score the response text, write the shard.
A restarted worker continues at the first step whose shard is missing. The loop is start-up
(``start_rollout``), then per step: the weights (``WeightsHolder``), the rollouts, and the sinks
(``worker_loop.StepSink``: the step's metrics, its log line).

With several rollout replicas (``rollout.replicas``, rollout/replicas.py) the worker is replica
``context.replica``: it samples its slice of each step's prompts and writes its own part of the
step's rollouts, and a restarted replica continues at the first step whose part *it* has not
committed, so it rewrites nothing another replica or its own earlier incarnation wrote.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hacrl_core.context import RunDescription, WorkerContext, log
from hacrl_core.data.base import Problem
from hacrl_core.metrics import WorkerMetrics, store_retries
from hacrl_core.preemption import PREEMPTION, serve_count
from hacrl_core.rewards.remote import take_retries
from hacrl_core.rewards.scoring import RewardItem
from hacrl_core.rollout.engine import RolloutEngine, engine_for
from hacrl_core.rollout.replicas import check_replica_prompts, replica_slice
from hacrl_core.rollout.sampling import rollout_metrics, rollout_rows, sample_step, sampling_params, sampling_version
from hacrl_core.store import TrajectoryStore
from hacrl_core.store.membership import join_step, still_member, stint_start
from hacrl_core.worker_loop import StepSink, run_ended, step_ended


def first_missing_step(store: TrajectoryStore, agent: str, steps: int, replica: int = 0) -> int:
    """The first step whose rollouts (replica ``replica``'s part of them) are not committed."""
    step = 0
    while step < steps and store.rollout_part_ready(step, agent, replica):
        step += 1
    return step


class RolloutPorts(Protocol):
    """A rollout step's I/O: the step's prompts in, the rewards of its responses, its rows out."""

    def step_problems(self, step: int) -> list[Problem]: ...

    def score(self, items: Sequence[RewardItem]) -> list[float]: ...

    def write_rollouts(self, step: int, rows: list[dict]) -> None: ...


@dataclass(frozen=True)
class StoreRolloutPorts:
    """``RolloutPorts`` of a worker: the spec's training set, its reward, this replica's part of
    the step's rollouts in the trajectory store."""

    context: WorkerContext

    def step_problems(self, step: int) -> list[Problem]:
        return self.context.step_problems(step)

    def score(self, items: Sequence[RewardItem]) -> list[float]:
        return self.context.score(items)

    def write_rollouts(self, step: int, rows: list[dict]) -> None:
        self.context.store.write_rollouts(step, self.context.agent_name, rows, replica=self.context.replica)


def sample_rollouts(
    run: RunDescription, ports: RolloutPorts, engine: RolloutEngine, step: int, version: int
) -> tuple[list[dict], dict[str, float]]:
    """Sample, score and write the agent's rollouts of ``step`` (this replica's slice of the step's
    prompts and its part of the rollouts) with the policy ``engine`` holds (weights ``version``);
    returns the rows and the seconds of each stage."""
    spec, agent = run.spec, run.agent
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    share = replica_slice(spec.algorithm.prompts_per_step, agent.rollout.replicas, run.replica)
    problems = ports.step_problems(step)[share]
    params = sampling_params(
        agent.rollout,
        group_size=spec.algorithm.group_size,
        seed=spec.algorithm.seed,
        step=step,
        agent_index=run.agent_index,
        first_prompt=share.start,
    )
    prompts, samples = sample_step(engine, problems, spec.data.template, params)
    seconds["generate"] = time.perf_counter() - began

    began = time.perf_counter()
    rows = rollout_rows(
        problems,
        prompts,
        samples,
        ports.score,
        experiment=run.experiment,
        agent=agent.name,
        step=step,
        tokenizer=engine.tokenizer,
        policy_version=version,
    )
    seconds["reward"] = time.perf_counter() - began

    began = time.perf_counter()
    ports.write_rollouts(step, rows)
    seconds["write"] = time.perf_counter() - began
    return rows, seconds


def load_weights(
    context: WorkerContext, engine: RolloutEngine, version: int, weights_root: Path, *, loaded: int | None
) -> int:
    """Put the agent's weights version ``version`` into ``engine`` (fetched under ``weights_root``;
    ``loaded``: the version asked for before, None at start); returns the version the engine holds.

    The agent's weight format does it (``weight_formats``: a full model rebuilt along its chain of
    deltas, after a broken delta an older version of the chain, which the rows then record; or a
    LoRA adapter applied over the base model read once). Version 0 is the initial model, which the
    learner is still loading to publish: sampling from the same checkpoint at once takes the
    learner's start-up off the critical path (its pi_old is the learner's own scoring either way).
    """
    return context.weights().apply(engine, version, weights_root, loaded=loaded)


class WeightsHolder:
    """The weights an engine samples with, loaded as the steps ask for newer versions."""

    def __init__(
        self, context: WorkerContext, engine: RolloutEngine, weights_root: Path, name: str, floor: int = 0
    ) -> None:
        self.context, self.engine, self.weights_root, self.name = context, engine, weights_root, name
        # The first step of the agent's membership (``membership.stint_start``): a newcomer's, or an
        # agent's back from a pause, first steps sample the version its learner published as it joined.
        self.floor = floor
        self.loaded: int | None = None  # the version asked for last
        self.holds = 0  # the version the engine holds: ``loaded``, or an older one after a broken delta

    def for_step(self, step: int) -> int:
        """The version step ``step`` samples with (``maxStaleness`` behind it), loaded if it is not
        yet; returns the version the engine holds."""
        version = max(self.floor, sampling_version(step, self.context.spec.algorithm.max_staleness))
        if version == self.loaded:
            return self.holds
        self.holds = load_weights(self.context, self.engine, version, self.weights_root, loaded=self.loaded)
        if self.holds != version:
            log.warning(
                "rollout %s step %d: sampling with weights version %d instead of %d (a delta of the "
                "chain is unusable; see the warning above)",
                self.name,
                step,
                self.holds,
                version,
            )
        self.loaded = version
        return self.holds


@dataclass(frozen=True)
class RolloutStepEnd:
    """One step's rollouts written: the rows and the step's metrics (``rollout_metrics``)."""

    step: int
    rows: list[dict]
    values: dict[str, float]


class ServeRolloutMetrics(StepSink[RolloutStepEnd]):
    """The step's metrics on the worker's Prometheus endpoint."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def on_step_end(self, end: RolloutStepEnd) -> None:
        self.metrics.publish_step(end.values)


class LogRolloutStep(StepSink[RolloutStepEnd]):
    """The step's log line."""

    def __init__(self, name: str) -> None:
        self.name = name

    def on_step_end(self, end: RolloutStepEnd) -> None:
        log.info(
            "rollout %s step %d: reward %.3f, %d tokens",
            self.name,
            end.step,
            end.values["rollout/reward_mean"],
            sum(len(r["token_ids"]) for r in end.rows),
        )


@dataclass(frozen=True)
class RolloutRun:
    """What the rollout worker's step loop runs with, made at start-up (``start_rollout``)."""

    engine: RolloutEngine
    weights: WeightsHolder
    first_step: int | None  # None: the agent is not in the team (removed or suspended)
    sinks: list[StepSink]


def rollout_worker_metrics(context: WorkerContext) -> WorkerMetrics:
    """The worker's Prometheus metrics, served, with what the dataset reader skipped."""
    replicas = context.agent.rollout.replicas
    metrics = WorkerMetrics(
        context.experiment.name, context.agent.name, "rollout", replica=context.replica if replicas > 1 else None
    )
    metrics.count_from(
        "hacrl_store_retries",
        "Store requests sent again after a transient failure.",
        lambda: store_retries(context.store),
    )
    serve_count(metrics, context.store, context.agent.name, "rollout", context.replica if replicas > 1 else None)
    metrics.serve(context.spec.metrics.port, context.spec.metrics.bind_address)
    for report in context.dataset_reports(include_eval=False):  # logs what the reader skipped
        metrics.publish(report.metrics())
    return metrics


def start_rollout(context: WorkerContext) -> RolloutRun:
    """Start-up: check the replica's share of prompts, metrics, the engine, the first step not
    written yet; then the sinks each step ends in."""
    spec, agent = context.spec, context.agent
    replicas = agent.rollout.replicas
    check_replica_prompts(
        spec.algorithm.prompts_per_step, replicas, f"spec.agents[{context.agent_index}].rollout.replicas"
    )
    name = agent.name if replicas == 1 else f"{agent.name} replica {context.replica}/{replicas}"
    metrics = rollout_worker_metrics(context)
    engine = engine_for(agent.rollout, agent.learner.lora)
    start = first_missing_step(context.store, agent.name, spec.algorithm.steps, context.replica)
    if start:
        log.info("rollout %s: steps 0..%d already written, resuming at %d", name, start - 1, start)
    # The team may change (store/membership.py): the first step that names the agent.
    first = join_step(context.store, agent.name, start, spec.algorithm.steps, context.current_team)
    if first is None:
        log.info("rollout %s: not in the team for any step from %d (removed or suspended); nothing to do", name, start)
    # Replicas of one agent may share a machine (`hacrl run`): each rebuilds the weights in its own folder.
    weights_root = context.work_dir / ("rollout-weights" if replicas == 1 else f"rollout-weights-{context.replica}")
    floor = 0 if first is None else stint_start(context.store, agent.name, first)
    weights = WeightsHolder(context, engine, weights_root, name, floor)
    return RolloutRun(engine, weights, first, [ServeRolloutMetrics(metrics), LogRolloutStep(name)])


def run_rollout_worker(context: WorkerContext) -> None:
    """The rollout worker's step loop: start-up, then per step load the weights the step samples
    with, sample, score and write its rollouts, and the sinks (metrics, log line)."""
    run = start_rollout(context)
    steps = context.spec.algorithm.steps
    away = False  # the steps before this one were recorded without the agent
    for step in range(steps if run.first_step is None else run.first_step, steps):
        PREEMPTION.arm()  # a SIGTERM stops the worker here, after its last write (hacrl_core/preemption.py)
        if not still_member(context.store, context.agent_name, step, context.current_team):
            if context.agent_name in context.current_team():
                away = True  # recorded without it before it came back: on to the next step naming it
                continue
            log.info("rollout %s: left the team at step %d (removed or suspended)", context.agent_name, step)
            break
        if away:  # back in the team: its learner publishes version ``step`` as it comes back
            run.weights.floor, away = step, False
        if context.store.rollout_part_ready(step, context.agent_name, context.replica):
            continue  # written before the agent sat steps out (a restart after a pause)
        began = time.perf_counter()
        holds = run.weights.for_step(step)
        seconds = {"load_weights": time.perf_counter() - began}
        rows, sampled = sample_rollouts(context.run, StoreRolloutPorts(context), run.engine, step, holds)
        seconds.update(sampled)
        values = rollout_metrics(rows, step, seconds, take_retries())
        step_ended(run.sinks, RolloutStepEnd(step, rows, values))
    run_ended(run.sinks)
