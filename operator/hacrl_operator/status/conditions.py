"""The experiment's conditions: every one is set through ``Conditions.set`` (by the planner, and by
the reconcile when an action fails), so transition times are kept the same way everywhere."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Literal

from hacrl_core.status import Condition, ExperimentStatus
from hacrl_operator.status.clock import rfc3339

# The order conditions are listed in; others follow in the order they were set.
_ORDER = ("Ready", "StoreReachable", "Suspended", "Succeeded", "Failed", "CleanedUp")

# Ready's reason when several pods are not running: the most actionable first.
_REASON_PRIORITY = (
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CrashLoop",
    "Unschedulable",
    "PodCreateFailed",
    "Restarting",
    "PodsPending",
)


class Conditions:
    """Conditions keyed by type: those of the last written status, and those set or kept in this
    reconcile (only these are written). lastTransitionTime moves only when a condition's status
    changes from the written one."""

    def __init__(self, old: Iterable[Condition], now: dt.datetime) -> None:
        self.old = {c.type: c for c in old}
        self.new: dict[str, Condition] = {}
        self.now = rfc3339(now)

    def set(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        value: Literal["True", "False"] = "True" if status else "False"
        previous = self.old.get(type_)
        since = previous.last_transition_time if previous is not None and previous.status == value else self.now
        self.new[type_] = Condition(
            type=type_, status=value, reason=reason, message=message, last_transition_time=since
        )

    def keep(self, type_: str) -> None:
        if type_ in self.old:
            self.new[type_] = self.old[type_]

    def previous(self, type_: str) -> Condition | None:
        """The condition as last written."""
        return self.old.get(type_)

    def listed(self) -> list[Condition]:
        return sorted(self.new.values(), key=lambda c: _ORDER.index(c.type) if c.type in _ORDER else len(_ORDER))


def most_actionable(problems: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """The (reason, message) Ready reports when pods are not running: the first of the most actionable reason."""
    return min(
        problems, key=lambda p: _REASON_PRIORITY.index(p[0]) if p[0] in _REASON_PRIORITY else len(_REASON_PRIORITY)
    )


def store_deleted(status: ExperimentStatus) -> bool:
    """Whether the cleanup policy already deleted the experiment's store prefix (``CleanedUp=True``,
    reason ``StoreDeleted``): nothing reads or deletes it again."""
    return any(c.type == "CleanedUp" and c.status == "True" and c.reason == "StoreDeleted" for c in status.conditions)
