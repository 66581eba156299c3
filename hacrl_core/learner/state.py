"""The learner's state between steps (``LearnerState``): the policy, its backend and optimizer,
the capability history, the frozen reference and the micro-batching; ``start_state`` builds it
around a loaded policy. The stages (``learner.stages``, ``learner.updates``) read and train it;
the worker (``learner.worker``) builds, checkpoints and restores it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hacrl_core.algorithms import CapabilityTracker
from hacrl_core.learner.backends import TrainingBackend
from hacrl_core.learner.micro_batches import MicroBatching, micro_batching
from hacrl_core.spec import AlgorithmSpec, LearnerSettings


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
    micro_batching: MicroBatching | None = None  # ``micro_batches.micro_batching`` of the spec's learner section

    @property
    def pad_id(self) -> int:
        return pad_id(self.tokenizer)

    @property
    def batching(self) -> MicroBatching:
        """``micro_batching``, which a step needs: set by ``start_state`` given the learner section."""
        if self.micro_batching is None:
            raise ValueError(
                "this learner state has no micro-batching: start_state(..., learner=<the spec's learner section>)"
            )
        return self.micro_batching


def start_state(
    model: torch.nn.Module,
    tokenizer,
    backend: TrainingBackend,
    settings: AlgorithmSpec,
    n_agents: int,
    *,
    next_step: int = 0,
    reference: torch.nn.Module | None = None,
    device: str = "cpu",
    learner: LearnerSettings | None = None,
) -> LearnerState:
    """A learner's state around a loaded policy and its backend, with a fresh capability history
    (``settings``: the spec's ``algorithm`` section: window, floor, ratio bounds, warm-up) and, given
    the spec's ``learner`` section, its micro-batching (``micro_batches.micro_batching``)."""
    tracker = CapabilityTracker(
        n_agents,
        settings.capability_window,
        settings.capability_floor,
        settings.ratio_bounds,
        settings.warmup_steps,
    )
    backend.model.train()
    unwrapped = backend.unwrapped_model()
    batching = micro_batching(learner, unwrapped, device) if learner is not None else None
    return LearnerState(unwrapped, tokenizer, backend, tracker, next_step, reference, device, batching)


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
