"""Validation of object keys, shared by every backend.

A key is a relative, ``/``-separated path: no leading or trailing ``/``, no empty, ``.`` or ``..``
segment, no backslash or NUL, and it must not end in ``TMP_SUFFIX`` (reserved for the file
backend's in-flight writes). Both backends apply the same rule so that a layout that works on
``file://`` works unchanged on ``s3://``.
"""

from __future__ import annotations

TMP_SUFFIX = ".hacrl-tmp"


def check_key(key: str) -> str:
    """Return ``key`` unchanged, or raise ValueError saying what is wrong with it."""
    if not isinstance(key, str):
        raise TypeError(f"object key must be a string, got {key!r}")
    if not key:
        raise ValueError("object key must be a non-empty string")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"object key {key!r} must not contain a backslash or NUL")
    if key.startswith("/") or key.endswith("/"):
        raise ValueError(f"object key {key!r} must not start or end with '/'")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"object key {key!r} has an empty, '.' or '..' segment")
    if key.endswith(TMP_SUFFIX):
        raise ValueError(f"object key {key!r} must not end in the reserved suffix {TMP_SUFFIX!r}")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` unchanged if it is ``""`` or a key-like string (a trailing ``/`` allowed)."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, got {prefix!r}")
    if prefix:
        check_key(prefix.rstrip("/") or "/")
    return prefix
