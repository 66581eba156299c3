"""The errors a worker knows how to say: one line in its log, and an exit code that tells its
supervisor (`hacrl run`) whether a restart can get past it.

Without this such an error ended the worker at the CLI's last-resort handler, with its traceback,
and `hacrl run` printed that traceback as the failure's "last log lines"; a corrupt checkpoint or
a full disk was restarted ``restartLimit`` times into the same error.
"""

from __future__ import annotations

import errno
import sys

from hacrl_core.exit_codes import FINAL_EXIT_CODE, RESTARTABLE_EXIT_CODE

#: How the worker's log marks the line (``known_failure``'s) that its supervisor reports.
MARK = "worker stopped: "
#: File-system errors no retry gets past, with what to do about each.
DISK_ERRORS = {
    errno.ENOSPC: "free space there (or move spec.store.uri / HACRL_CACHE)",
    errno.EDQUOT: "raise the quota there, or free space",
    errno.EROFS: "the file system is read-only: point spec.store.uri (or HACRL_CACHE) at a writable one",
    errno.EACCES: "give this user write access there",
    errno.EPERM: "give this user write access there",
    errno.ENOTDIR: "a file stands where a folder belongs (one of the store's replaced by a file?): restore it from a copy, "
    "or start afresh",
    errno.EEXIST: "a file stands where a folder belongs (one of the store's replaced by a file?): restore it from a copy, "
    "or start afresh",
}
CORRUPT_REMEDY = (
    "a committed object no longer matches its commit marker; delete the object and its marker (for a step "
    "shard the step's folder, for a checkpoint its folder) so that it is redone, then `hacrl run --resume`"
)


def known_failure(error: BaseException) -> tuple[int, str] | None:
    """(exit code, one line naming what failed and what to do) of a known error, None for others."""
    from hacrl_core.environment import BadVariable
    from hacrl_core.rewards.remote import RewardServerError
    from hacrl_core.store.errors import CorruptObject

    if isinstance(error, RewardServerError):
        return RESTARTABLE_EXIT_CODE, str(error)
    if isinstance(error, BadVariable):
        return FINAL_EXIT_CODE, str(error)
    lora = sys.modules.get("hacrl_core.models.lora")  # loaded where a LoRA adapter was made; torch comes with it
    if lora is not None and isinstance(error, lora.LoraTargetsUnmatched):
        return FINAL_EXIT_CODE, str(error)
    if isinstance(error, CorruptObject):
        return FINAL_EXIT_CODE, f"{error}: {CORRUPT_REMEDY}"
    if isinstance(error, OSError) and error.errno in DISK_ERRORS:
        return FINAL_EXIT_CODE, disk_error_line(error)
    return None


def disk_error_line(error: OSError) -> str:
    where = error.filename or "the store or the model cache"
    return f"cannot use {where}: {error.strerror or error}; {DISK_ERRORS.get(error.errno or 0, 'check that path')}"


def failure_line(log_text: str) -> str | None:
    """The last line ``MARK`` begins in a worker's log, without the logger's prefix."""
    for line in reversed(log_text.splitlines()):
        if MARK in line:
            return line.split(MARK, 1)[1].strip()
    return None
