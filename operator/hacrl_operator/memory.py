"""Hands the memory that let-go experiments freed back to the system (glibc's ``malloc_trim``).

Measured with bench/operator_scale.py: when the experiments' objects are freed (their stores,
the shared S3 client's 12 MiB of parsed service model, kopf's state of their pods), CPython gives
its own small-object arenas back as soon as they are empty, but the larger blocks it takes from
glibc (dicts' and lists' tables, JSON bodies and responses over 512 bytes) stay in glibc's free
lists: the process's resident size stays at its high-water mark. ``malloc_trim(0)`` returns the
free pages of every glibc arena; the ticker calls it after a round in which experiments were
forgotten or let go of their stores (``Ticker.tick``), so at most once per reconcile interval.
What it cannot return is a CPython arena that still holds one live object (fragmentation).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # musl has none


def trim() -> bool:
    """Give glibc's free pages back to the system; False where the C library has no malloc_trim."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
