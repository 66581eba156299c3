"""What a trajectory store URI names: one parser for the spec's validator (`hacrl validate`, the
operator's admission) and for ``hacrl_core.store.open_object_store`` (`hacrl run`, the workers),
so that a URI the first accepts is one the second can open. Standard library only: the operator
validates specs without loading the store's backends."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

ALLOWED_SCHEMES = ("file://", "s3://")


@dataclass(frozen=True)
class StoreLocation:
    """``scheme`` "file" (``path``: a local folder) or "s3" (``bucket`` and key ``path`` prefix)."""

    scheme: str
    path: str
    bucket: str = ""


def parse_store_uri(uri: str) -> StoreLocation:
    """``file:///abs/path``, ``file://localhost/abs/path``, ``file://rel/path`` (relative to the
    working directory: the spec's default is ``file://./runs``), a plain path, or
    ``s3://bucket[/prefix]``; ``ValueError`` saying what is wrong and what to write instead."""
    if not uri or not uri.strip():
        raise ValueError(f"store URI must be non-empty; allowed: {', '.join(ALLOWED_SCHEMES)} or a path")
    if "\x00" in uri:
        raise ValueError(f"store URI {uri!r} holds a NUL character")
    if "://" not in uri:
        return StoreLocation("file", uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        rest = unquote(uri[len("file://") :])
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest:
            raise ValueError(f"file store URI {uri!r} has no path; use file:///absolute/path or file://./relative/path")
        return StoreLocation("file", rest)
    if scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"s3 store URI {uri!r} has no bucket; use s3://bucket/prefix")
        return StoreLocation("s3", unquote(parts.path), bucket=parts.netloc)
    raise ValueError(
        f"unknown store scheme {parts.scheme!r} in {uri!r}; allowed: {', '.join(ALLOWED_SCHEMES)} or a plain path"
    )
