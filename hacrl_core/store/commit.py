"""Objects and directories that become visible only when complete.

Object ``key``: the data is written first, then ``key + MARKER_SUFFIX`` holding
``{"size": int, "sha256": hex}``. Directory ``prefix``: every file is uploaded to
``prefix/<relative path>``, then ``prefix/_COMMIT.json`` lists ``{"path", "size", "sha256"}`` of
each. Readers wait for the marker/manifest and verify every byte against it.

Rewrites delete the marker/manifest first, so a reader never pairs an old marker with new data
unnoticed: if the data does not match and the marker has changed meanwhile, the reader waits
for the new version instead of reporting corruption.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hacrl_core.store.errors import CorruptObject, ObjectNotFound
from hacrl_core.store.keys import TMP_SUFFIX, check_key
from hacrl_core.store.objects import ObjectStore

MARKER_SUFFIX = ".commit.json"
MANIFEST_NAME = "_COMMIT.json"
T = TypeVar("T")


class _NotYet(Exception):
    """Internal: the object is not (or no longer) complete; poll again."""


def marker_key(key: str) -> str:
    return check_key(key) + MARKER_SUFFIX


def manifest_key(prefix: str) -> str:
    return f"{_dir_prefix(prefix)}/{MANIFEST_NAME}"


def _dir_prefix(prefix: str) -> str:
    return check_key(prefix.rstrip("/"))


def _digest(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _file_digest(path: Path) -> dict[str, Any]:
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": sha.hexdigest()}


def _read_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        raw = store.get(key)
    except ObjectNotFound:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CorruptObject(f"{key!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CorruptObject(f"{key!r} must hold a JSON object, got {type(value).__name__}")
    return value


#: Called before each sleep of a wait for a writer: a worker stopped on SIGTERM abandons a step
#: that waits for data (hacrl_core/preemption.py raises there).
WAIT_HOOKS: list[Callable[[], None]] = []


def _poll(attempt: Callable[[], T], *, wait: float, poll: float, what: str) -> T:
    """Call ``attempt`` until it stops raising ``_NotYet``; TimeoutError after ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return attempt()
        except _NotYet as pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what} not complete after waiting {wait:g}s: {pending}") from None
            for hook in WAIT_HOOKS:
                hook()
            time.sleep(min(poll, remaining))


def put_committed(store: ObjectStore, key: str, data: bytes) -> None:
    """Write ``data`` under ``key``, then its commit marker; rewriting replaces both."""
    marker = marker_key(key)
    # Hide the previous version while its data is replaced. One key, so one DELETE (a prefix
    # delete costs a LIST first and could miss the marker on a server whose LIST lags).
    store.delete(marker)
    store.put(key, data)
    store.put(marker, json.dumps(_digest(data), sort_keys=True).encode())


def is_committed(store: ObjectStore, key: str) -> bool:
    return store.exists(marker_key(key))


def get_committed(store: ObjectStore, key: str, *, wait: float = 0.0, poll: float = 0.05) -> bytes:
    """The data of ``key`` once its commit marker exists, verified against it.

    Waits up to ``wait`` seconds (polling every ``poll``) and then raises TimeoutError naming
    the key; raises CorruptObject if the data does not match a marker that is not changing.
    """
    marker = marker_key(key)

    def attempt() -> bytes:
        expected = _read_json(store, marker)
        if expected is None:
            raise _NotYet(f"commit marker {marker!r} missing")
        try:
            data = store.get(key)
        except ObjectNotFound:
            data = None
        if data is not None and _digest(data) == _expected_digest(expected, marker):
            return data
        if _read_json(store, marker) != expected:
            raise _NotYet(f"{key!r} is being rewritten")
        if data is None:
            raise CorruptObject(f"commit marker {marker!r} exists but object {key!r} is missing")
        raise CorruptObject(
            f"object {key!r} does not match its commit marker: expected "
            f"{_expected_digest(expected, marker)}, got {_digest(data)}"
        )

    return _poll(attempt, wait=wait, poll=poll, what=f"committed object {key!r}")


def _expected_digest(entry: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        return {"size": int(entry["size"]), "sha256": str(entry["sha256"])}
    except (KeyError, TypeError, ValueError):
        raise CorruptObject(f"{where!r} lacks a valid size/sha256: {entry}") from None


def put_dir(store: ObjectStore, prefix: str, local_dir: Path | str) -> dict[str, Any]:
    """Upload every file under ``local_dir`` to ``prefix/``, then the manifest; returns it.

    A previous directory at ``prefix`` is removed first (manifest first), so the result holds
    exactly the files of ``local_dir``.
    """
    prefix = _dir_prefix(prefix)
    local = Path(local_dir)
    if not local.is_dir():
        raise NotADirectoryError(f"cannot publish {str(local)!r}: not a directory")
    files = sorted(p for p in local.rglob("*") if p.is_file())
    store.delete_prefix(manifest_key(prefix))
    store.delete_prefix(prefix + "/")
    entries = []
    for path in files:
        rel = path.relative_to(local).as_posix()
        if rel == MANIFEST_NAME:
            raise ValueError(f"{str(path)!r}: a file named {MANIFEST_NAME} would hide the manifest")
        digest = _file_digest(path)
        store.put_file(f"{prefix}/{check_key(rel)}", path)
        entries.append({"path": rel, **digest})
    manifest = {"files": entries}
    store.put(manifest_key(prefix), json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def dir_committed(store: ObjectStore, prefix: str) -> bool:
    return store.exists(manifest_key(prefix))


def get_dir(
    store: ObjectStore,
    prefix: str,
    local_dir: Path | str,
    *,
    wait: float = 0.0,
    poll: float = 0.05,
    skip: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """Download the committed directory ``prefix`` into ``local_dir``; returns its manifest.

    ``skip``: files (by their path in the directory) not to download, e.g. the optimizer shards of
    other learner ranks; the manifest returned still lists every file.

    Waits up to ``wait`` seconds for the manifest (then TimeoutError naming the prefix). Each
    file is downloaded beside its destination, verified, and only then renamed into place;
    CorruptObject if a file does not match a manifest that is not changing. Files already in
    ``local_dir`` that the manifest does not list are left alone.
    """
    prefix = _dir_prefix(prefix)
    key = manifest_key(prefix)
    local = Path(local_dir)

    def attempt() -> dict[str, Any]:
        manifest = _read_json(store, key)
        if manifest is None:
            raise _NotYet(f"manifest {key!r} missing")
        entries = manifest.get("files")
        if not isinstance(entries, list):
            raise CorruptObject(f"manifest {key!r} has no 'files' list")
        for entry in entries:
            rel = check_key(str(entry.get("path", "")))
            if skip is not None and skip(rel):
                continue
            expected = _expected_digest(entry, key)
            dest = local.joinpath(*rel.split("/"))
            staging = dest.with_name(f".{dest.name}.download{TMP_SUFFIX}")
            try:
                store.get_file(f"{prefix}/{rel}", staging)
                got = _file_digest(staging)
            except ObjectNotFound:
                got = None
            if got == expected:
                os.replace(staging, dest)
                continue
            staging.unlink(missing_ok=True)
            if _read_json(store, key) != manifest:
                raise _NotYet(f"directory {prefix!r} is being republished")
            if got is None:
                raise CorruptObject(f"manifest {key!r} lists {rel!r} but the object is missing")
            raise CorruptObject(f"{prefix}/{rel} does not match manifest {key!r}: expected {expected}, got {got}")
        return manifest

    return _poll(attempt, wait=wait, poll=poll, what=f"committed directory {prefix!r}")


def list_committed_dirs(store: ObjectStore, parent_prefix: str) -> list[str]:
    """Names of the child directories of ``parent_prefix`` whose manifest exists, sorted."""
    parent = _dir_prefix(parent_prefix) + "/"
    names = set()
    for key in store.list(parent):
        child, sep, rest = key[len(parent) :].partition("/")
        if sep and rest == MANIFEST_NAME:
            names.add(child)
    return sorted(names)
