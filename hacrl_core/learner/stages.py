"""One learner step as stages on rows and tensors (docs/architecture.md, "One step", steps 2-8).

    score_own_rows -> (peers' rows: score_as_learner) -> gather_rows -> update_capability
    -> assign_advantages -> run_updates (after the first update's own rows: the caller's
    after_own_rows, e.g. scores out and set_source_logprobs) -> step_metrics

Every stage takes what it needs as arguments and returns its result: no store, no files, no
clock. The learner worker (``learner.worker``) reads the step's shards, calls these stages in
this order and writes what they return; ``examples/hacpo_step.py`` and the in-process benchmark
call the same functions on rows sampled in memory.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hacrl_core.algorithms import Algorithm, CapabilityTracker, PolicyLossInputs, group_advantages, kl_penalty
from hacrl_core.learner import distributed
from hacrl_core.learner.backends import TrainingBackend
from hacrl_core.learner.batch import TrainRow, collate_rows, micro_batches, rollout_columns, score_rows
from hacrl_core.learner.guards import is_finite
from hacrl_core.models.logprobs import sequence_logprobs

log = logging.getLogger("hacrl")


@dataclass
class LearnerState:
    """The learner's policy and everything that changes with it between steps."""

    model: torch.nn.Module
    tokenizer: object
    backend: TrainingBackend
    tracker: CapabilityTracker
    next_step: int
    reference: torch.nn.Module | None = None
    device: str = "cpu"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def pad_id(self) -> int:
        return pad_id(self.tokenizer)


def start_state(model: torch.nn.Module, tokenizer, backend: TrainingBackend, settings, n_agents: int, *, next_step: int = 0,
                reference: torch.nn.Module | None = None, device: str = "cpu") -> LearnerState:
    """A learner's state around a loaded policy and its backend, with a fresh capability history
    (``settings``: the spec's ``algorithm`` section: window, floor, ratio bounds, warm-up)."""
    tracker = CapabilityTracker(n_agents, settings.capability_window, settings.capability_floor, tuple(settings.ratio_bounds),
                                settings.warmup_steps)
    backend.model.train()
    return LearnerState(backend.unwrapped_model(), tokenizer, backend, tracker, next_step, reference, device)


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def plan_updates(rows: Sequence[TrainRow], settings, *, step: int, agent_index: int) -> list[list[int]]:
    """Row indices of each optimizer update of the step: per epoch a seeded shuffle of the step's
    prompts, cut into mini-batches of ``settings.mini_batch_prompts`` whole prompt groups.

    ``settings`` is the spec's ``algorithm`` section (seed, epochs, mini_batch_prompts).
    """
    by_prompt: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        by_prompt.setdefault(row.group, []).append(index)
    prompts = list(by_prompt)
    order = random.Random(f"{settings.seed}/{step}/{agent_index}")
    updates = []
    for _epoch in range(settings.epochs):
        shuffled = prompts[:]
        order.shuffle(shuffled)
        for start in range(0, len(shuffled), settings.mini_batch_prompts):
            updates.append([i for uid in shuffled[start : start + settings.mini_batch_prompts] for i in by_prompt[uid]])
    return updates


def score_own_rows(state: LearnerState, rows: list[TrainRow], algorithm: Algorithm, first_update: Sequence[int],
                   micro_batch_size: int, *, defer_shared: bool = False) -> list[TrainRow]:
    """pi_old of the agent's own rows: their log-probs under the weights that sampled them.

    The rows of the step's first update (``first_update``, row indices) are skipped: the weights
    have not moved when that update runs, so its own forward pass gives their pi_old exactly
    (``run_updates`` fills it in) and one no-grad pass over those rows is saved. Isolated
    algorithms always skip them. Algorithms that share rows skip them only with
    ``defer_shared``: the peers need every own row's pi_old before they can train, so the caller
    publishes the scores from ``run_updates``'s ``after_own_rows``, once the first update's own
    micro-batches have run (``learner.worker.train_step``); without it every row is scored here.
    Several learner ranks score every row (sliced between them): a deferred row's pi_old would be
    known only to the rank that trained on it.
    """
    defer = (defer_shared or not algorithm.shares_rows) and not distributed.multi_rank()
    deferred = set(first_update) if defer else set()
    scored = [row for index, row in enumerate(rows) if index not in deferred]
    sums, counts, tokens = score_sliced(state, scored, micro_batch_size)
    for row, total, count, token_logps in zip(scored, sums, counts, tokens):
        row.logp_old_mean = total / max(count, 1)
        row.logp_old_tokens = token_logps
    for index in deferred:
        rows[index].logp_old_mean = None
    return rows


def scores_shard(rollouts: Any, rows: Sequence[TrainRow], *, experiment: str, step: int, agent: str) -> list[dict]:
    """The scores shard of a step: pi_old (sum and count over response tokens) of every own row.
    ``rollouts``: the own rollouts shard the rows were encoded from (``batch.rollout_columns``)."""
    keys = rollout_columns(rollouts, ("prompt_uid", "sample_index"))
    shard = []
    for uid, sample, row in zip(keys["prompt_uid"], keys["sample_index"], rows):
        count = sum(row.response_mask)
        shard.append({"experiment": experiment, "step": step, "source_agent": agent, "prompt_uid": uid, "sample_index": sample,
                      "logp_sum": row.logp_old_mean * count, "token_count": count})
    return shard


def set_source_logprobs(cross: list[TrainRow], rollouts: Any, scores: Any) -> list[TrainRow]:
    """pi_old of a peer's rows from the peer's own scores shard (importance sampling across policies).
    ``rollouts`` and ``scores``: the peer's shards, tables or row dicts (``batch.rollout_columns``)."""
    keys = rollout_columns(rollouts, ("prompt_uid", "sample_index"))
    scored = rollout_columns(scores, ("prompt_uid", "sample_index", "logp_sum", "token_count"))
    by_key = {(uid, sample): (total, count) for uid, sample, total, count in
              zip(scored["prompt_uid"], scored["sample_index"], scored["logp_sum"], scored["token_count"])}
    for row, key in zip(cross, zip(keys["prompt_uid"], keys["sample_index"])):
        total, count = by_key[key]
        row.logp_old_mean = total / max(count, 1)
    return cross


def score_as_learner(state: LearnerState, cross: list[TrainRow], micro_batch_size: int) -> list[TrainRow]:
    """pi_old of a peer's rows from the learner's own pre-update view (naive sharing: as if on-policy)."""
    sums, counts, _ = score_sliced(state, cross, micro_batch_size)
    for row, total, count in zip(cross, sums, counts):
        row.logp_old_mean = total / max(count, 1)
    return cross


def score_sliced(state: LearnerState, rows: Sequence[TrainRow], micro_batch_size: int) -> tuple[list, list, list]:
    """``score_rows`` of every row: with several learner ranks each scores its slice
    (``distributed.rank_slice``) and every rank gets all the scores back, in the rows' order."""
    if not distributed.multi_rank():
        return score_rows(state.model, rows, state.pad_id, micro_batch_size, state.device)
    mine = score_rows(state.model, distributed.rank_slice(rows), state.pad_id, micro_batch_size, state.device)
    if state.backend.lockstep:  # ZeRO-3 gathers parameters in every forward: as many on every rank
        with torch.no_grad():
            for _ in range(distributed.lockstep_chunks(len(rows), micro_batch_size) - math.ceil(len(mine[0]) / micro_batch_size)):
                idle_pass(state, rows[0], backward=False)
    merged = distributed.gather_in_order(list(zip(*mine)), len(rows))
    return [m[0] for m in merged], [m[1] for m in merged], [m[2] for m in merged]


def idle_pass(state: LearnerState, row: TrainRow, *, backward: bool) -> None:
    """A zero-weighted forward (and backward) on one row: the pass a rank whose slice is shorter
    runs so that every rank enters a lockstep backend's collectives equally often."""
    input_ids, attention, response = collate_rows([row], state.pad_id, state.device)
    logp = sequence_logprobs(state.backend.model if backward else state.model, input_ids, attention, response)
    if backward:
        state.backend.backward(logp.sum() * 0.0)


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


def assign_advantages(rows: Sequence[TrainRow], tracker: CapabilityTracker, algorithm: Algorithm, agent_index: int,
                      ratio_bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
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
        bounds=tuple(ratio_bounds),
    )
    ratios = tracker.ratio_matrix()
    discrepancy = torch.tensor(
        [1.0 if r.is_own or not algorithm.discrepancy_coefficient else float(ratios[r.source, agent_index]) for r in rows],
        dtype=torch.float64,
    )
    return advantages, discrepancy


def update_chunks(rows: Sequence[TrainRow], members: Sequence[int], micro_batch_size: int, *, own_first: bool = False) -> list[list[int]]:
    """This rank's micro-batches (row indices) of one update's rows (``members``, from
    ``plan_updates``): its slice (``distributed.rank_slice``) cut into ``micro_batch_size`` rows.
    ``own_first``: the own rows' micro-batches first, then the peers' rows', never mixed (what
    ``run_updates`` does when it is given ``after_own_rows``)."""
    mine = distributed.rank_slice(members)
    if not own_first:
        return list(micro_batches(mine, micro_batch_size))
    own = [i for i in mine if rows[i].is_own]
    return list(micro_batches(own, micro_batch_size)) + list(micro_batches([i for i in mine if not rows[i].is_own], micro_batch_size))


def run_updates(state: LearnerState, rows: list[TrainRow], updates: Sequence[Sequence[int]], advantages: torch.Tensor,
                discrepancy: torch.Tensor, algorithm: Algorithm, settings, micro_batch_size: int, *, label: str = "learner",
                after_own_rows: Callable[[], None] | None = None) -> dict[str, float]:
    """The step's optimizer updates (``plan_updates``), each accumulated over micro-batches of rows.

    ``settings`` is the spec's ``algorithm`` section (the loss knobs and ``kl_coef``). Returns the
    step's ``learner/*`` metrics: the loss metrics averaged over micro-batches, the gradient norm,
    the number of updates and of those skipped for a non-finite loss or gradient.

    With several learner ranks each trains on its slice of every update's rows
    (``distributed.rank_slice``) with the loss still normalised over the whole update
    (``norm``), and the backend sums the gradients over the ranks: the one-rank update. The
    metrics then cover every rank's micro-batches.

    ``after_own_rows`` is called once, in the first update, after its own rows' micro-batches and
    before any peer row's (``update_chunks`` own_first): by then every own row has its pi_old
    (the rows ``score_own_rows`` deferred got it from their forward pass here), and the callback
    publishes the scores and gives the peer rows theirs. With several learner ranks (nothing
    deferred, micro-batches as the lockstep backends count them) it is called before the first
    update.
    """
    collected: dict[str, list[float]] = {}
    device = state.device
    advantages, discrepancy = advantages.to(device), discrepancy.to(device)
    skipped = 0
    own_first = after_own_rows is not None and not distributed.multi_rank()
    if after_own_rows is not None and not own_first:
        after_own_rows()
    pending = own_first
    response_tokens = [sum(row.response_mask) for row in rows]  # once per row: each update's norm and each micro-batch's share use them
    for update_index, members in enumerate(updates):
        norm = algorithm.loss_weight([response_tokens[i] for i in members])
        state.backend.zero_grad()
        finite_loss = True
        chunks: list[list[int] | None] = list(update_chunks(rows, members, micro_batch_size, own_first=own_first))
        if state.backend.lockstep:  # ZeRO 2/3 reduce in every backward: as many on every rank
            chunks += [None] * (distributed.lockstep_chunks(len(members), micro_batch_size) - len(chunks))
        for chunk in chunks:
            if chunk is None:
                idle_pass(state, rows[members[0]], backward=True)
                continue
            chunk_rows = [rows[i] for i in chunk]
            if pending and not chunk_rows[0].is_own:  # the first peer rows: every own row has its pi_old now
                after_own_rows()
                pending = False
            input_ids, attention, response = collate_rows(chunk_rows, state.pad_id, device)
            logp_new = sequence_logprobs(state.backend.model, input_ids, attention, response)
            response_mask = response.to(logp_new.dtype)
            logp_old = torch.zeros_like(logp_new)
            for j, row in enumerate(chunk_rows):
                if row.logp_old_mean is None:  # deferred by score_own_rows: pi_old is pi_new here
                    if not row.is_own:
                        raise RuntimeError("a peer's row without pi_old reached an update; give it the peer's scores (set_source_logprobs) first")
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
            loss, metrics = algorithm.policy_loss(inputs, settings)
            share = algorithm.loss_weight([response_tokens[i] for i in chunk]) / norm
            total = loss * share
            if state.reference is not None and inputs.is_own.any():
                with torch.no_grad():
                    ref_logp = sequence_logprobs(state.reference, input_ids, attention, response)
                kl = kl_penalty(logp_new, ref_logp, inputs.response_mask, inputs.is_own)
                total = total + settings.kl_coef * kl * (float(inputs.is_own.sum()) / len(chunk_rows)) * share
                metrics["kl"] = float(kl)
            if not is_finite(total):
                finite_loss = False  # no backward: the update is skipped below
                break
            state.backend.backward(total)
            for key, value in metrics.items():
                kind = key.split("_", 1)[0]  # own_* / cross_*: averaged over the micro-batches that hold such rows
                if kind in ("own", "cross") and metrics.get(f"{kind}_rows", 1) == 0:
                    continue
                collected.setdefault(key, []).append(value)
        if pending:  # the first update has no peer rows, or a non-finite loss ended it early
            unscored = [rows[i] for i in members if rows[i].logp_old_mean is None]
            score_own_rows(state, unscored, algorithm, [], micro_batch_size)
            after_own_rows()
            pending = False
        finite_loss = distributed.all_agree(finite_loss)  # one rank's non-finite loss skips the update everywhere
        grad_norm = state.backend.step() if finite_loss else float("nan")  # backends skip a non-finite gradient
        if not is_finite(grad_norm):  # its gradients are dropped by the next update's zero_grad (or the last one)
            skipped += 1
            log.warning("%s update %d: non-finite %s; update skipped", label, update_index, "gradient norm" if finite_loss else "loss")
        else:
            collected.setdefault("grad_norm", []).append(grad_norm)
    state.backend.zero_grad()
    collected = distributed.gather_lists(collected)
    total_weight, cross_weight = collected.pop("grad_weight", None), collected.pop("cross_grad_weight", None)
    if total_weight:  # the cross rows' share of the whole step's gradient weight, not a mean of per-micro-batch shares
        collected["cross_grad_share"] = [sum(cross_weight) / sum(total_weight) if sum(total_weight) > 0 else 0.0]
    summary = {f"learner/{key}": sum(values) / len(values) for key, values in collected.items()}
    summary["learner/updates"] = len(updates)
    summary["learner/skipped_updates"] = skipped
    return summary


def step_metrics(rows: Sequence[TrainRow], advantages: torch.Tensor, mean_rewards: Sequence[float], tracker: CapabilityTracker,
                 algorithm: Algorithm, agent_names: Sequence[str], agent_index: int) -> dict[str, float]:
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
