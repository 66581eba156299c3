"""The sampling-engine interface the rollout worker and evaluation use.

An engine owns one policy (weights + tokenizer) and turns rendered prompt texts into sampled
responses with their token ids in the engine's own tokenizer. Engines are registered by name
(`rollout.engine` in the spec); `hf` runs anywhere, `vllm` arrives with the real-model path.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol


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

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        """``params.n`` samples for each rendered prompt text, in prompt order."""


ENGINES: dict[str, Callable[..., RolloutEngine]] = {}


def register_engine(name: str):
    def decorate(factory: Callable[..., RolloutEngine]) -> Callable[..., RolloutEngine]:
        if name in ENGINES and ENGINES[name] is not factory:
            raise ValueError(f"rollout engine {name!r} is already registered")
        ENGINES[name] = factory
        return factory

    return decorate


# name -> (the distribution it needs, the module that registers it). Optional engines are
# imported only when used: importing vLLM takes seconds and logs to stdout.
OPTIONAL_ENGINES = {"vllm": ("vllm", "hacrl_core.rollout.vllm_engine")}


def available_engines() -> list[str]:
    """Engines that can run here: ``hf`` always, optional ones where their dependency is installed."""
    from hacrl_core.rollout import hf_engine  # noqa: F401

    installed = {name for name, (dependency, _) in OPTIONAL_ENGINES.items() if importlib.util.find_spec(dependency) is not None}
    return sorted(set(ENGINES) | installed)


def engine_module(name: str) -> ModuleType:
    engines = available_engines()
    if name not in engines:
        raise ValueError(f"rollout engine {name!r} is not available here; available engines: {', '.join(engines)}")
    return importlib.import_module(OPTIONAL_ENGINES[name][1] if name in OPTIONAL_ENGINES else "hacrl_core.rollout.hf_engine")


def create_engine(name: str, **kwargs: Any) -> RolloutEngine:
    engine_module(name)  # registers it
    return ENGINES[name](**kwargs)


def engine_for(settings) -> RolloutEngine:
    """The engine an agent's ``rollout`` settings name, configured from those settings (each
    engine module's ``engine_options(settings)``: batch size, device, tensor parallelism, ...)."""
    return create_engine(settings.engine, **engine_module(settings.engine).engine_options(settings))
