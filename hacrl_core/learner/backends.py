"""Training backends behind one interface: plain torch (default) and, where installed, DeepSpeed.

The learner's step only ever calls ``zero_grad``, ``backward``, ``step`` and the optimizer-state
pair, so a backend owns everything between "here is a loss" and "the weights moved": gradient
accumulation boundaries, clipping, optimizer, mixed precision, sharding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class TrainingBackend(Protocol):
    model: torch.nn.Module  # the module to call forward on (with grad)

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Clip gradients to ``grad_clip``, apply one optimizer update; the norm before clipping."""

    def optimizer_state(self) -> dict[str, Any]: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def unwrapped_model(self) -> torch.nn.Module:
        """The plain transformers model, for saving weights (``save_policy``)."""


BACKENDS: dict[str, Callable[..., TrainingBackend]] = {}


def register_backend(name: str):
    def decorate(factory):
        if name in BACKENDS and BACKENDS[name] is not factory:
            raise ValueError(f"training backend {name!r} is already registered")
        BACKENDS[name] = factory
        return factory

    return decorate


@register_backend("torch")
class TorchBackend:
    """AdamW on the model as it is, gradient-norm clipping, nothing else."""

    def __init__(self, model: torch.nn.Module, settings) -> None:
        self.model = model
        self.grad_clip = settings.grad_clip
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return float(norm)

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def unwrapped_model(self) -> torch.nn.Module:
        return self.model


def available_backends() -> list[str]:
    """Backends that can run here; optional ones register only where their dependencies import."""
    try:
        from hacrl_core.learner import deepspeed_backend  # noqa: F401
    except ImportError:
        pass
    return sorted(BACKENDS)


def create_backend(name: str, model: torch.nn.Module, settings) -> TrainingBackend:
    backends = available_backends()
    if name not in backends:
        raise ValueError(f"training backend {name!r} is not available here; available backends: {', '.join(backends)}")
    return BACKENDS[name](model, settings)
