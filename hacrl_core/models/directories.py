"""Directories that appear whole or not at all: built in a sibling temporary directory, then renamed.

The temporary directory sits beside the target (``.tmp-<name>-*``), so the rename stays on one
file system and is atomic: a reader sees no directory, or a complete one, never a half-written one.

``build_once`` is for content that is the same whoever builds it (a fetched or generated model in
a cache): an existing complete target is reused, and when two processes race, the first rename
wins and the loser's copy is discarded. ``replace_directory`` is for content that changes (a
policy saved every step): the old directory is moved aside, the new one renamed in, the old one
deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def _sibling(target: Path, prefix: str) -> Iterator[Path]:
    """A new empty directory beside ``target``, removed on exit whatever happened to it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-{target.name}-", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_once(target: str | Path, build: Callable[[Path], None], *, marker: str) -> Path:
    """``target``, built by ``build(directory)`` unless ``target/marker`` already exists.

    ``marker`` is a file the build writes (last, or at all): its presence is what "complete"
    means, both for reuse and for a lost race. Errors from ``build`` propagate and leave no target.
    """
    target = Path(target)
    if (target / marker).is_file():
        return target
    with _sibling(target, ".tmp") as tmp:
        build(tmp)
        if not (tmp / marker).is_file():
            raise RuntimeError(f"building {target} wrote no {marker}")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).is_file():  # not a lost race: a real failure
                raise
    return target


def replace_directory(target: str | Path, write: Callable[[Path], None]) -> Path:
    """``target`` with the contents ``write(directory)`` produces, replacing any existing one."""
    target = Path(target)
    with _sibling(target, ".tmp") as tmp:
        write(tmp)
        if not target.exists():
            os.rename(tmp, target)
            return target
        with _sibling(target, ".old") as old:
            os.rename(target, old / target.name)
            os.rename(tmp, target)
    return target
