"""One learner step, written once (docs/architecture.md, "One step").

    read own rows -> read peers' rows -> gather_rows -> update_capability -> assign_advantages
    -> plan_updates -> score_pi_old -> publish own scores -> [barrier] -> read peers' scores
    -> run_updates -> step_metrics

``learner_step`` is the only place that calls the stages of ``learner.stages`` and
``learner.updates`` in this order (tests/learner/test_learner_one_step.py fails on a second
copy). Whoever drives it supplies I/O through four narrow ports (``StepPorts``): the learner
worker the trajectory store's (``step_ports.StorePorts``), ``examples/hacpo_step.py`` and the
in-process benchmark an in-memory team's (``step_ports.MemoryPorts``).

It is a generator because of the score exchange: a peer needs this learner's pi_old before it can
train on its rows, and this learner the peer's. It yields once, after publishing its own scores
and before reading the peers'. A worker reads through the barrier at once (the store's read waits
for the peers, ``run_step``); a team in one thread first steps every learner to the barrier, then
each on to the end (``run_team``), which is the order the peers' reads need.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hacrl_core.algorithms import Algorithm
from hacrl_core.learner.batch import TrainRow, rollout_columns
from hacrl_core.learner.stages import (
    LearnerState,
    OldLogprobs,
    assign_advantages,
    gather_rows,
    peer_pi_old,
    score_pi_old,
    scores_shard,
    step_metrics,
    update_capability,
)
from hacrl_core.learner.updates import StepInputs, UpdatePlan, plan_updates, run_updates
from hacrl_core.spec import AlgorithmSpec

#: The step's stage boundaries, in order: ``lap`` is called with each as that stage ends, so a
#: driver can sum them into its own clock (the worker's ``learner/seconds_*``, a benchmark's).
STAGES = ("read_own", "read_peers", "plan", "pi_old", "publish_scores", "read_peer_scores", "update")


@dataclass(frozen=True)
class StepSetup:
    """What a learner's steps need to know besides its state: who it is among the agents, the
    resolved algorithm and the spec's ``algorithm`` section (seed, epochs, ratio bounds, loss knobs).

    score_in_first_update: the first update's own micro-batches score and train at once
    (``plan_updates``); the worker does, the example and the in-process benchmark score apart.
    """

    agent_index: int
    agent_names: tuple[str, ...]  # the step's members (the worker's: its record in the store, store.membership)
    algorithm: Algorithm
    settings: AlgorithmSpec  # the spec's ``algorithm`` section
    score_in_first_update: bool = True

    @property
    def agent_name(self) -> str:
        return self.agent_names[self.agent_index]


@dataclass(frozen=True)
class OwnScores:
    """This learner's pi_old of its own rows at ``step``, as its peers read it."""

    step: int
    agent: str
    rollouts: Any  # the own rollouts shard the own rows were encoded from, in its order
    rows: Sequence[TrainRow]
    old: OldLogprobs

    def shard(self, experiment: str) -> list[dict]:
        """The scores shard (``stages.scores_shard``)."""
        return scores_shard(self.rollouts, self.rows, self.old, experiment=experiment, step=self.step, agent=self.agent)


class StepPorts(Protocol):
    """The step's I/O: a learner reads its own and its peers' rows, publishes its scores and reads
    its peers'. Each list is by agent index."""

    def read_own_rows(self, step: int) -> tuple[Any, list[TrainRow]]:
        """The own rollouts shard and its rows."""

    def read_peer_rows(self, step: int) -> tuple[list, list[list[TrainRow] | None]]:
        """Every peer's rollouts shard and its rows in this learner's tokenizer (None for itself)."""

    def publish_scores(self, scores: OwnScores) -> None:
        """Make the own scores readable by the peers."""

    def read_peer_scores(self, step: int, rollouts: Sequence[Any]) -> list:
        """Every peer's scores shard whose rollouts were read (None for itself and the others)."""


@dataclass(frozen=True)
class StepResult:
    """The step's metrics, and what it trained on (benchmarks replay the same batches)."""

    metrics: dict[str, float]
    rows: list[TrainRow]
    plan: UpdatePlan


def _no_lap(_stage: str) -> None:
    return None


LearnerStep = Generator[OwnScores, None, StepResult]


def learner_step(
    state: LearnerState, setup: StepSetup, ports: StepPorts, step: int, lap: Callable[[str], object] = _no_lap
) -> LearnerStep:
    """One step's training: the stages in order (module docstring); yields once, at the score
    exchange's barrier, and returns the step's metrics."""
    algorithm, settings, index = setup.algorithm, setup.settings, setup.agent_index
    own_rollouts, own_rows = ports.read_own_rows(step)
    lap("read_own")
    n = len(setup.agent_names)
    peer_rollouts: list
    by_agent: list[list[TrainRow] | None]
    if algorithm.shares_rows:
        peer_rollouts, by_agent = ports.read_peer_rows(step)
    else:
        peer_rollouts, by_agent = [None] * n, [None] * n
    by_agent[index] = own_rows
    rows, mean_rewards = gather_rows(by_agent, index)
    lap("read_peers")
    state.tracker.set_team(setup.agent_names)  # the step's members (a team may change between steps)
    update_capability(state.tracker, mean_rewards, algorithm)
    advantages, discrepancy = assign_advantages(rows, state.tracker, algorithm, index, settings.ratio_bounds)
    inputs = StepInputs(rows, advantages, discrepancy, algorithm, settings)
    plan = plan_updates(
        rows,
        settings,
        step=step,
        agent_index=index,
        micro_batching=state.batching,
        score_in_first_update=setup.score_in_first_update,
        lockstep=state.backend.lockstep,
    )
    lap("plan")
    began = time.perf_counter()
    old, started = score_pi_old(state, inputs, plan)
    seconds_pi_old = time.perf_counter() - began  # its no-grad passes and the first update's own micro-batches
    lap("pi_old")
    scores = OwnScores(step, setup.agent_name, own_rollouts, rows, old)
    ports.publish_scores(scores)  # the peers wait for these,
    lap("publish_scores")
    yield scores
    if algorithm.cross_old_logprob == "source":  # and this learner for theirs
        old = old.with_means(peer_pi_old(rows, peer_rollouts, ports.read_peer_scores(step, peer_rollouts)))
    lap("read_peer_scores")
    began = time.perf_counter()
    values = run_updates(state, inputs, plan, old, started, label=f"learner {setup.agent_name} step {step}")
    seconds_update = time.perf_counter() - began
    lap("update")
    values.update(step_metrics(rows, advantages, mean_rewards, state.tracker, algorithm, setup.agent_names, index))
    values["learner/trained_tokens"] = sum(inputs.response_tokens) * settings.epochs
    values["learner/tokens_per_second"] = values["learner/trained_tokens"] / max(seconds_update + seconds_pi_old, 1e-9)
    # The weights being trained are version ``step``; rows sampled with an older one (maxStaleness) lag it.
    versions = rollout_columns(own_rollouts, ["policy_version"])["policy_version"]
    values["learner/policy_lag"] = step - sum(versions) / max(len(versions), 1)
    return StepResult(values, rows, plan)


def run_step(running: LearnerStep) -> StepResult:
    """A step from where it is to its end; one learner alone goes through the barrier at once
    (its ports wait for the peers)."""
    try:
        while True:
            next(running)
    except StopIteration as done:
        return done.value


def run_team(steps: Sequence[LearnerStep]) -> list[StepResult]:
    """Learners of one step in one thread: every one to the barrier (its scores published), then
    each to its end (the peers' scores are there to read)."""
    for running in steps:
        next(running)
    return [run_step(running) for running in steps]
