"""The query of a source or model URI (`builtin://arithmetic?difficulty=2-3`, `tiny://llama-char?seed=1`,
`hf://org/name?split=test`): one parser, so every URI refuses an unknown parameter the same way."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qs


def uri_query(query: str, valid: Iterable[str], label: str) -> dict[str, str]:
    """``{parameter: value}`` (the last value of a repeated one); ``ValueError`` naming the unknown
    parameters and the valid ones, prefixed with ``label`` (the URI, or what it is for)."""
    valid = tuple(valid)
    values = {key: found[-1] for key, found in parse_qs(query).items()}
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"{label}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    return values
