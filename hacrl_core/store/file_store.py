"""Object store on a local (or shared, e.g. NFS/PVC) file system.

Key ``a/b/c`` is the file ``<root>/a/b/c``. Every write goes to a temporary file in the same
directory (name ending in ``keys.TMP_SUFFIX``), is fsynced, and is renamed over the target with
``os.replace``, so a reader sees either the old object, the new one, or none: never a partial
file. Temporary files are invisible to ``list``/``exists``/``get``.

Unlike S3, a file system cannot hold both ``a/b`` and ``a/b/c``; writing both raises OSError.
The key layout of ``layout.py`` never does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from hacrl_core.store.errors import ObjectNotFound, StoreGone
from hacrl_core.store.keys import TMP_SUFFIX, check_key, check_prefix


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Create ``path`` (and parents) atomically with the bytes ``write(f)`` writes to ``f``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; best effort (not every file system supports it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FileObjectStore:
    """``ObjectStore`` rooted at the directory ``root`` (created on first write)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().absolute()
        # Once the root existed, a write never re-creates it: a deleted store stays deleted
        # (``StoreGone``) instead of coming back piecemeal from the writes in flight.
        self._root_seen = self.root.is_dir()

    def __repr__(self) -> str:
        return f"FileObjectStore({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _write_path(self, key: str) -> Path:
        path = self._path(key)
        if self._root_seen and not self.root.is_dir():
            raise StoreGone(f"the store {self.uri} is gone (deleted while in use); {key!r} was not written")
        self._root_seen = True
        return path

    def put(self, key: str, data: bytes) -> None:
        atomic_write(self._write_path(key), lambda f: f.write(data))

    def put_file(self, key: str, local_path: Path | str) -> None:
        """Upload the local file ``local_path`` as ``key`` without reading it into memory."""
        with open(local_path, "rb") as src:
            atomic_write(self._write_path(key), lambda f: shutil.copyfileobj(src, f, 1 << 20))

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key, self.uri) from None

    def get_file(self, key: str, local_path: Path | str) -> None:
        """Download ``key`` to ``local_path`` (written atomically) without holding it in memory."""
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(key, self.uri)
        try:
            with open(path, "rb") as src:
                atomic_write(Path(local_path), lambda f: shutil.copyfileobj(src, f, 1 << 20))
        except FileNotFoundError:
            if not path.is_file():  # deleted between the check and the open
                raise ObjectNotFound(key, self.uri) from None
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        # Walk only the deepest directory the prefix fully names, then filter by string prefix
        # (S3 semantics: "a/b" matches "a/b/c" and "a/bc").
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root.joinpath(*base.split("/")) if base else self.root
        if not start.is_dir():
            return []
        keys = []
        for dirpath, _dirnames, filenames in os.walk(start):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.endswith(TMP_SUFFIX):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        # Unlike delete_prefix this leaves the directory in place: its one caller
        # (commit.put_committed) writes the object beside it next, and pruning would race that.
        try:
            self._path(key).unlink()
        except (FileNotFoundError, NotADirectoryError):
            pass

    def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise ValueError("refusing to delete the whole store: pass a non-empty prefix")
        keys = self.list(prefix)
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass
        self._prune_empty_dirs({self._path(k).parent for k in keys})
        return len(keys)

    def _prune_empty_dirs(self, dirs: set[Path]) -> None:
        # Deepest first, never above (or at) the root.
        for directory in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            while directory != self.root and self.root in directory.parents:
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass  # removed concurrently: still try its parent
                except OSError:  # not empty
                    break
                directory = directory.parent
