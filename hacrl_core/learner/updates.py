"""The step's optimizer updates: the plan, the loss of one micro-batch, and the loop over them.

    plan_updates -> (pi_old: ``learner.stages.score_pi_old``) -> run_updates

``plan_updates`` decides once per step which rows each optimizer update trains on and how this
rank cuts them into micro-batches; the pi_old stage and the loop both read that plan. The loop
reads every row's pi_old from the frozen ``OldLogprobs`` the pi_old stage returns and writes
nothing back: per micro-batch it runs one forward pass, ``micro_batch_loss`` (tensors in, loss
and metrics out) and one backward pass, and per update one optimizer step.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hacrl_core.algorithms import Algorithm, PolicyLossInputs, kl_penalty
from hacrl_core.learner import distributed
from hacrl_core.learner.batch import TrainRow, collate_rows
from hacrl_core.learner.guards import is_finite
from hacrl_core.learner.micro_batches import MicroBatching
from hacrl_core.models.logprobs import sequence_logprobs
from hacrl_core.spec import AlgorithmSpec

log = logging.getLogger("hacrl")


@dataclass(frozen=True)
class UpdatePlan:
    """The step's optimizer updates and this rank's micro-batches of each (``plan_updates``).

    updates: row indices of each update, every rank's rows (the loss is normalised over them).
    micro_batches: this rank's micro-batches of each update, row indices in training order.
    idle_passes: zero-weighted passes this rank adds to each update so that every rank of a
        lockstep backend runs as many backward passes.
    micro_batching: how rows are cut into micro-batches (``learner.micro_batches``), the scoring
        passes' too.
    score_in_first_update: the first update's own micro-batches come first and give their rows'
        pi_old from their own forward pass (``learner.stages.score_pi_old``).
    """

    updates: tuple[tuple[int, ...], ...]
    micro_batches: tuple[tuple[tuple[int, ...], ...], ...]
    idle_passes: tuple[int, ...]
    micro_batching: MicroBatching
    score_in_first_update: bool = False

    def first_own_micro_batches(self, rows: Sequence[TrainRow]) -> tuple[tuple[int, ...], ...]:
        """The leading micro-batches of the first update made of own rows: those that score and
        train at once when ``score_in_first_update``, none otherwise."""
        if not self.score_in_first_update or not self.updates:
            return ()
        leading = []
        for chunk in self.micro_batches[0]:
            if not rows[chunk[0]].is_own:
                break
            leading.append(chunk)
        return tuple(leading)


def plan_updates(
    rows: Sequence[TrainRow],
    settings: AlgorithmSpec,
    *,
    step: int,
    agent_index: int,
    micro_batching: MicroBatching,
    score_in_first_update: bool = False,
    lockstep: bool = False,
) -> UpdatePlan:
    """The step's optimizer updates: per epoch a seeded shuffle of the step's prompts, cut into
    mini-batches of ``settings.mini_batch_prompts`` whole prompt groups; each update's rows then
    sliced over the learner ranks (``distributed.rank_slice``) and packed, in order, into
    micro-batches (``MicroBatching.pack``: a budget of padded tokens, a row cap where set).

    ``settings`` is the spec's ``algorithm`` section (seed, epochs, mini_batch_prompts).
    ``score_in_first_update`` (one rank only: with several, a row's pi_old would be known only to
    the rank that trained on it): each update's own rows are cut apart from the peers' and come
    first, so that the first update's own micro-batches can run before the peers' scores are
    read. ``lockstep``: the backend runs collectives in every backward pass (ZeRO 2/3), so every
    rank pads each update with idle passes to the most micro-batches of any rank
    (``MicroBatching.lockstep_count``).
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
            updates.append(
                tuple(i for uid in shuffled[start : start + settings.mini_batch_prompts] for i in by_prompt[uid])
            )
    own_first = score_in_first_update and not distributed.multi_rank()
    chunks = tuple(update_micro_batches(rows, members, micro_batching, own_first=own_first) for members in updates)
    idle = [0] * len(updates)
    if lockstep:  # own_first is one rank's: the ranks' slices are packed as they come
        idle = [micro_batching.lockstep_count(rows, members) - len(mine) for members, mine in zip(updates, chunks)]
    return UpdatePlan(tuple(updates), chunks, tuple(idle), micro_batching, own_first)


def update_micro_batches(
    rows: Sequence[TrainRow], members: Sequence[int], micro_batching: MicroBatching, *, own_first: bool = False
) -> tuple[tuple[int, ...], ...]:
    """This rank's micro-batches (row indices) of one update's rows (``members``): its slice
    (``distributed.rank_slice``) packed in order (``MicroBatching.pack``); ``own_first``: the own
    rows' micro-batches first, then the peers' rows', never mixed."""
    mine = distributed.rank_slice(members)
    parts = [[i for i in mine if rows[i].is_own], [i for i in mine if not rows[i].is_own]] if own_first else [mine]
    return tuple(tuple(chunk) for part in parts for chunk in micro_batching.pack(rows, part))


@dataclass(frozen=True)
class StepInputs:
    """What the step's updates train on besides pi_old: the rows, their advantages and discrepancy
    weights (``learner.stages.assign_advantages``), the algorithm and the spec's ``algorithm``
    section (the loss knobs and ``kl_coef``)."""

    rows: Sequence[TrainRow]
    advantages: torch.Tensor
    discrepancy: torch.Tensor
    algorithm: Algorithm
    settings: AlgorithmSpec  # the spec's ``algorithm`` section
    response_tokens: tuple[int, ...] = field(init=False)  # per row: each update's norm and each micro-batch's share

    def __post_init__(self) -> None:
        object.__setattr__(self, "response_tokens", tuple(sum(row.response_mask) for row in self.rows))

    def loss_weight(self, indices: Sequence[int]) -> float:
        return self.algorithm.loss_weight([self.response_tokens[i] for i in indices])


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch's forward pass: the policy's per-token log-probs (with grad) and the
    collated tensors the reference model needs too."""

    chunk: tuple[int, ...]
    logp_new: torch.Tensor
    input_ids: torch.Tensor
    attention: torch.Tensor
    response: torch.Tensor


def forward_micro_batch(state, rows: Sequence[TrainRow], chunk: Sequence[int]) -> MicroBatch:
    input_ids, attention, response = collate_rows([rows[i] for i in chunk], state.pad_id, state.device)
    return MicroBatch(
        tuple(chunk),
        sequence_logprobs(state.backend.model, input_ids, attention, response),
        input_ids,
        attention,
        response,
    )


def micro_batch_loss(
    inputs: PolicyLossInputs, *, share: float, algorithm: Algorithm, settings
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss one micro-batch adds to its update's gradient, and its metrics.

    ``inputs``: the micro-batch's named tensors (``PolicyLossInputs``: per row [N] or per token
    [N, T]), the reference's log-probs among them (None without a KL term). ``share`` is the
    micro-batch's part of the update in the unit the loss averages over
    (``Algorithm.loss_weight``), so the micro-batches' losses sum to the update's. The KL term
    covers own rows only, weighted by their part of the micro-batch.
    """
    loss, metrics = algorithm.policy_loss(inputs, settings)
    total = loss * share
    if inputs.ref_logp is not None:
        is_own = inputs.is_own
        kl = kl_penalty(inputs.logp_new, inputs.ref_logp, inputs.response_mask, is_own)
        total = total + settings.kl_coef * kl * (float(is_own.sum()) / len(is_own)) * share
        metrics["kl"] = float(kl)
    return total, metrics


def train_micro_batch(
    state,
    inputs: StepInputs,
    batch: MicroBatch,
    old_mean: Sequence[float],
    old_tokens: Sequence[torch.Tensor | None] | torch.Tensor,
    *,
    update_index: int,
    norm: float,
) -> dict[str, float] | None:
    """``micro_batch_loss`` of a forward pass and its backward pass; the metrics, or None for a
    non-finite loss (the update is skipped: no backward, except the one a lockstep backend's
    collectives need). ``old_tokens``: each row's per-token pi_old (None: unknown, 0), or the
    micro-batch's as one tensor shaped as ``batch.logp_new``."""
    logp_new, device = batch.logp_new, state.device
    response_mask = batch.response.to(logp_new.dtype)
    if isinstance(old_tokens, torch.Tensor):
        logp_old = old_tokens
    else:
        logp_old = torch.zeros_like(logp_new)
        for j, tokens in enumerate(old_tokens):
            if tokens is not None:
                logp_old[j, : tokens.shape[0]] = tokens
    chunk = list(batch.chunk)
    is_own = torch.tensor([inputs.rows[i].is_own for i in chunk], device=device)
    ref_logp = None
    if state.reference is not None and is_own.any():
        with torch.no_grad():
            ref_logp = sequence_logprobs(state.reference, batch.input_ids, batch.attention, batch.response)
    loss_inputs = PolicyLossInputs(
        logp_new=logp_new,
        response_mask=response_mask,
        logp_old_mean=torch.tensor(list(old_mean), dtype=logp_new.dtype, device=device),
        logp_old=logp_old,
        advantages=inputs.advantages[chunk].to(device=device, dtype=logp_new.dtype),
        is_own=is_own,
        discrepancy=inputs.discrepancy[chunk].to(device=device, dtype=logp_new.dtype),
        update_index=update_index,
        ref_logp=ref_logp,
    )
    total, metrics = micro_batch_loss(
        loss_inputs, share=inputs.loss_weight(chunk) / norm, algorithm=inputs.algorithm, settings=inputs.settings
    )
    if not is_finite(total):
        if state.backend.lockstep:  # the other ranks reduce in this backward: enter it (the update is skipped anyway)
            state.backend.backward(total * 0.0)
        return None
    state.backend.backward(total)
    return metrics


def collect(collected: dict[str, list[float]], metrics: dict[str, float]) -> None:
    """A micro-batch's metrics into the step's lists; own_* / cross_* only from micro-batches that
    hold such rows (so that they average over those)."""
    for key, value in metrics.items():
        kind = key.split("_", 1)[0]
        if kind in ("own", "cross") and metrics.get(f"{kind}_rows", 1) == 0:
            continue
        collected.setdefault(key, []).append(value)


@dataclass(frozen=True)
class StartedUpdate:
    """The first update as the pi_old stage leaves it when its own micro-batches scored and
    trained there: how many of its leading micro-batches ran, whether every loss was finite
    (a non-finite one skips the update), and their metrics. The gradient is in the backend."""

    micro_batches: int = 0
    finite: bool = True
    metrics: dict[str, list[float]] = field(default_factory=dict)


def idle_pass(state, row: TrainRow, *, backward: bool) -> None:
    """A zero-weighted forward (and backward) on one row: the pass a rank whose slice is shorter
    runs so that every rank enters a lockstep backend's collectives equally often."""
    input_ids, attention, response = collate_rows([row], state.pad_id, state.device)
    logp = sequence_logprobs(state.backend.model if backward else state.model, input_ids, attention, response)
    if backward:
        state.backend.backward(logp.sum() * 0.0)


def train_chunks(
    state, inputs: StepInputs, chunks, old, collected: dict[str, list[float]], update_index: int, norm
) -> tuple[int, int]:
    """Train the micro-batches ``chunks`` of update ``update_index`` in order, their metrics into
    ``collected``; stops at the first non-finite loss. Returns (micro-batches trained, 1 if one
    had a non-finite loss else 0)."""
    trained = 0
    for chunk in chunks:
        batch = forward_micro_batch(state, inputs.rows, chunk)
        metrics = train_micro_batch(
            state,
            inputs,
            batch,
            [old.mean[i] for i in chunk],
            [old.tokens[i] for i in chunk],
            update_index=update_index,
            norm=norm,
        )
        if metrics is None:
            return trained, 1
        collect(collected, metrics)
        trained += 1
    return trained, 0


def run_updates(
    state, inputs: StepInputs, plan: UpdatePlan, old, started: StartedUpdate | None = None, *, label: str = "learner"
) -> dict[str, float]:
    """The step's optimizer updates (``plan``), each accumulated over this rank's micro-batches,
    every row's pi_old read from ``old`` (``learner.stages.OldLogprobs``).

    ``started``: the first update's leading micro-batches already ran in the pi_old stage (their
    gradient is in the backend): the first update goes on from there. Returns the step's
    ``learner/*`` metrics: the loss metrics averaged over micro-batches, the gradient norm, the
    number of updates and of those skipped for a non-finite loss or gradient.

    With several learner ranks each trains on its slice of every update's rows with the loss
    still normalised over the whole update (``norm``), and the backend sums the gradients over
    the ranks: the one-rank update. The metrics then cover every rank's micro-batches.
    """
    old.require(index for members in plan.updates for index in members)
    rows = inputs.rows
    started = started or StartedUpdate()
    collected = {key: list(values) for key, values in started.metrics.items()}
    skipped = 0
    for update_index, (members, chunks, idle) in enumerate(zip(plan.updates, plan.micro_batches, plan.idle_passes)):
        norm = inputs.loss_weight(members)
        finite_loss, done = True, 0
        if update_index == 0 and started.micro_batches:
            finite_loss, done = started.finite, started.micro_batches
        else:
            state.backend.zero_grad()
        trained, failed = 0, 0
        if finite_loss:
            trained, failed = train_chunks(state, inputs, chunks[done:], old, collected, update_index, norm)
            finite_loss = not failed  # a non-finite loss: the update is skipped below
        if state.backend.lockstep:  # ZeRO 2/3 reduce in every backward: as many on every rank, a skipped update's too
            owed = len(chunks) - done - trained - failed + idle
            for _ in range(owed):
                idle_pass(state, rows[members[0]], backward=True)
        finite_loss = distributed.all_agree(finite_loss)  # one rank's non-finite loss skips the update everywhere
        grad_norm = state.backend.step() if finite_loss else float("nan")  # backends skip a non-finite gradient
        if not is_finite(grad_norm):  # its gradients are dropped by the next update's zero_grad (or the last one)
            skipped += 1
            log.warning(
                "%s update %d: non-finite %s; update skipped",
                label,
                update_index,
                "gradient norm" if finite_loss else "loss",
            )
        else:
            collected.setdefault("grad_norm", []).append(grad_norm)
    state.backend.zero_grad()
    return summarize(distributed.gather_lists(collected), len(plan.updates), skipped)


def summarize(collected: dict[str, list[float]], updates: int, skipped: int) -> dict[str, float]:
    """The step's ``learner/*`` metrics from every micro-batch's values (every rank's)."""
    total_weight, cross_weight = collected.pop("grad_weight", None), collected.pop("cross_grad_weight", None)
    if (
        total_weight and cross_weight is not None
    ):  # the cross rows' share of the whole step's gradient weight, not a mean of per-micro-batch shares
        collected["cross_grad_share"] = [sum(cross_weight) / sum(total_weight) if sum(total_weight) > 0 else 0.0]
    summary = {f"learner/{key}": sum(values) / len(values) for key, values in collected.items()}
    summary["learner/updates"] = updates
    summary["learner/skipped_updates"] = skipped
    return summary
