"""One learner step as stages on rows and tensors (docs/runtime.md, "Learner, step t";
docs/architecture.md, "One step").

    gather_rows -> update_capability -> assign_advantages -> plan_updates
    -> score_pi_old -> [the caller: own scores out, the peers' in: source_logprobs]
    -> run_updates -> step_metrics

Every stage takes what it needs as arguments and returns its result: no store, no files, no
clock. pi_old is computed in one stage (``score_pi_old``, which may train the first update's own
micro-batches as it scores them) and returned frozen (``OldLogprobs``); the update loop
(``learner.updates``) only reads it. The learner worker (``learner.worker``) reads the step's
shards, calls these stages in this order, exchanges scores with the peers between the pi_old
stage and the updates, and writes what they return; ``examples/hacpo_step.py`` and the
in-process benchmark call the same functions on rows sampled in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hacrl_core.algorithms import Algorithm, CapabilityTracker, group_advantages
from hacrl_core.learner import distributed
from hacrl_core.learner.batch import TrainRow, rollout_columns, score_rows
from hacrl_core.learner.micro_batches import MicroBatching
from hacrl_core.learner.state import LearnerState
from hacrl_core.learner.updates import (
    StartedUpdate,
    StepInputs,
    UpdatePlan,
    collect,
    forward_micro_batch,
    idle_pass,
    train_micro_batch,
)


@dataclass(frozen=True)
class OldLogprobs:
    """pi_old of every row of the step, in the rows' order, frozen: the mean log-prob over each
    row's response tokens (a peer's row scored by its source: over the source's tokens) and, for
    rows the learner scored itself, the per-token log-probs (token-level losses read them).
    None where not known yet: a peer's row until its source's scores are read."""

    mean: tuple[float | None, ...]
    tokens: tuple[torch.Tensor | None, ...]

    def with_means(self, values: Mapping[int, float]) -> OldLogprobs:
        """These values with ``values`` (row index -> mean) filled in: the peers' scores."""
        return OldLogprobs(tuple(values.get(i, mean) for i, mean in enumerate(self.mean)), self.tokens)

    def require(self, indices: Iterable[int]) -> None:
        missing = sorted({i for i in indices if self.mean[i] is None})
        if missing:
            raise RuntimeError(
                f"rows {missing} reached an update without pi_old; give a peer's rows their source's scores "
                "(source_logprobs, OldLogprobs.with_means) before run_updates"
            )


def score_pi_old(state: LearnerState, inputs: StepInputs, plan: UpdatePlan) -> tuple[OldLogprobs, StartedUpdate | None]:
    """pi_old of the step's rows as far as the learner computes it: its own rows' log-probs under
    the weights that sampled them, and the peers' rows' too where the algorithm treats them as
    on-policy (``cross_old_logprob`` "learner": naive sharing). A peer's row scored by its source
    (HACPO) stays None here: its value comes from the source's scores shard, which the caller reads
    after publishing these (``OldLogprobs.with_means``).

    Score and train: where ``plan.score_in_first_update``, the first update's own micro-batches
    (``UpdatePlan.first_own_micro_batches``) are not scored apart. The weights have not moved when
    they run, so their forward pass gives their rows' pi_old exactly: they run here, forward and
    backward, as the first micro-batches of the first update, and one no-grad pass over those rows
    is saved. The returned ``StartedUpdate`` says how far that update got (``run_updates`` goes on
    from there); None when nothing trained here. A non-finite loss there stops the training and
    the rest of those rows are scored apart.
    """
    rows = inputs.rows
    first = plan.first_own_micro_batches(rows)
    trained = {i for chunk in first for i in chunk}
    mean: list[float | None] = [None] * len(rows)
    tokens: list[torch.Tensor | None] = [None] * len(rows)
    score_into(
        state,
        rows,
        [i for i, row in enumerate(rows) if row.is_own and i not in trained],
        plan.micro_batching,
        mean,
        tokens,
    )
    if inputs.algorithm.cross_old_logprob == "learner":
        for source in dict.fromkeys(
            row.source for row in rows if not row.is_own
        ):  # each peer's rows, as one scoring call
            peer = [i for i, row in enumerate(rows) if not row.is_own and row.source == source]
            score_into(state, rows, peer, plan.micro_batching, mean, None)
    started = score_and_train(state, inputs, plan, first, mean, tokens) if first else None
    return OldLogprobs(tuple(mean), tuple(tokens)), started


def score_and_train(
    state: LearnerState,
    inputs: StepInputs,
    plan: UpdatePlan,
    chunks: Sequence[Sequence[int]],
    mean: list[float | None],
    tokens: list[torch.Tensor | None],
) -> StartedUpdate:
    """The first update's leading own micro-batches, trained, with their rows' pi_old taken from
    their own forward pass (into ``mean`` and ``tokens``); see ``score_pi_old``."""
    rows = inputs.rows
    state.backend.zero_grad()
    norm = inputs.loss_weight(plan.updates[0])
    collected: dict[str, list[float]] = {}
    for done, chunk in enumerate(chunks):
        batch = forward_micro_batch(state, rows, chunk)
        old = batch.logp_new.detach()
        mask = batch.response.to(old.dtype)
        # The whole micro-batch at once: one reduction and one copy to the host, not a few
        # tensor operations per row (128 rows: 10 ms of a 0.6 s step).
        chunk_mean = ((old * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
        host = old.cpu()
        for j, i in enumerate(chunk):
            tokens[i], mean[i] = host[j, : len(rows[i].input_ids)], chunk_mean[j]
        # pi_old of these rows is their own forward pass, padding included (0 there as in logp_new).
        metrics = train_micro_batch(state, inputs, batch, chunk_mean, old, update_index=0, norm=norm)
        if metrics is None:  # the update is skipped; the rows not reached still need their pi_old
            score_into(
                state, rows, [i for later in chunks[done + 1 :] for i in later], plan.micro_batching, mean, tokens
            )
            return StartedUpdate(len(chunks), False, collected)
        collect(collected, metrics)
    return StartedUpdate(len(chunks), True, collected)


def score_into(
    state: LearnerState,
    rows: Sequence[TrainRow],
    indices: Sequence[int],
    micro_batching: MicroBatching,
    mean: list[float | None],
    tokens: list[torch.Tensor | None] | None,
) -> None:
    """No-grad pi_old of ``rows[indices]`` into ``mean`` (and per token into ``tokens``)."""
    if not indices:
        return
    sums, counts, token_logps = score_sliced(state, [rows[i] for i in indices], micro_batching)
    for i, total, count, per_token in zip(indices, sums, counts, token_logps):
        mean[i] = total / max(count, 1)
        if tokens is not None:
            tokens[i] = per_token


def _scored(mean: float | None) -> float:
    """An own row's pi_old, which scoring always sets (None there is a bug, not a value)."""
    if mean is None:
        raise RuntimeError("an own row of the step has no pi_old: it was never scored")
    return mean


def scores_shard(
    rollouts: Any, rows: Sequence[TrainRow], old: OldLogprobs, *, experiment: str, step: int, agent: str
) -> list[dict]:
    """The scores shard of a step: pi_old (sum and count over response tokens) of every own row.
    ``rollouts``: the own rollouts shard the own rows of ``rows`` were encoded from, in its order
    (``batch.rollout_columns``); ``old``: every row's pi_old (``score_pi_old``)."""
    keys = rollout_columns(rollouts, ("prompt_uid", "sample_index"))
    own = [(old.mean[i], sum(row.response_mask)) for i, row in enumerate(rows) if row.is_own]
    return [
        {
            "experiment": experiment,
            "step": step,
            "source_agent": agent,
            "prompt_uid": uid,
            "sample_index": sample,
            "logp_sum": _scored(mean) * count,
            "token_count": count,
        }
        for uid, sample, (mean, count) in zip(keys["prompt_uid"], keys["sample_index"], own)
    ]


def source_logprobs(rollouts: Any, scores: Any) -> list[float]:
    """pi_old of each row of a peer's rollouts shard from the peer's own scores shard (importance
    sampling across policies), in the rollouts' order. ``rollouts`` and ``scores``: the peer's
    shards, tables or row dicts (``batch.rollout_columns``)."""
    keys = rollout_columns(rollouts, ("prompt_uid", "sample_index"))
    scored = rollout_columns(scores, ("prompt_uid", "sample_index", "logp_sum", "token_count"))
    by_key = {
        (uid, sample): (total, count)
        for uid, sample, total, count in zip(
            scored["prompt_uid"], scored["sample_index"], scored["logp_sum"], scored["token_count"]
        )
    }
    values = []
    for key in zip(keys["prompt_uid"], keys["sample_index"]):
        total, count = by_key[key]
        values.append(total / max(count, 1))
    return values


def peer_pi_old(
    rows: Sequence[TrainRow], rollouts_by_agent: Sequence[Any], scores_by_agent: Sequence[Any]
) -> dict[int, float]:
    """Row index -> pi_old of every peer row of ``rows`` from its source's scores shard
    (``source_logprobs``): for ``OldLogprobs.with_means``. ``rollouts_by_agent`` and
    ``scores_by_agent``: each agent's shards by agent index, None for the learner itself."""
    values: dict[int, float] = {}
    for source, (rollouts, scores) in enumerate(zip(rollouts_by_agent, scores_by_agent)):
        if scores is not None:
            theirs = [i for i, row in enumerate(rows) if not row.is_own and row.source == source]
            values.update(zip(theirs, source_logprobs(rollouts, scores)))
    return values


def score_sliced(
    state: LearnerState, rows: Sequence[TrainRow], micro_batching: MicroBatching
) -> tuple[list, list, list]:
    """``score_rows`` of every row: with several learner ranks each scores its slice
    (``distributed.rank_slice``) and every rank gets all the scores back, in the rows' order."""
    if not distributed.multi_rank():
        return score_rows(state.model, rows, state.pad_id, micro_batching, state.device)
    mine = distributed.rank_slice(rows)
    scored = score_rows(state.model, mine, state.pad_id, micro_batching, state.device)
    if state.backend.lockstep:  # ZeRO-3 gathers parameters in every forward: as many on every rank
        idle = micro_batching.lockstep_count(rows, range(len(rows))) - len(micro_batching.pack(mine, range(len(mine))))
        with torch.no_grad():
            for _ in range(idle):
                idle_pass(state, rows[0], backward=False)
    merged = distributed.gather_in_order(list(zip(*scored)), len(rows))
    return [m[0] for m in merged], [m[1] for m in merged], [m[2] for m in merged]


def mean_reward(rows: Sequence[TrainRow]) -> float:
    return sum(r.reward for r in rows) / max(len(rows), 1)


def gather_rows(rows_by_agent: Sequence[list[TrainRow] | None], agent_index: int) -> tuple[list[TrainRow], list[float]]:
    """The step's training rows (own first, then every peer's that is given) and each agent's mean
    reward (0 for agents whose rows are not given: isolated algorithms read no peer)."""
    rows = list(rows_by_agent[agent_index] or [])
    for index, peer in enumerate(rows_by_agent):
        if index != agent_index and peer:
            rows.extend(peer)
    return rows, [mean_reward(peer) if peer else 0.0 for peer in rows_by_agent]


def update_capability(tracker: CapabilityTracker, mean_rewards: Sequence[float], algorithm: Algorithm) -> None:
    if algorithm.shares_rows:  # isolated algorithms never look at capability
        tracker.update(list(mean_rewards))


def assign_advantages(
    rows: Sequence[TrainRow],
    tracker: CapabilityTracker,
    algorithm: Algorithm,
    agent_index: int,
    ratio_bounds: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages (mechanism 1) and cross-row discrepancy weights (mechanism 2) of every row."""
    groups = {uid: i for i, uid in enumerate(dict.fromkeys(r.group for r in rows))}
    capability = torch.ones_like(tracker.capability, dtype=torch.float64) if tracker.in_warmup else tracker.capability
    advantages = group_advantages(
        torch.tensor([r.reward for r in rows], dtype=torch.float64),
        torch.tensor([groups[r.group] for r in rows]),
        torch.tensor([r.source for r in rows]),
        agent_index,
        capability,
        mode=algorithm.advantage_mode,
        bounds=(ratio_bounds[0], ratio_bounds[1]),
    )
    ratios = tracker.ratio_matrix()
    discrepancy = torch.tensor(
        [
            1.0 if r.is_own or not algorithm.discrepancy_coefficient else float(ratios[r.source, agent_index])
            for r in rows
        ],
        dtype=torch.float64,
    )
    return advantages, discrepancy


def step_metrics(
    rows: Sequence[TrainRow],
    advantages: torch.Tensor,
    mean_rewards: Sequence[float],
    tracker: CapabilityTracker,
    algorithm: Algorithm,
    agent_names: Sequence[str],
    agent_index: int,
) -> dict[str, float]:
    """What a step trained on, beyond the loss: row counts, advantages, rewards and capabilities."""
    values = {
        "rollout/reward_mean": mean_rewards[agent_index],
        "learner/own_rows": float(sum(r.is_own for r in rows)),
        "learner/cross_rows": float(sum(not r.is_own for r in rows)),
        "learner/advantage_abs_mean": float(advantages.abs().mean()),
    }
    if algorithm.shares_rows:
        capability = tracker.capability
        for index, name in enumerate(agent_names):
            values[f"capability/{name}"] = float(capability[index])
            values[f"rollout/reward_mean/{name}"] = mean_rewards[index]
            if index != agent_index:
                values[f"capability/ratio/{name}"] = tracker.ratio(index, agent_index)
    return values
