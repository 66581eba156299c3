"""Resolve a model URI of the experiment spec to a local directory.

Forms (``AgentSpec.model``):

- a local directory (absolute, relative, ``~``, or ``file://``): returned as is;
- ``tiny://<preset>?seed=N&warmup_steps=N&difficulty=lo-hi&data_seed=N``: built offline
  (``hacrl_core.models.tiny``) and cached under ``cache_dir/tiny/``;
- a hub id ``org/name`` or ``org/name@revision``: ``huggingface_hub.snapshot_download`` into
  ``cache_dir/hub/`` (weights as safetensors only, plus config and tokenizer files);
- ``s3://bucket/prefix``: copied by the injected ``store`` into ``cache_dir/s3/<hash>/``, once
  (weights directories are immutable: docs/architecture.md, "The trajectory store").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hacrl_core.models.directories import build_once
from hacrl_core.models.tiny_uri import parse_tiny_uri

#: ``fetch_dir(uri, local_dir)``: copy every object under ``uri`` (an ``s3://`` prefix) into
#: ``local_dir``, keeping relative paths.
FetchDir = Callable[[str, Path], Any]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


class ModelResolutionError(ValueError):
    """A model URI cannot be turned into a local directory; the message names the URI."""


def resolve_model(uri: str, cache_dir: str | Path, *, store: FetchDir | Any | None = None) -> Path:
    """Local directory holding the model named by ``uri`` (forms in the module docstring).

    Args:
        uri: the model URI.
        cache_dir: root for built, downloaded and fetched models.
        store: for ``s3://`` URIs, a callable ``fetch_dir(uri, local_dir)`` or an object with such
            a ``fetch_dir`` method.

    Raises:
        ModelResolutionError (a ``ValueError``): unknown form, missing directory, hub id not
        reachable (offline) or not found, ``s3://`` without a store.
    """
    if not uri or not uri.strip():
        raise ModelResolutionError("model URI is empty: give a local path, hub id, s3:// prefix or tiny://preset")
    cache_dir = Path(cache_dir).expanduser()
    if uri.startswith("tiny://"):
        try:
            arguments = parse_tiny_uri(uri)
        except ValueError as error:
            raise ModelResolutionError(str(error)) from None
        from hacrl_core.models.tiny import build_tiny_model  # torch: only where a model is built

        return build_tiny_model(cache_dir=cache_dir / "tiny", **arguments)
    if uri.startswith("s3://"):
        return _fetch_s3(uri, cache_dir / "s3", store)
    if "://" in uri and not uri.startswith("file://"):
        raise ModelResolutionError(
            f"model URI {uri!r}: unknown scheme; valid: a path, file://, tiny://, s3://, org/name"
        )
    local = Path(uri.removeprefix("file://")).expanduser()
    if local.is_dir():
        return local
    if uri.startswith(("/", ".", "~", "file://")) or not _HUB_ID.match(uri):
        raise ModelResolutionError(f"model {uri!r}: no such directory (and not a hub id of the form org/name)")
    return _download_hub(uri, cache_dir / "hub")


def _download_hub(uri: str, cache_dir: Path) -> Path:
    from huggingface_hub import snapshot_download

    repo_id, _, revision = uri.partition("@")
    try:
        path = snapshot_download(
            repo_id, revision=revision or None, cache_dir=str(cache_dir), allow_patterns=HUB_ALLOW_PATTERNS
        )
    except Exception as error:  # noqa: BLE001 - offline, not found, gated: all reported the same way
        raise ModelResolutionError(
            f"model {uri!r}: cannot download hub id {repo_id!r}"
            f"{f' at revision {revision!r}' if revision else ''} ({type(error).__name__}: {str(error)[:300]}); "
            "without access to the hub use a local directory, an s3:// prefix or tiny://"
        ) from error
    return Path(path)


def _fetch_s3(uri: str, cache_dir: Path, store: FetchDir | Any | None) -> Path:
    fetch = getattr(store, "fetch_dir", store)
    if fetch is None or not callable(fetch):
        raise ModelResolutionError(f"model {uri!r}: an s3:// model needs a store to fetch it, and none was given")
    target = cache_dir / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]

    def download(directory: Path) -> None:
        fetch(uri, directory)
        if not (directory / "config.json").is_file():
            raise ModelResolutionError(f"model {uri!r}: fetched prefix holds no config.json (not a model directory)")

    return build_once(target, download, marker="config.json")
