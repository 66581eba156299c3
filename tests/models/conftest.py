"""Shared fixtures: tokenizers and the two default tiny presets, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.models.tiny import PRESETS, build_tiny_model
from hacrl_core.models.tokenizers import build_bpe_tokenizer, build_char_tokenizer


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def bpe_tokenizer():
    task = ArithmeticTask(size=500)
    return build_bpe_tokenizer([p.question + p.answer for p in task])


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-cache")


@pytest.fixture(scope="session")
def default_builds(model_cache: Path) -> dict[str, Path]:
    """Every preset with its default warm start (the expensive fixture: about 35 s on 2 cores).

    Built where `hacrl run` with ``HACRL_CACHE=model_cache`` looks for ``tiny://<preset>?seed=0``
    (the quickstart's agents), so the benchmark smoke tests reuse these builds."""
    threads = torch.get_num_threads()
    paths = {name: build_tiny_model(name, seed=0, cache_dir=model_cache / "models" / "tiny") for name in PRESETS}
    assert torch.get_num_threads() == threads, "the build must restore the caller's thread count"
    return paths
