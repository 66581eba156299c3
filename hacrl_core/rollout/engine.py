"""The sampling-engine interface the rollout worker and evaluation use.

An engine owns one policy (weights + tokenizer) and turns rendered prompt texts into sampled
responses with their token ids in the engine's own tokenizer. Engines are registered by name
(`rollout.engine` in the spec); `hf` runs anywhere, `vllm` arrives with the real-model path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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


def available_engines() -> list[str]:
    """Engines that can run here. Importing an engine module registers it; optional engines
    (vllm) register only where their dependencies import."""
    from hacrl_core.rollout import hf_engine  # noqa: F401

    try:
        from hacrl_core.rollout import vllm_engine  # noqa: F401
    except ImportError:
        pass
    return sorted(ENGINES)


def create_engine(name: str, **kwargs: Any) -> RolloutEngine:
    engines = available_engines()
    if name not in engines:
        raise ValueError(f"rollout engine {name!r} is not available here; available engines: {', '.join(engines)}")
    return ENGINES[name](**kwargs)
