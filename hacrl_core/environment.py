"""The ``HACRL_*`` environment variables a run reads, checked before it starts.

Parsed bare, ``HACRL_TORCH_THREADS=abc`` or ``HACRL_WAIT_SECONDS=-5`` ended in tracebacks, some
after the store was claimed; an unusable ``HACRL_CACHE`` failed in the model build. Each is now
one ``BadVariable`` naming the variable, its value and what it takes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

THREADS = "HACRL_TORCH_THREADS"
WAIT_SECONDS = "HACRL_WAIT_SECONDS"
CACHE = "HACRL_CACHE"


class BadVariable(ValueError):
    """An environment variable this process cannot use; the message names it and the fix."""


def torch_threads() -> int | None:
    """``HACRL_TORCH_THREADS``: torch threads of every worker (None: unset, chosen per run)."""
    text = os.environ.get(THREADS, "").strip()
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 4096:
        raise BadVariable(
            f"{THREADS}={text[:40]!r}: not a whole number of threads from 1 to 4096; set one, or unset it "
            "to let `hacrl run` share the CPUs among the workers"
        )
    return int(text)


def wait_seconds(default: float = 3600.0) -> float:
    """``HACRL_WAIT_SECONDS``: how long a worker waits for a peer's shard (default an hour)."""
    text = os.environ.get(WAIT_SECONDS, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise BadVariable(
            f"{WAIT_SECONDS}={text[:40]!r}: not a number of seconds above 0; set one, or unset it (default {default:g})"
        )
    return value


def cache_root() -> Path:
    """``HACRL_CACHE`` (default ``.hacrl-cache``): where models are built and fetched."""
    return Path(os.environ.get(CACHE) or ".hacrl-cache").resolve()


def check_cache() -> None:
    """``BadVariable`` unless the cache folder is, or can be made, a writable folder. Makes nothing:
    a run refused later must leave no cache behind."""
    root = cache_root()
    for folder in (root, *root.parents):
        if not folder.exists():
            continue
        if not folder.is_dir():
            raise BadVariable(f"{CACHE}={str(root)!r}: {folder} is a file, not a folder; point it at a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise BadVariable(f"{CACHE}={str(root)!r}: {folder} is not writable; point it at a writable folder")
        return


def check_environment() -> None:
    """Every variable above, before a command writes anything."""
    torch_threads()
    wait_seconds()
    check_cache()
