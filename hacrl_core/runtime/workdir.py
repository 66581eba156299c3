"""The work folder of one `hacrl run` (logs, the rendered spec the workers read, the report):
held by that run alone for as long as it lives.

Two runs of the same experiment started from one folder used the same ``hacrl-runs/<name>``:
the second overwrote the first's ``spec.yaml``, and the first's workers (restarts included)
then trained the second's experiment in the second's store. The lock is an ``flock`` on
``run.lock`` in the folder, taken before anything there is written; the kernel drops it when the
process that took it ends in any way (``kill -9`` included), so a dead run never blocks its
``--resume``. The descriptor is not inherited by the workers (close-on-exec; the fork server is a
fresh interpreter), so only the live `hacrl run` holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import yaml

LOCK_NAME = "run.lock"


class WorkdirBusy(RuntimeError):
    """The work folder is another live run's, or cannot be one; the message says which and the fix."""


def hold_workdir(workdir: Path) -> int:
    """Create ``workdir`` (and its ``logs``) and lock it for this process; the descriptor that
    holds the lock (``release_workdir`` gives it up; the process's end does too)."""
    try:
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise WorkdirBusy(f"--workdir {workdir}: it, or a folder above it, is a file; give a folder") from None
    except PermissionError as error:
        raise WorkdirBusy(
            f"--workdir {workdir}: cannot create it ({error.strerror}); give a folder you can write"
        ) from None
    path = workdir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise WorkdirBusy(f"--workdir {workdir}: cannot open {path} ({error.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise WorkdirBusy(
            f"{workdir} is the work folder of another `hacrl run` that is still running (pid {holder}); a second run "
            "there would replace the spec its workers read. Wait for it to end, stop it (Ctrl-C; then `--resume`), or give "
            "this run its own --workdir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def another_experiments(workdir: Path, name: str, namespace: str | None) -> str | None:
    """Why ``workdir`` belongs to another experiment (its ``spec.yaml`` names another), or None.
    A run there overwrote that experiment's report, spec and logs: a mix of two runs."""
    try:
        document = yaml.safe_load((workdir / "spec.yaml").read_text(encoding="utf-8"))
        metadata = document["metadata"]
        theirs = (metadata["name"], metadata.get("namespace"))
    except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError):  # none there, or not a run's: nothing to protect
        return None
    if theirs == (name, namespace):
        return None
    shown = theirs[0] if theirs[1] is None else f"{theirs[1]}/{theirs[0]}"
    return (
        f"--workdir {workdir} holds the run of experiment {shown!r} (its spec.yaml, report and logs); a run of {name!r} "
        f"there would overwrite them: give it a folder of its own with --workdir, or leave --workdir out "
        f"(hacrl-runs/{name})"
    )


def release_workdir(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
