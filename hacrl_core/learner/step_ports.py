"""The learner step's I/O (``step.StepPorts``): the trajectory store's, and an in-memory team's.

Both take what they use (the agents' names, this learner's index, its tokenizer and the chat
template), not the worker's whole context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hacrl_core.learner import distributed
from hacrl_core.learner.batch import TrainRow, encode_rows
from hacrl_core.learner.step import OwnScores


@dataclass(frozen=True)
class StorePorts:
    """A learner worker's: shards of the trajectory store (``store.TrajectoryStore``), each read
    waiting up to ``wait_seconds`` for its writer."""

    store: Any
    experiment: str
    agent_names: Sequence[str]
    agent_index: int
    tokenizer: Any
    template: str
    wait_seconds: float

    def _rows(self, rollouts: Any, index: int) -> list[TrainRow]:
        return encode_rows(
            rollouts, source=index, is_own=index == self.agent_index, tokenizer=self.tokenizer, template=self.template
        )

    def read_own_rows(self, step: int) -> tuple[Any, list[TrainRow]]:
        # The store's Arrow table (``read_rollouts_columns``): encode_rows reads its columns.
        rollouts = self.store.read_rollouts_columns(step, self.agent_names[self.agent_index], wait=self.wait_seconds)
        return rollouts, self._rows(rollouts, self.agent_index)

    def read_peer_rows(self, step: int) -> tuple[list, list[list[TrainRow] | None]]:
        rollouts: list = [None] * len(self.agent_names)
        peers: list[list[TrainRow] | None] = [None] * len(self.agent_names)
        for index, name in enumerate(self.agent_names):
            if index != self.agent_index:
                rollouts[index] = self.store.read_rollouts_columns(step, name, wait=self.wait_seconds)
                peers[index] = self._rows(rollouts[index], index)
        return rollouts, peers

    def publish_scores(self, scores: OwnScores) -> None:
        """The scores shard, unless a previous attempt wrote it (rank 0 of several learner ranks;
        every rank has every row's pi_old)."""
        if not distributed.is_writer() or self.store.scores_ready(scores.step, scores.agent):
            return
        self.store.write_scores(scores.step, scores.agent, scores.shard(self.experiment))

    def read_peer_scores(self, step: int, rollouts: Sequence[Any]) -> list:
        return [
            None
            if index == self.agent_index or rollouts[index] is None
            else self.store.read_scores_columns(step, name, wait=self.wait_seconds)
            for index, name in enumerate(self.agent_names)
        ]


@dataclass
class MemoryExchange:
    """The scores shards a team in one process published this step, by agent index."""

    experiment: str
    shards: dict[int, list[dict]] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryPorts:
    """One learner of a team in one process (``step.run_team``): every agent's rollouts shard of
    the step, sampled in memory (row dicts, ``rollout.sampling.rollout_rows``), by agent index."""

    rollouts: Sequence[Any]
    agent_index: int
    tokenizer: Any
    template: str
    exchange: MemoryExchange

    def _rows(self, index: int) -> list[TrainRow]:
        return encode_rows(
            self.rollouts[index],
            source=index,
            is_own=index == self.agent_index,
            tokenizer=self.tokenizer,
            template=self.template,
        )

    def read_own_rows(self, step: int) -> tuple[Any, list[TrainRow]]:
        return self.rollouts[self.agent_index], self._rows(self.agent_index)

    def read_peer_rows(self, step: int) -> tuple[list, list[list[TrainRow] | None]]:
        peers = [i != self.agent_index for i in range(len(self.rollouts))]
        return (
            [shard if peer else None for shard, peer in zip(self.rollouts, peers)],
            [self._rows(i) if peer else None for i, peer in enumerate(peers)],
        )

    def publish_scores(self, scores: OwnScores) -> None:
        self.exchange.shards[self.agent_index] = scores.shard(self.exchange.experiment)

    def read_peer_scores(self, step: int, rollouts: Sequence[Any]) -> list:
        return [
            None if i == self.agent_index or shard is None else self.exchange.shards[i]
            for i, shard in enumerate(rollouts)
        ]
