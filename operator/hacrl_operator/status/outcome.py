"""What acting on a plan did, and the pure fold of it into the plan.

``Reconciler.execute`` (``handlers/reconcile.py``) acts on a ``Plan`` and returns an
``ActionOutcome``: the pods it created and deleted, the pod states and conditions its actions'
results set (a pod created is Pending; one that could not be created is CreateFailed, with Ready
False and a Warning), and the Events of its actions, each in the order they happened.
``fold_outcome`` folds that into a copy of the plan: the status the reconcile writes is the
plan's with those changes applied in that order, and its Events are the plan's, then the actions'.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import NamedTuple

from hacrl_operator.status.events import Event
from hacrl_operator.status.plan import Plan


class PodStateChange(NamedTuple):
    """``agent``'s ``role`` pod(s), or its replica ``replica`` alone, are now in ``state``."""

    agent: str
    role: str
    state: str
    replica: int | None = None


class ConditionChange(NamedTuple):
    """A condition an action's result sets (``Plan.set_condition``)."""

    type: str
    status: bool
    reason: str
    message: str = ""


@dataclasses.dataclass(frozen=True)
class ActionOutcome:
    """What one reconcile's actions did, in the order they happened; ``+`` appends one to another."""

    created: tuple[str, ...] = ()  # pods created
    deleted: tuple[str, ...] = ()  # pods deleted
    pod_states: tuple[PodStateChange, ...] = ()
    conditions: tuple[ConditionChange, ...] = ()
    events: tuple[Event, ...] = ()

    def __add__(self, other: ActionOutcome) -> ActionOutcome:
        return ActionOutcome(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))


def said(type_: str, reason: str, message: str) -> ActionOutcome:
    """An action's Event alone."""
    return ActionOutcome(events=(Event(type_, reason, message),))


def failure(condition: str, reason: str, message: str, *, warn: bool = True) -> ActionOutcome:
    """An action that failed: ``condition`` False for ``reason``, and (``warn``) a Warning event."""
    events = (Event("Warning", reason, message),) if warn else ()
    return ActionOutcome(conditions=(ConditionChange(condition, False, reason, message),), events=events)


def fold_outcome(plan: Plan, outcome: ActionOutcome) -> Plan:
    """``plan`` with ``outcome`` folded in: its pod states and conditions set in order, its Events
    after the plan's. Pure: ``plan`` itself is left as it was (and returned when there is nothing
    to fold, the usual reconcile, which then copies nothing)."""
    if outcome == ActionOutcome():
        return plan
    folded = copy.deepcopy(plan)
    for change in outcome.pod_states:
        folded.set_pod_state(*change)
    for condition in outcome.conditions:
        folded.set_condition(*condition)
    folded.events.extend(outcome.events)
    return folded
