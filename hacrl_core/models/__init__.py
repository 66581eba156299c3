"""Models: URI resolution, tiny offline presets, tokenizers, loading, scoring and cross-encoding.

Names are imported lazily (``transformers`` takes seconds to import), so ``import
hacrl_core.models`` stays cheap for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "resolve_model": "uri",
    "ModelResolutionError": "uri",
    "PRESETS": "tiny",
    "TinyPreset": "tiny",
    "build_tiny_model": "tiny",
    "parse_tiny_uri": "tiny",
    "read_build_record": "tiny",
    "generate_greedy": "tiny",
    "greedy_accuracy": "tiny",
    "build_char_tokenizer": "tokenizers",
    "build_bpe_tokenizer": "tokenizers",
    "load_tokenizer": "tokenizers",
    "tokenizer_fingerprint": "tokenizers",
    "load_policy": "loading",
    "save_policy": "loading",
    "sequence_logprobs": "logprobs",
    "masked_sum_and_count": "logprobs",
    "encode_prompt": "encoding",
    "encode_text": "encoding",
    "encode_row_for": "encoding",
    "collate": "encoding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hacrl_core.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hacrl_core.models.{module}"), name)
