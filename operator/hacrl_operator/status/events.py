"""Events: the ``Event`` type, and the Events a status transition posts."""

from __future__ import annotations

import dataclasses

from hacrl_core.status import ExperimentStatus

# Condition reasons that deserve a Warning event when they appear.
WARNING_REASONS = (
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CrashLoop",
    "Unschedulable",
    "PodCreateFailed",
    "StoreUnreachable",
    "ManyRowsSkipped",
    "SecretNotAllowed",
    "StoreOwnedByAnother",
)


@dataclasses.dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


def transition_events(old: ExperimentStatus, new: ExperimentStatus) -> list[Event]:
    """Events for a changed phase and for every condition whose status or reason changed."""
    events: list[Event] = []
    old_phase = old.phase if "phase" in old.model_fields_set else None  # a new experiment has none yet
    if old_phase != new.phase:
        kind = "Warning" if new.phase == "Failed" else "Normal"
        events.append(Event(kind, new.phase, new.message or f"phase {new.phase}"))
    before = {c.type: c for c in old.conditions}
    for condition in new.conditions:
        if condition.type in ("Succeeded", "Failed", "Suspended", "CleanedUp"):
            continue  # the phase event says it
        previous = before.get(condition.type)
        if previous and (previous.status, previous.reason) == (condition.status, condition.reason):
            continue
        if not previous and condition.status == "True" and condition.type == "StoreReachable":
            continue  # nothing to say the first time the store answers
        if condition.status == "False" and condition.reason not in WARNING_REASONS:
            continue  # pending, restarting, finished, suspended: the phase and action events say it
        warning = condition.status == "False" or condition.reason in WARNING_REASONS
        events.append(Event("Warning" if warning else "Normal", condition.reason, condition.message))
    return events
