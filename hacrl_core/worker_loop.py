"""What a worker's step loop calls after each step: a list of sinks, in order.

A worker loop is start-up, then per step: do the step's work, hand what it produced (one
``end`` object: the step, its metrics and what the step's sinks add to it) to each sink in the
list, in order. A sink does one job (publish the weights, evaluate, write the metrics, checkpoint,
write the progress file); the list says which run, and in which order, for this worker and this
rank. A hook that belongs to every step (a stop request, a team change) is one more sink in the
list, not another branch of the loop.

Shared by the learner (``learner.sinks``) and the rollout worker (``rollout.worker``), so that
neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

EndT_contra = TypeVar("EndT_contra", contravariant=True)
EndT = TypeVar("EndT")


class StepSink(Protocol[EndT_contra]):
    """One job done after each step of a worker's loop, and once when the loop ends."""

    def on_step_end(self, end: EndT_contra) -> None:
        """The step ``end`` describes is done: do this sink's job for it."""
        ...

    def on_run_end(self) -> None:
        """The loop ran its last step (not called when a step raised). Nothing by default."""
        return None


def step_ended(sinks: Iterable[StepSink[EndT]], end: EndT) -> None:
    """Each sink's ``on_step_end``, in the list's order."""
    for sink in sinks:
        sink.on_step_end(end)


def run_ended(sinks: Iterable[StepSink[EndT]]) -> None:
    """Each sink's ``on_run_end``, in the list's order."""
    for sink in sinks:
        sink.on_run_end()
