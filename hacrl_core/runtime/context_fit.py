"""Prompts that do not fit an agent's model context: said before training, per dataset and agent.

A prompt plus ``rollout.maxNewTokens`` beyond the model's positions (``max_position_embeddings``
and its synonyms in ``config.json``) was accepted and sampled anyway: past its trained positions
a model's output is noise (or an index error, with learned position embeddings). Tokenizing every
prompt of a large dataset with every agent's tokenizer would cost minutes, so the check renders
and tokenizes the ``CANDIDATES`` longest prompts in UTF-8 bytes (a byte-level or character
tokenizer never makes more tokens than bytes, so these are the prompts most likely to be too long).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from hacrl_core.data.report import open_dataset, spec_datasets
from hacrl_core.data.templates import render_prompt

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
CANDIDATES = 16


def model_context(model_dir: Path) -> int | None:
    """The positions a model was built for, from its ``config.json``; None when it does not say."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in CONTEXT_KEYS:
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def overlong_prompts(spec, model_dirs: Mapping[str, Path]) -> list[str]:
    """One line per (dataset, agent) whose longest prompts, chat-templated, plus the agent's
    ``rollout.maxNewTokens`` exceed its model's context; ``model_dirs``: agent -> model folder
    (agents not in it are not checked)."""
    from hacrl_core.models.encoding import encode_prompts
    from hacrl_core.models.tokenizers import load_tokenizer

    agents = [(a, model_dirs[a.name], model_context(model_dirs[a.name])) for a in spec.agents if a.name in model_dirs]
    agents = [(a, path, context) for a, path, context in agents if context is not None]
    if not agents:
        return []
    tokenizers = {a.name: load_tokenizer(path) for a, path, _ in agents}
    lines = []
    for field_path, dataset in spec_datasets(spec.data):
        source = open_dataset(spec.data, dataset)
        longest = sorted(range(len(source)), key=lambda i: len(source[i].question.encode("utf-8")), reverse=True)[
            :CANDIDATES
        ]
        for agent, _, context in agents:
            tokenizer = tokenizers[agent.name]
            texts = [render_prompt(tokenizer, source[i].question, spec.data.template) for i in longest]
            lengths = [len(ids) for ids in encode_prompts(tokenizer, texts)]
            budget = context - agent.rollout.max_new_tokens
            over = [n for n in lengths if n > budget]
            if over:
                lines.append(
                    f"spec.{field_path}: {len(over)} of its {len(longest)} longest prompts (the longest {max(over)} tokens) "
                    f"do not fit agent {agent.name!r}'s model context of {context} tokens with rollout.maxNewTokens "
                    f"{agent.rollout.max_new_tokens}: shorten them, lower maxNewTokens, or use a model with a longer context"
                )
    return lines
