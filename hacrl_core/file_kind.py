"""What a path is when it is not a regular file, for messages: a FIFO given as a spec hung
`hacrl validate` (opening it waits for a writer), and given as a dataset was called "no such file"."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def not_a_regular_file(path: Path) -> str | None:
    """``"no such file"``, ``"a folder"``, ``"a named pipe (FIFO)"``, ... ; None for a regular file.
    Never opens ``path``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except NotADirectoryError:
        return "no such file (a folder on its path is a file)"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO), not a file: reading it waits for a writer"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    return "a device, not a file"


def is_pipe_or_socket(path: Path) -> bool:
    """Whether opening ``path`` to read could wait for another process (a FIFO or a socket)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
