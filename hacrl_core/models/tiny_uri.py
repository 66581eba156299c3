"""``tiny://`` URIs: the presets and the parsing of their options, without torch (what `hacrl
validate` checks; ``tiny.py`` builds the models)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from hacrl_core.data.arithmetic import MAX_DIFFICULTY
from hacrl_core.data.datasets import parse_range
from hacrl_core.uri import uri_query


@dataclass(frozen=True)
class TinyPreset:
    """Architecture, size, tokenizer and warm-start recipe of one ``tiny://`` preset."""

    name: str
    architecture: str  # "llama" | "qwen2"
    tokenizer: str  # "char" | "bpe"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    warmup_steps: int
    learning_rate: float = 3e-3
    batch_size: int = 64
    bpe_vocab_size: int = 384
    max_position_embeddings: int = 512
    #: Share of worked warm-start solutions that end with the rewarded ``#### <answer>``; the
    #: rest end with ``(<n> steps)`` instead (``marked_solution``). 1.0 (the default) marks every
    #: solution and keeps the option out of the cache key.
    marker: float = 1.0
    #: ``"mul"`` or ``"nomul"``: solutions of the problems with (without) a ``*`` always keep the
    #: rewarded ending and ``marker`` applies to the others only, so two agents can each know the
    #: convention on a different part of the task (``marked_solution``). ``""`` (the default):
    #: ``marker`` applies to every problem, and the option stays out of the cache key.
    marker_if: str = ""


#: ``marker_if`` values -> whether a question belongs to the part that always keeps ``####``.
MARKER_IF = {"mul": lambda question: "*" in question, "nomul": lambda question: "*" not in question}


PRESETS: dict[str, TinyPreset] = {
    preset.name: preset
    for preset in (
        TinyPreset(
            "llama-char",
            "llama",
            "char",
            hidden_size=128,
            intermediate_size=384,
            num_layers=3,
            num_heads=4,
            num_kv_heads=2,
            warmup_steps=400,
        ),
        TinyPreset(
            "qwen2-bpe",
            "qwen2",
            "bpe",
            hidden_size=96,
            intermediate_size=192,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            warmup_steps=300,
        ),
    )
}

#: Query parameters a ``tiny://`` URI may carry.
URI_PARAMS = (
    "seed",
    "warmup_steps",
    "difficulty",
    "data_seed",
    "format",
    "hidden",
    "layers",
    "tokenizer",
    "marker",
    "marker_if",
)
#: Greedy tokens an evaluation of the warm start allows per answer format (chains are ~15-40 tokens).
EVAL_NEW_TOKENS = {"answer": 8, "chain": 64}


def get_preset(name: str) -> TinyPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown tiny preset {name!r}; valid: {', '.join(sorted(PRESETS))}") from None


def parse_tiny_uri(uri: str) -> dict[str, Any]:
    """``tiny://<preset>?seed=N&warmup_steps=N&difficulty=1-3&data_seed=N`` -> build arguments.

    Agents that differ by design: ``format=chain`` warm-starts on worked solutions (longer
    responses), ``hidden=H`` and ``layers=L`` resize the preset (the MLP keeps the preset's
    width ratio), ``tokenizer=char|bpe`` swaps its tokenizer, ``marker=F`` (with ``format=chain``)
    ends only a share F of the warm-start solutions with the rewarded ``#### <answer>`` and the rest
    with an unrewarded ``(<n> steps)``: headroom for RL in the answer convention; ``marker_if=mul|nomul``
    exempts the problems with (without) a ``*`` from it, so they always keep ``####``. Returns ``{"preset", "seed",
    "warmup_steps", "task_spec", "overrides"}`` (``warmup_steps`` None means the preset's
    default). Unknown presets, parameters or values raise ``ValueError`` naming the valid ones.
    """
    parsed = urlparse(uri)
    if parsed.scheme != "tiny":
        raise ValueError(f"not a tiny:// URI: {uri!r}")
    preset = get_preset(parsed.netloc).name
    query = uri_query(parsed.query, URI_PARAMS, repr(uri))
    try:
        seed = int(query.get("seed", "0"))
        warmup_steps = int(query["warmup_steps"]) if "warmup_steps" in query else None
        low, high = parse_range(query.get("difficulty", "1-3"))
        data_seed = int(query.get("data_seed", "0"))
        overrides = preset_overrides(
            hidden=int(query["hidden"]) if "hidden" in query else None,
            layers=int(query["layers"]) if "layers" in query else None,
            tokenizer=query.get("tokenizer"),
            marker=float(query["marker"]) if "marker" in query else None,
            marker_if=query.get("marker_if"),
        )
    except ValueError as error:
        raise ValueError(f"{uri!r}: {error}") from None
    if warmup_steps is not None and warmup_steps < 0:
        raise ValueError(f"{uri!r}: warmup_steps must be >= 0, got {warmup_steps}")
    if not 1 <= low <= high <= MAX_DIFFICULTY:
        raise ValueError(f"{uri!r}: difficulty must satisfy 1 <= low <= high <= {MAX_DIFFICULTY}, got {low}-{high}")
    for name, value in (("seed", seed), ("data_seed", data_seed)):
        if not 0 <= value < 2**32:  # what the seeded generators take
            raise ValueError(f"{uri!r}: {name} must be from 0 to {2**32 - 1}, got {value}")
    answer_format = query.get("format", "answer")
    if answer_format not in EVAL_NEW_TOKENS:
        raise ValueError(f"{uri!r}: format must be one of {', '.join(EVAL_NEW_TOKENS)}, got {answer_format!r}")
    for option in ("marker", "marker_if"):
        if option in overrides and answer_format != "chain":
            raise ValueError(f"{uri!r}: {option} needs format=chain (answer-only solutions have no marker)")
    task_spec = f"builtin://arithmetic?difficulty={low}-{high}&seed={data_seed}" + (
        f"&format={answer_format}" if answer_format != "answer" else ""
    )
    return {
        "preset": preset,
        "seed": seed,
        "warmup_steps": warmup_steps,
        "task_spec": task_spec,
        "overrides": overrides,
    }


def preset_overrides(
    *,
    hidden: int | None = None,
    layers: int | None = None,
    tokenizer: str | None = None,
    marker: float | None = None,
    marker_if: str | None = None,
) -> dict[str, Any]:
    """Checked ``TinyPreset`` field overrides (``apply_overrides``) from the URI's size options."""
    overrides: dict[str, Any] = {}
    if hidden is not None:
        if hidden < 8 or hidden % 8:  # 4 heads of an even head size for rotary embeddings
            raise ValueError(f"hidden must be a multiple of 8 and >= 8, got {hidden}")
        overrides["hidden_size"] = hidden
    if layers is not None:
        if not 1 <= layers <= 16:
            raise ValueError(f"layers must be between 1 and 16, got {layers}")
        overrides["num_layers"] = layers
    if tokenizer is not None:
        if tokenizer not in ("char", "bpe"):
            raise ValueError(f"tokenizer must be one of char, bpe, got {tokenizer!r}")
        overrides["tokenizer"] = tokenizer
    if marker is not None:
        if not 0.0 <= marker <= 1.0:  # also refuses nan
            raise ValueError(f"marker must be between 0 and 1, got {marker}")
        overrides["marker"] = marker
    if marker_if is not None:
        if marker_if not in MARKER_IF:
            raise ValueError(f"marker_if must be one of {', '.join(MARKER_IF)}, got {marker_if!r}")
        overrides["marker_if"] = marker_if
    return overrides


def apply_overrides(preset: TinyPreset, overrides: dict[str, Any]) -> TinyPreset:
    """``preset`` resized/retokenized; the MLP keeps the preset's intermediate/hidden ratio."""
    if not overrides:
        return preset
    changed = replace(preset, **overrides)
    if "hidden_size" in overrides:
        changed = replace(
            changed, intermediate_size=preset.intermediate_size * overrides["hidden_size"] // preset.hidden_size
        )
    return changed
