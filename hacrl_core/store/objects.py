"""The object-store interface and how a store URI picks a backend.

Two backends implement ``ObjectStore``: ``FileObjectStore`` (``file://`` or a plain path; the
default, embedded store) and ``S3ObjectStore`` (``s3://bucket/prefix``). Keys are relative
``/``-separated paths (``keys.check_key``); ``list`` and ``delete_prefix`` match by string prefix
as S3 does. The interface's eight methods include ``put_file`` and ``get_file``, which stream a
local file (``commit.put_dir``/``get_dir`` use them), and its ``uri`` names the store in messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from hacrl_core.store.file_store import FileObjectStore
from hacrl_core.store.s3_store import DEFAULT_ATTEMPTS, S3ObjectStore
from hacrl_core.store_uri import parse_store_uri


@runtime_checkable
class ObjectStore(Protocol):
    """A flat namespace of immutable-once-written byte objects."""

    @property
    def uri(self) -> str:
        """Where the objects live (``file:///...``, ``s3://bucket/prefix``), for messages."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically, replacing any previous object."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes under ``key``; raises ``ObjectNotFound`` if there are none."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix`` (full keys, sorted)."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix`` (non-empty); returns how many."""
        ...

    def delete(self, key: str) -> None:
        """Delete the one object ``key``; no error when there is none (one request on S3, where
        ``delete_prefix`` needs a LIST first)."""
        ...

    def put_file(self, key: str, local_path: Path | str) -> None: ...

    def get_file(self, key: str, local_path: Path | str) -> None: ...


def open_object_store(
    uri: str,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    connect_timeout: float = 5.0,
) -> ObjectStore:
    """The store a URI names: ``file:///abs/path``, ``file://rel/path``, a plain path, or
    ``s3://bucket[/prefix]``.

    ``endpoint``/``region``/``attempts``/``connect_timeout`` apply to ``s3://`` only (see
    ``s3_store`` for the environment variables they default to).
    """
    location = parse_store_uri(uri)
    if location.scheme == "file":
        return FileObjectStore(Path(location.path))
    return S3ObjectStore(
        location.bucket,
        location.path,
        endpoint=endpoint,
        region=region,
        attempts=attempts,
        connect_timeout=connect_timeout,
    )
