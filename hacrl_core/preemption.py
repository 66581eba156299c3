"""What a worker does on SIGTERM: a preemption costs at most the step in flight.

SIGTERM is how a pod is stopped (deleted, evicted, preempted by a scheduler or a queue, its node
drained or shut down) and how `hacrl run` stops its workers (Ctrl-C, its own SIGTERM). The pod
then has ``spec.checkpoint.gracePeriodSeconds`` (its ``terminationGracePeriodSeconds``) before
SIGKILL. Without a handler the worker died at once and its learner lost every step since its last
periodic checkpoint (``checkpoint.everySteps``).

With ``install`` the signal only sets a flag (``Preemption.requested``), and the worker ends as
follows, with ``PREEMPTED_EXIT_CODE``, which `hacrl run` and the operator read
as a preemption: restarted, never counted against ``restartLimit``.

- Before its step loop (loading models) there is nothing to keep: it stops at once.
- A step *waiting* for data (its rollouts, a peer's rollouts or scores, weights) is abandoned:
  the store's waits (``store.commit.WAIT_HOOKS``) raise ``Preempted``. A learner abandons a step
  only before its first optimizer update (``LearnerStop.trained``): until then the step changed only
  its capability history and the RNG streams, which ``LearnerStop`` restores from its snapshot
  of the step's start, so the checkpoint it writes is exactly the state after the last finished
  step (the restarted learner trains the abandoned step as the uninterrupted run did).
- A step *computing* (sampling, scoring, updates, publishing) goes on to its end, and the worker
  stops at the top of its next step: a rollout worker after its current write, a learner after
  its step's publish, metrics and (if due) periodic checkpoint.
- A learner then checkpoints its last finished step unless a periodic checkpoint already holds
  it, so its restart continues from the step it stopped at.

Each stop is recorded in the store (``preemptions/<agent>.<role>.json``: a count and the last
stop), which the restarted worker serves as ``hacrl_preemptions_total``.

A learner over several ranks keeps the old behaviour (SIGTERM's default): its ranks would have
to agree on where to stop, and the launcher process, not the ranks, receives the pod's SIGTERM.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from hacrl_core.exit_codes import PREEMPTED_EXIT_CODE
from hacrl_core.store import layout

log = logging.getLogger("hacrl.worker")

__all__ = ["PREEMPTED_EXIT_CODE", "LearnerStop", "Preempted", "Preemption", "PREEMPTION"]


class Preempted(BaseException):
    """Ends a worker stopped by SIGTERM (``PREEMPTED_EXIT_CODE``). A BaseException, as
    KeyboardInterrupt is: no ``except Exception`` of the code it passes through takes it for an
    error of its own (a store retry, a reward's fallback). ``finished``: the steps a learner
    kept (checkpointed), None for a rollout worker or before the step loop."""

    finished: int | None = None


class Preemption:
    """The process's SIGTERM: a flag, and when to act on it (module docstring)."""

    def __init__(self) -> None:
        self.requested_at: float | None = None  # time.monotonic() of the first SIGTERM
        self.armed = False  # in the step loop: a SIGTERM waits for a step boundary or a wait
        self.abandonable = True  # a wait now may be abandoned (a learner: until its first update)
        self.installed = False
        self.learner: LearnerStop | None = None  # a learner's, once its step loop is set up

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def install(self) -> bool:
        """Handle SIGTERM in this process (its main thread only: where Python runs handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        from hacrl_core.store import commit

        signal.signal(signal.SIGTERM, self._handle)
        if self.check_wait not in commit.WAIT_HOOKS:
            commit.WAIT_HOOKS.append(self.check_wait)
        self.installed = True
        return True

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.requested_at is None
        if first:
            self.requested_at = time.monotonic()
        if not self.armed:  # setting up: nothing to keep yet
            raise Preempted("stopped on SIGTERM before its first step")
        if first:
            log.info("SIGTERM: stopping at the end of the step in flight, or at once if it waits for data")

    def arm(self) -> None:
        """The step loop begins: from now on a SIGTERM is acted on at a boundary or a wait."""
        self.armed = True
        self.check()

    def check(self) -> None:
        """At a step boundary: stop if a SIGTERM came."""
        if self.requested:
            raise Preempted("stopped on SIGTERM at a step boundary")

    def check_wait(self) -> None:
        """Called by the store before each wait's sleep (``commit.WAIT_HOOKS``)."""
        if self.requested and self.armed and self.abandonable:
            raise Preempted("stopped on SIGTERM while its step waited for data: the step is abandoned")

    def seconds_since(self) -> float | None:
        return None if self.requested_at is None else time.monotonic() - self.requested_at


#: This process's (a worker is one process; ``install`` is called by `hacrl worker`).
PREEMPTION = Preemption()


class LearnerStop:
    """The learner's side: a snapshot of what a step changes before its first optimizer update
    (capability history, RNG streams) taken as the step begins, and the checkpoint of the last
    finished step when the worker stops. ``save(completed)``: the worker's checkpoint;
    ``last_checkpoint()``: the latest one in the store."""

    def __init__(self, tracker: Any, save: Callable[[int], None], last_checkpoint: Callable[[], int | None]) -> None:
        self.tracker, self.save, self.last_checkpoint = tracker, save, last_checkpoint
        self.preemption = PREEMPTION
        self.preemption.learner = self  # what ``preempted_exit`` stops
        self.step: int | None = None  # the step begun last: the count of finished steps
        self._snapshot: tuple[Any, Any, Any] | None = None

    def begin(self, step: int) -> None:
        """Step ``step`` begins (``step`` steps finished): stop here if a SIGTERM came (the state
        is that of the finished steps: nothing to put back), else snapshot what the step may
        change before it trains."""
        self.step, self._snapshot = step, None
        self.preemption.abandonable = True
        self.preemption.arm()
        if self.preemption.installed:
            import torch

            self._snapshot = (copy.deepcopy(self.tracker.state_dict()), torch.get_rng_state(), random.getstate())

    def trained(self) -> None:
        """The step trained (its updates ran): it can no longer be abandoned; it finishes (its
        sinks: publish, metrics, checkpoint if due, progress) and the worker stops at the next
        ``begin``. (The step's waits all come before its updates, ``learner.step``.)"""
        self.preemption.abandonable = False

    def stop(self) -> int | None:
        """Put the state back to the start of the step begun last (abandoned, or not begun) and
        checkpoint it unless a checkpoint holds it; the finished steps it keeps (None: stopped
        before the step loop)."""
        if self.step is None:
            return None
        if self._snapshot is not None:
            import torch

            tracker_state, torch_rng, python_rng = self._snapshot
            self.tracker.load_state_dict(tracker_state)
            torch.set_rng_state(torch_rng)
            random.setstate(python_rng)
        if self.step > 0 and self.last_checkpoint() != self.step:
            began = time.monotonic()
            self.save(self.step)
            log.info("checkpoint after %d steps written on SIGTERM in %.1fs", self.step, time.monotonic() - began)
        return self.step


# -- the record of stops in the store ---------------------------------------------------------


def record_key(experiment: str, agent: str, role: str, replica: int | None = None) -> str:
    """``<experiment>/preemptions/<agent>.<role>[-<replica>].json``."""
    suffix = "" if replica is None else f"-{layout.check_index('replica', replica)}"
    return f"{layout.experiment_prefix(experiment)}/preemptions/{layout.check_name('agent', agent)}.{role}{suffix}.json"


def read_record(store: Any, agent: str, role: str, replica: int | None = None) -> dict[str, Any]:
    """The worker's record of stops (``{"count": 0}`` when it never stopped, or unreadable)."""
    try:
        record = json.loads(store.objects.get(record_key(store.experiment, agent, role, replica)))
    except Exception:  # noqa: BLE001 (missing, or not JSON: no stop to count)
        return {"count": 0}
    return record if isinstance(record, dict) and isinstance(record.get("count"), int) else {"count": 0}


def record_stop(store: Any, agent: str, role: str, replica: int | None, **detail: Any) -> dict[str, Any]:
    """Count one stop in the worker's record (after its checkpoint: its last write)."""
    record = read_record(store, agent, role, replica)
    record = {"count": record["count"] + 1, "last": {"time": time.time(), **detail}}
    store.objects.put(record_key(store.experiment, agent, role, replica), json.dumps(record, sort_keys=True).encode())
    return record


def serve_count(metrics: Any, store: Any, agent: str, role: str, replica: int | None = None) -> None:
    """``hacrl_preemptions_total`` of this worker: its stops so far, as its record holds them."""
    count = read_record(store, agent, role, replica)["count"]
    metrics.count_from(
        "hacrl_preemptions",
        "Times this worker stopped on SIGTERM (preempted, evicted, deleted, drained) and resumed.",
        lambda: count,
    )


def preempted_exit(store: Any, agent: str, role: str, replica: int | None, stopped: Preempted) -> int:
    """How a worker stopped by SIGTERM ends: its stop recorded (``hacrl_preemptions_total`` of its
    restart; ``role`` "rollout" or "learner", a colocated worker's "learner"), one log line, and
    ``PREEMPTED_EXIT_CODE``. A learner's state, as the ``Preempted`` left it, is first put back
    to its finished steps and checkpointed (``LearnerStop.stop``)."""
    if PREEMPTION.learner is not None and stopped.finished is None:
        stopped.finished = PREEMPTION.learner.stop()
    seconds = PREEMPTION.seconds_since()
    try:
        record_stop(store, agent, role, replica, finished=stopped.finished, reason=str(stopped), seconds=seconds)
    except Exception as error:  # noqa: BLE001 (the count is informational: the exit code says it all)
        log.warning("could not record the preemption in the store: %s", error)
    where = "" if stopped.finished is None else f"; {stopped.finished} steps finished and checkpointed"
    log.info(
        "worker preempted: %s%s, %.1fs after SIGTERM; exit code %d, its restart continues from there",
        stopped,
        where,
        seconds or 0.0,
        PREEMPTED_EXIT_CODE,
    )
    return PREEMPTED_EXIT_CODE
