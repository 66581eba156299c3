"""The errors a worker knows how to say: one line in its log, and an exit code that tells its
supervisor (`hacrl run`) whether a restart can get past it.

Without this such an error ended the worker at the CLI's last-resort handler, with its traceback,
and `hacrl run` printed that traceback as the failure's "last log lines".
"""

from __future__ import annotations

#: A known error a restart may get past (a reward server still down once its retries ran out):
#: restarted within ``restartLimit``, then reported by its line.
RESTARTABLE_EXIT_CODE = 5
#: A known error a restart would only meet again: reported by its line, never restarted.
FINAL_EXIT_CODE = 6
#: How the worker's log marks the line (``log_failure``) that its supervisor reports.
MARK = "worker stopped: "


def known_failures() -> dict[type[BaseException], int]:
    """Exception type -> exit code, imported here so that the CLI's start stays light."""
    from hacrl_core.environment import BadVariable
    from hacrl_core.rewards.remote import RewardServerError

    return {RewardServerError: RESTARTABLE_EXIT_CODE, BadVariable: FINAL_EXIT_CODE}


def exit_code_of(error: BaseException) -> int | None:
    """The exit code of a known error, None for any other."""
    return next((code for kind, code in known_failures().items() if isinstance(error, kind)), None)


def failure_line(log_text: str) -> str | None:
    """The last line ``MARK`` begins in a worker's log, without the logger's prefix."""
    for line in reversed(log_text.splitlines()):
        if MARK in line:
            return line.split(MARK, 1)[1].strip()
    return None
