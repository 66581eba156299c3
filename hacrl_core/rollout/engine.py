"""The sampling-engine interface the rollout worker and evaluation use.

An engine owns one policy (weights + tokenizer) and turns rendered prompt texts into sampled
responses with their token ids in the engine's own tokenizer. Engines are registered by name
(`rollout.engine` in the spec): `hf` (transformers, CPU or GPU) runs anywhere, `vllm` where vLLM is
installed (docs/real-models.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol

from hacrl_core.catalog import ENGINE_TABLE, EngineModule
from hacrl_core.registry import Registry


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]  # response tokens in the engine's tokenizer, ending with eos when finish_reason is stop
    text: str  # decoded response text (special tokens skipped)
    finish_reason: Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    greedy: bool = False
    seed: int = 0


class RolloutEngine(Protocol):
    tokenizer: Any

    def load(self, model_dir: Path) -> None:
        """Load (or reload in place) the weights found in ``model_dir``."""

    def load_adapter(self, adapter_dir: Path) -> None:
        """Sample with the LoRA adapter in ``adapter_dir`` (``models.lora``: a LoRA agent's weights
        version) over the base model ``load`` read; a later call replaces the adapter, never
        re-reading the base."""

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        """``params.n`` samples for each rendered prompt text, in prompt order."""


ENGINES: Registry[EngineModule] = Registry("rollout engine")
for _name, _engine in ENGINE_TABLE.items():  # the catalog's table: the names the spec offers
    ENGINES.register(_name, _engine)


def available_engines() -> list[str]:
    """Engines that can run here: ``hf`` always, optional ones where their dependency is installed."""
    return [name for name in ENGINES.names() if ENGINES.get(name).installed()]


def engine_module(name: str) -> ModuleType:
    """The module of engine ``name`` (imported now); ``ValueError`` if unknown or not installed."""
    if not ENGINES.get(name).installed():
        raise ValueError(
            f"rollout engine {name!r} is not available here; available engines: {', '.join(available_engines())}"
        )
    return importlib.import_module(ENGINES.get(name).module)


def create_engine(name: str, **kwargs: Any) -> RolloutEngine:
    return getattr(engine_module(name), ENGINES.get(name).factory)(**kwargs)


def engine_for(settings, lora=None) -> RolloutEngine:
    """The engine an agent's ``rollout`` settings name, configured from those settings (each
    engine module's ``engine_options(settings, lora)``: batch size, device, tensor parallelism,
    ...); ``lora``: the agent's ``learner.lora`` settings when it trains an adapter, which an
    engine may need to know before it starts (vLLM's largest adapter rank)."""
    return create_engine(settings.engine, **engine_module(settings.engine).engine_options(settings, lora))
