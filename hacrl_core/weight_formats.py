"""An agent's weights as a typed format: how the learner loads, publishes and references them and
how a sampling engine takes a published version (docs/architecture.md, "Weight formats").

Two formats, registered by name (``WEIGHT_FORMATS``) behind one interface (``WeightFormat``):

- ``chain``: the whole model, each version published as a delta against the previous publish or in
  full (``store.weight_chain``); an engine loads each version rebuilt in its own folder.
- ``lora``: a peft adapter over the agent's frozen base model (``models.lora``), each version the
  adapter alone, published whole; an engine reads the base once and applies each adapter over it.

``weight_format(agent, ...)`` is the one place that picks an agent's format (``learner.lora``):
the workers call the format's methods and never ask which it is.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from hacrl_core.models.loading import load_policy
from hacrl_core.models.lora import AdapterDisabled, load_lora_policy
from hacrl_core.registry import Registry
from hacrl_core.spec import AgentSpec
from hacrl_core.store.weight_chain import directory_bytes, fetch_policy, publish_policy

log = logging.getLogger("hacrl")


@dataclass(frozen=True)
class WeightsPlace:
    """Where an agent's weights live: the store's versions of ``agent``, its initial model
    (resolved on first use: a ``tiny://`` model is built then), how long a read waits for a version."""

    store: Any
    agent: str
    initial_model: Callable[[], Path]
    wait: float = 0.0


class WeightFormat:
    """One format of an agent's weights. ``load_model``, ``reference`` and ``publish``: the
    learner's side; ``apply``: a sampling engine's."""

    name: ClassVar[str]

    def __init__(self, place: WeightsPlace, agent: AgentSpec, field: str) -> None:
        self.place, self.agent, self.field = place, agent, field

    def load_model(self, weights: Path | None, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
        """``(model, tokenizer)`` to train: from a checkpoint's weights directory, or the initial model
        when None."""
        raise NotImplementedError

    def reference(self, model: Any, dtype: torch.dtype, device: str) -> Any:
        """The frozen reference of the KL term, for the trained ``model``."""
        raise NotImplementedError

    def publish(self, local: Path, version: int, work_dir: Path) -> dict[str, float]:
        """Publish the saved directory ``local`` (``models.lora.save_trained``) as ``version``;
        returns the publish's step metrics (``learner/weights_*``)."""
        raise NotImplementedError

    def apply(self, engine: Any, version: int, weights_root: Path, *, loaded: int | None) -> int:
        """Put ``version`` into ``engine`` (fetched under ``weights_root``; ``loaded``: the version
        asked for before, None at start); returns the version the engine holds."""
        raise NotImplementedError


WEIGHT_FORMATS: Registry[type[WeightFormat]] = Registry("weight format")


@WEIGHT_FORMATS.decorator("chain")
class FullChain(WeightFormat):
    """The whole model; versions published as a chain of deltas and full publishes."""

    name = "chain"

    def load_model(self, weights: Path | None, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
        return load_policy(weights or self.place.initial_model(), dtype=dtype, device=device)

    def reference(self, model: Any, dtype: torch.dtype, device: str) -> Any:
        reference, _ = load_policy(self.place.initial_model(), dtype=dtype, device=device)
        return reference.eval().requires_grad_(False)

    def publish(self, local: Path, version: int, work_dir: Path) -> dict[str, float]:
        # A delta against the previous publish, or in full (store/weight_chain.py; docs/architecture.md, "Weight publishes").
        place = self.place
        published = publish_policy(
            place.store,
            place.agent,
            version,
            local,
            work_dir / "published-weights",
            full_every=self.agent.learner.full_publish_every,
        )
        log.info(
            "learner %s: weights version %d published %s, %.1f MB of %.1f MB%s",
            place.agent,
            version,
            published.kind,
            published.bytes_written / 1e6,
            published.full_bytes / 1e6,
            "" if published.changed_fraction is None else f", {published.changed_fraction:.2%} of elements changed",
        )
        return {
            "learner/weights_bytes_written": float(published.bytes_written),
            "learner/weights_publish_share": published.bytes_written / max(published.full_bytes, 1),
        }

    def apply(self, engine: Any, version: int, weights_root: Path, *, loaded: int | None) -> int:
        """Version 0 is the initial model, which the learner may still be loading to publish:
        sampling from the same checkpoint at once takes its start-up off the critical path. Later
        versions are rebuilt from what ``weights_root`` holds along the chain; after a broken
        delta, an older version of the chain, which the rows then record."""
        if version == 0:
            engine.load(self.place.initial_model())
            return 0
        place = self.place
        fetched = fetch_policy(place.store, place.agent, version, weights_root, wait=place.wait)
        engine.load(weights_root)
        return fetched.version


@WEIGHT_FORMATS.decorator("lora")
class LoraAdapter(WeightFormat):
    """A peft adapter over the frozen base model (the agent's ``model``); versions published whole."""

    name = "lora"

    def load_model(self, weights: Path | None, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
        return load_lora_policy(
            self.place.initial_model(),
            self.agent.learner.lora,
            adapter_dir=weights,
            dtype=dtype,
            device=device,
            field=self.field,
        )

    def reference(self, model: Any, dtype: torch.dtype, device: str) -> Any:
        return AdapterDisabled(model)  # the base model itself, adapter switched off: no second copy

    def publish(self, local: Path, version: int, work_dir: Path) -> dict[str, float]:
        # An adapter is small and most of it moves each step: published whole.
        size = float(directory_bytes(local))
        self.place.store.publish_weights(self.place.agent, version, local)
        return {"learner/weights_bytes_written": size, "learner/weights_publish_share": 1.0}

    def apply(self, engine: Any, version: int, weights_root: Path, *, loaded: int | None) -> int:
        """The base model once (at start), then each version's adapter over it; version 0 is the
        identity (peft starts B at 0), so the base alone samples it."""
        if loaded is None:
            engine.load(self.place.initial_model())
        if version == 0:
            return 0
        local = weights_root / f"adapter-{version:06d}"
        self.place.store.fetch_weights(self.place.agent, version, local, wait=self.place.wait)
        engine.load_adapter(local)
        if loaded is not None:
            shutil.rmtree(weights_root / f"adapter-{loaded:06d}", ignore_errors=True)
        return version


def format_name(agent: AgentSpec) -> str:
    """The agent's weight format: ``lora`` with ``learner.lora`` set, else ``chain``."""
    return "lora" if agent.learner.lora is not None else "chain"


def weight_format(agent: AgentSpec, place: WeightsPlace, field: str = "learner.lora") -> WeightFormat:
    """The agent's weight format (``format_name``) at ``place``; ``field``: the agent's
    ``learner.lora`` path in the spec, for messages."""
    return WEIGHT_FORMATS.get(format_name(agent))(place, agent, field)
