"""Training backends behind one interface: plain torch (default) and, where installed, DeepSpeed.

The learner's step only ever calls ``zero_grad``, ``backward``, ``step`` and the optimizer-state
pair, so a backend owns everything between "here is a loss" and "the weights moved": gradient
accumulation boundaries, clipping, optimizer, mixed precision, sharding.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import math
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch

from hacrl_core.catalog import BACKEND_TABLE
from hacrl_core.learner import distributed
from hacrl_core.registry import Registry
from hacrl_core.spec import LearnerSettings


class TrainingBackend(Protocol):
    model: torch.nn.Module  # the module to call forward on (with grad)
    #: Classes besides tensors and plain data that ``optimizer_state`` may hold: the only ones a
    #: checkpoint's optimizer file may rebuild (``torch.load(weights_only=True)`` refuses the rest).
    checkpoint_globals: ClassVar[tuple[type, ...]]
    #: True when ``backward`` (and forward) run collectives, so that every rank must run as many
    #: micro-batches (``learner.stages`` pads a shorter slice with zero-weighted passes).
    lockstep: bool

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Clip gradients to ``grad_clip``, apply one optimizer update; the norm before clipping.
        A non-finite norm means the update was not applied (where the backend can tell first)."""

    def optimizer_state(self) -> dict[str, Any]: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def unwrapped_model(self) -> torch.nn.Module:
        """The plain transformers model (its parameters may be partitioned: ZeRO-3)."""

    def gathered_weights(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The plain model with whole parameter tensors, for reading weights (saving,
        evaluating): ``with backend.gathered_weights() as model: ...``."""


class BackendFactory(Protocol):
    """A backend class as the registry holds it: called with the model and the learner section;
    its ``checkpoint_globals`` are read before one is built (a restore needs them first)."""

    checkpoint_globals: tuple[type, ...]

    def __call__(self, model: torch.nn.Module, settings: LearnerSettings) -> TrainingBackend: ...


BACKENDS: Registry[BackendFactory] = Registry("training backend")


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """``@register_backend(name)`` on a backend class (called as ``factory(model, settings)``)."""
    return BACKENDS.decorator(name)


@register_backend("torch")
class TorchBackend:
    """AdamW on the model as it is, gradient-norm clipping, nothing else.

    With several learner ranks (``learner.distributed``): each rank's gradients are summed over
    the ranks before clipping (the one-rank gradient of the mini-batch), and the AdamW state is
    sharded over them with ``ZeroRedundancyOptimizer`` (each rank updates its share of the
    parameters, then broadcasts them). ``optimizer_state`` is then a collective that returns the
    consolidated state on rank 0, in plain AdamW's format: a checkpoint written at any number of
    ranks restores at any other.
    """

    checkpoint_globals: ClassVar[tuple[type, ...]] = ()  # torch optimizer state is tensors and plain data
    lockstep = False  # gradients are summed over the ranks in step(), after every backward

    def __init__(self, model: torch.nn.Module, settings: LearnerSettings) -> None:
        self.model = model
        self.grad_clip = settings.grad_clip
        self.sharded = distributed.multi_rank()
        self.parameters = trainable_parameters(model)
        self.optimizer: torch.optim.Optimizer
        if self.sharded:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.optimizer = ZeroRedundancyOptimizer(
                self.parameters, optimizer_class=torch.optim.AdamW, lr=settings.lr, weight_decay=settings.weight_decay
            )
        else:
            self.optimizer = torch.optim.AdamW(self.parameters, lr=settings.lr, weight_decay=settings.weight_decay)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        distributed.sum_gradients(self.parameters)  # one rank: nothing to do
        norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, self.grad_clip))
        if math.isfinite(norm):  # a NaN/inf gradient would poison the weights and AdamW's moments
            self.optimizer.step()  # (the summed gradients, hence the norm, are the same on every rank)
        return norm

    def optimizer_state(self) -> dict[str, Any]:
        if self.sharded:  # every rank takes part; rank 0 gets the whole state, the others nothing
            from torch.distributed.optim import ZeroRedundancyOptimizer

            assert isinstance(self.optimizer, ZeroRedundancyOptimizer)
            self.optimizer.consolidate_state_dict(to=0)
            return plain_optimizer_state(self.optimizer.state_dict()) if distributed.is_writer() else {}
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        # ZeroRedundancyOptimizer.load_state_dict keeps its rank's share and blanks the rest in place.
        self.optimizer.load_state_dict(copy.copy(state) | {"state": dict(state["state"])} if self.sharded else state)

    def unwrapped_model(self) -> torch.nn.Module:
        return self.model

    def gathered_weights(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        return contextlib.nullcontext(self.model)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: all of them, or a LoRA agent's adapter alone (peft
    freezes the base model's), so that its optimizer state is the adapter's size."""
    return [p for p in model.parameters() if p.requires_grad]


def plain_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """A consolidated ``ZeroRedundancyOptimizer`` state in ``torch.optim.AdamW``'s own format."""
    return {"state": state["state"], "param_groups": state["param_groups"]}


# Optional backends: name -> (the distribution they need, the module that registers them), from
# the catalog's table (hacrl_core.catalog.BackendModule: why they are imported only on use).
OPTIONAL_BACKENDS = {name: (b.requires, b.module) for name, b in BACKEND_TABLE.items() if b.requires is not None}


def available_backends() -> list[str]:
    """Backends that can run here; optional ones count where their dependency is installed."""
    installed = {
        name for name, (dependency, _) in OPTIONAL_BACKENDS.items() if importlib.util.find_spec(dependency) is not None
    }
    return sorted(set(BACKENDS.names()) | installed)


def backend_factory(name: str) -> BackendFactory:
    """The registered backend ``name``, importing an optional one on first use."""
    backends = available_backends()
    if name not in backends:
        raise ValueError(f"training backend {name!r} is not available here; available backends: {', '.join(backends)}")
    if name not in BACKENDS:
        importlib.import_module(OPTIONAL_BACKENDS[name][1])
    return BACKENDS.get(name)


def create_backend(name: str, model: torch.nn.Module, settings: LearnerSettings) -> TrainingBackend:
    return backend_factory(name)(model, settings)
