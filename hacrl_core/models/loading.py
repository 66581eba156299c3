"""Load and save a policy (causal LM + its tokenizer) as safetensors directories."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from hacrl_core.models.directories import replace_directory
from hacrl_core.models.tokenizers import load_tokenizer


def default_device() -> str:
    """Where workers put their model: the GPU when the pod (or machine) has one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_policy(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a directory written by ``save_policy`` or ``save_pretrained``.

    The model is an ``AutoModelForCausalLM`` in ``dtype`` on ``device``, in eval mode (call
    ``.train()`` to train); the tokenizer is loaded with ``load_tokenizer``.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: not a model directory (no config.json)")
    with _no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.to(device)  # type: ignore[arg-type]  # transformers wraps PreTrainedModel.to, hiding torch's signature
    model.eval()
    return model, load_tokenizer(path)


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _name_the_cpu_to_deepspeed() -> None:
    """With accelerate installed (peft needs it), ``save_pretrained`` imports DeepSpeed to unwrap
    the model, and DeepSpeed, finding no CUDA device, prints on stdout that it falls back to the
    CPU: a line in `hacrl run --quiet`'s one-line output. Without CUDA, name the CPU to it, which
    is what its own detection would choose."""
    if "deepspeed" not in sys.modules and "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def save_pretrained_quietly(model: Any, tokenizer: Any, directory: str | Path) -> None:
    """``save_pretrained`` of model (safetensors) and tokenizer into ``directory``, no progress bar
    and no line from DeepSpeed."""
    _name_the_cpu_to_deepspeed()
    with _no_progress_bars():
        model.save_pretrained(str(directory), safe_serialization=True)
        tokenizer.save_pretrained(str(directory))


def save_policy(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """Write model (safetensors) and tokenizer to ``path``, replacing it atomically.

    The files are written to a sibling temporary directory which is then renamed to ``path``; a
    reader never sees a half-written directory (an existing ``path`` is replaced).
    """
    return replace_directory(path, lambda directory: save_pretrained_quietly(model, tokenizer, directory))
