"""A worker started by `hacrl run` stops when that `hacrl run` is gone.

`hacrl run` supervises its workers (restarts, Ctrl-C, the report); each worker runs in its own
session, so a `kill -9` of `hacrl run` left them training unsupervised, with nobody to stop them
or to notice a failure. `hacrl run` hands each worker its pid (``SUPERVISOR_PID_ENV``); the worker
watches that process (a pidfd on Linux: woken when it exits, immune to pid reuse; elsewhere a
1-second poll) and, once it is gone, ends its own process group (itself, its learner ranks, its
reward worker) with SIGTERM. Checkpoints and shards are committed atomically, so the run is
resumable with `hacrl run --resume`. Pods have no such variable: Kubernetes supervises them.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time

SUPERVISOR_PID_ENV = "HACRL_SUPERVISOR_PID"


def _wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (not Linux, or a kernel before 5.3): poll
        while _alive(pid):
            time.sleep(1.0)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_when_gone(pid: int) -> None:
    _wait_for_exit(pid)
    logging.getLogger("hacrl.worker").error(
        "the `hacrl run` that started this worker (pid %d) is gone: this worker stops; continue the run with "
        "`hacrl run --resume <spec>`",
        pid,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.killpg(os.getpgrp(), signal.SIGTERM)


def watch_supervisor(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Stop this worker's process group once the `hacrl run` named in ``SUPERVISOR_PID_ENV`` ends
    (nothing without it)."""
    value = environ.get(SUPERVISOR_PID_ENV, "")
    if not value.isdigit():
        return
    threading.Thread(target=_stop_when_gone, args=(int(value),), name="supervisor-watch", daemon=True).start()
