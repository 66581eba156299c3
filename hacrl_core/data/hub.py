"""Prompt sources from a dataset hub: ``hf://<org>/<name>[?split=S&config=C&revision=R]``.

Loaded with ``datasets.load_dataset(name, config, split=split, revision=revision)`` (install
``datasets`` where a hub is reachable); rows then go through the same conversion as jsonl and
parquet files (``RowSource``: dotted keys, chat-message prompts, skip counts). Defaults: split
``train``, no config, the default revision.

Examples: ``hf://HuggingFaceH4/MATH-500?split=test`` with ``promptKey: problem``,
``answerKey: answer``; a verl-style dataset with ``promptKey: prompt``,
``answerKey: reward_model.ground_truth``.

On a machine without a hub (our CI, air-gapped clusters) loading fails with a ``ValueError``
that names the dataset and says what to do instead: download it where a hub is reachable
(``datasets.load_dataset(...).to_parquet("x.parquet")``) and point the spec at the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

from hacrl_core.data.base import PromptSource
from hacrl_core.data.rows import RowSource, decode_bytes
from hacrl_core.uri import uri_query

SCHEME = "hf://"
_PARAMS = ("split", "config", "revision")


def parse_hub_uri(uri: str) -> dict[str, str | None]:
    """``{"name", "split", "config", "revision"}`` of an ``hf://`` URI; ``ValueError`` if malformed."""
    parsed = urlparse(uri)
    name = (parsed.netloc + parsed.path).strip("/")
    if parsed.scheme != "hf" or name.count("/") != 1 or not all(name.split("/")):
        raise ValueError(f"data source {uri!r}: expected hf://<org>/<name>[?split=train&config=C&revision=R]")
    query = uri_query(parsed.query, _PARAMS, f"data source {uri!r}")
    return {
        "name": name,
        "split": query.get("split", "train"),
        "config": query.get("config"),
        "revision": query.get("revision"),
    }


def open_hub_source(
    uri: str,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    uid_key: str | None = None,
    reward: str | None = None,
    load_dataset: Callable[..., Any] | None = None,
) -> PromptSource:
    """A ``PromptSource`` over the hub dataset ``uri``; ``load_dataset`` defaults to
    ``datasets.load_dataset`` (injectable for tests)."""
    target = parse_hub_uri(uri)
    name = target["name"]
    if load_dataset is None:
        try:
            from datasets import load_dataset as datasets_load_dataset
        except ImportError:
            raise ValueError(
                f"data source {uri!r}: hub datasets need the 'datasets' package (pip install datasets), "
                "or download the dataset elsewhere and point the spec at a local .parquet/.jsonl file"
            ) from None
        load_dataset = datasets_load_dataset
    try:
        dataset = load_dataset(name, target["config"], split=target["split"], revision=target["revision"])
    except Exception as error:  # offline, not found, gated, bad split: one clear message
        raise ValueError(
            f"data source {uri!r}: cannot load dataset {name!r} (split {target['split']!r}) from the hub: "
            f"{type(error).__name__}: {error}. Without a reachable hub, download it where one is "
            f"(datasets.load_dataset({name!r}, split={target['split']!r}).to_parquet('data.parquet')) "
            "and point the spec at the file"
        ) from None

    def rows() -> Iterator[tuple[int, Any]]:
        for position, row in enumerate(dataset):
            yield position, decode_bytes(dict(row)) if isinstance(row, dict) else row

    label = f"{name}:{target['split']}"
    return RowSource(label, rows(), prompt_key=prompt_key, answer_key=answer_key, uid_key=uid_key, reward=reward)
