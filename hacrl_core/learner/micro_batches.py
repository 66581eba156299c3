"""Micro-batches sized by tokens: rows packed, in order, up to a budget of padded tokens.

A forward pass over a micro-batch allocates for every row padded to the longest one, so what a
micro-batch costs in memory is its rows x its longest row (verl's ``ppo_max_token_len_per_gpu``
counts the same way). ``MicroBatching.pack`` cuts rows into micro-batches that stay within
``max_tokens`` padded tokens, and within ``max_rows`` rows where a row cap is set
(``learner.microBatchSize``). The budget is ``learner.microBatchTokens`` or, unset, derived from
the device (``default_micro_batch_tokens``). How the rows are cut never changes the update: each
micro-batch's loss is weighted by its share of the mini-batch (``Algorithm.loss_weight``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hacrl_core.learner import distributed
from hacrl_core.spec import LearnerSettings

#: The share of the machine's memory a CPU learner's activations may take: the rest is the
#: weights, the optimizer, the reference model, the rollout engine and the other workers.
CPU_MEMORY_SHARE = 0.25
#: The share of a GPU's free memory (less the gradients and AdamW's moments, which the first
#: optimizer step allocates) a learner's activations may take: allocator fragmentation and the
#: backend's buffers need the rest.
GPU_FREE_SHARE = 0.5


@dataclass(frozen=True)
class MicroBatching:
    """How a learner cuts rows into micro-batches: in order, at most ``max_tokens`` padded tokens
    (rows x the longest row) and at most ``max_rows`` rows (None: no row cap) each. A row longer
    than the budget gets a micro-batch of its own."""

    max_tokens: int
    max_rows: int | None = None

    def pack(self, rows: Sequence, indices: Sequence[int]) -> list[list[int]]:
        """``indices`` (of ``rows``, which have ``input_ids``) cut into micro-batches, in order."""
        chunks: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for index in indices:
            length = len(rows[index].input_ids)
            full = self.max_rows is not None and len(current) >= self.max_rows
            if current and (full or (len(current) + 1) * max(longest, length) > self.max_tokens):
                chunks.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, length)
        if current:
            chunks.append(current)
        return chunks

    def lockstep_count(self, rows: Sequence, indices: Sequence[int]) -> int:
        """The most micro-batches any rank cuts its slice (``distributed.rank_slice``) of
        ``indices`` into: what every rank of a lockstep backend must run. Every rank holds every
        row, so each works this out alone, without a collective."""
        size = distributed.world()[1]
        return max(len(self.pack(rows, list(indices[rank::size]))) for rank in range(size))


def micro_batching(settings: LearnerSettings, model: torch.nn.Module, device: str) -> MicroBatching:
    """The micro-batching of the spec's ``learner`` section: ``micro_batch_tokens``, or the
    device's default, capped at ``micro_batch_size`` rows where set. With several learner ranks
    every rank takes the smallest rank's budget, so that all cut their rows alike."""
    tokens = settings.micro_batch_tokens or distributed.min_over_ranks(default_micro_batch_tokens(model, device))
    return MicroBatching(tokens, settings.micro_batch_size)


def activation_bytes_per_token(model: torch.nn.Module) -> int:
    """Activation memory of one token of a training pass (no activation checkpointing): about
    34 x hidden x layers bytes in bf16 plus 6 x vocab for the logits and their log-softmax
    (docs/scaling.md, section 3.1), scaled to the model's parameter width."""
    config: Any = model.config  # a transformers config
    width = next(model.parameters()).element_size()
    return max(int((34 * config.hidden_size * config.num_hidden_layers + 6 * config.vocab_size) * width / 2), 1)


def default_micro_batch_tokens(model: torch.nn.Module, device: str) -> int:
    """The padded tokens of a micro-batch when the spec sets no ``microBatchTokens``.

    CPU: ``CPU_MEMORY_SHARE`` of the machine's memory (total, not free: the same budget in every
    run on a machine, so that a resumed run cuts its rows as the first did). GPU:
    ``GPU_FREE_SHARE`` of the free memory once the model is loaded, less 3 x the model's bytes
    (its gradients and AdamW's two moments, allocated at the first step). Either divided by
    ``activation_bytes_per_token``.
    """
    if str(device).startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        states = 3 * sum(
            p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
        )  # LoRA: the adapter's
        budget = max(free - states, 0) * GPU_FREE_SHARE
    else:
        budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * CPU_MEMORY_SHARE
    return max(int(budget // activation_bytes_per_token(model)), 1)
