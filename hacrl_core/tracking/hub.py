"""The trackers of one learner, behind one rule: a tracker that is down never stops training.

``TrackingHub.log`` holds a step's metrics until ``release``, which the learner calls once the
step is checkpointed: a tracker sees each step once, never a step that a resume trains again.
The record in the store (run ids, ``logged_through``) lets a resumed learner continue the same
runs and send the steps a crash kept from them (``backfill``).

Released steps are queued for every tracker, which is sent what it can take. A
tracker that fails is warned about once per outage and retried with exponential backoff (1 s
doubling to 60 s, measured between steps); its queue keeps the last ``buffer_steps`` steps, and
each step pushed out of a full queue is counted in ``drops`` (served as
``hacrl_tracker_drops_total``). When it answers again the queued steps go out in order.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hacrl_core.tracking.backends import Tracker

log = logging.getLogger("hacrl")
FIRST_DELAY, MAX_DELAY = 1.0, 60.0


def numeric(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class _Channel:
    """One tracker, its queue and its outage state."""

    def __init__(self, tracker: Tracker, buffer_steps: int) -> None:
        self.tracker = tracker
        self.queue: deque[tuple[int, dict[str, float]]] = deque()
        self.buffer_steps = buffer_steps
        self.run_id: str | None = None
        self.started = False
        self.failing = False
        self.delay = FIRST_DELAY
        self.next_try = 0.0


class TrackingHub:
    def __init__(
        self,
        trackers: Sequence[Tracker],
        buffer_steps: int,
        *,
        record: Mapping[str, Any],
        run_name: str,
        params: Mapping[str, Any],
        save_record: Callable[[dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channels = [_Channel(t, buffer_steps) for t in trackers]
        runs = record.get("runs", {})
        for channel in self.channels:
            channel.run_id = runs.get(channel.tracker.name)
        self.logged_through: int = record.get("logged_through", -1)
        self.run_name, self.params, self.save_record, self.clock = run_name, params, save_record, clock
        self.held: list[tuple[int, dict[str, float]]] = []
        self.drops: Counter[str] = Counter()
        self.finished = False
        self._send_all(force=True)

    def backfill(self, steps: Mapping[int, Mapping[str, Any]]) -> None:
        """Steps checkpointed before this learner started that its trackers never got."""
        for step in sorted(steps):
            if step > self.logged_through:
                self.log(step, steps[step])
        self.release()

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        """Hold a step's metrics until ``release``."""
        self.held.append((step, numeric(values)))

    def release(self) -> None:
        """The held steps are durable (checkpointed): queue them for every tracker and send."""
        if not self.held:
            return
        for step, metrics in self.held:
            for channel in self.channels:
                if len(channel.queue) >= channel.buffer_steps:
                    channel.queue.popleft()
                    self.drops[channel.tracker.name] += 1
                channel.queue.append((step, metrics))
        self.logged_through = self.held[-1][0]
        self.held.clear()
        self._send_all()
        self._save()

    def _save(self) -> None:
        self.save_record(
            {
                "runs": {c.tracker.name: c.run_id for c in self.channels if c.run_id},
                "logged_through": self.logged_through,
            }
        )

    def artifact(self, path: Path) -> None:
        for channel in self.channels:
            if channel.started:
                self._attempt(channel, functools.partial(channel.tracker.artifact, path), f"artifact {path.name}")

    def finish(self) -> None:
        """Send what is released and queued (one last try, whatever the backoff), then close every
        run. Once: a worker's normal end and its exit handler both call it. Steps still held are
        not durable: a resume trains them again and logs them then."""
        if self.finished:
            return
        self.finished = True
        self._send_all(force=True)
        for channel in self.channels:
            if channel.started:
                self._attempt(channel, channel.tracker.finish, "finish")
            if channel.queue:
                log.warning(
                    "tracker %s: %d steps never sent (unreachable until the end)",
                    channel.tracker.name,
                    len(channel.queue),
                )

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    def _send_all(self, *, force: bool = False) -> None:
        for channel in self.channels:
            if not force and channel.failing and self.clock() < channel.next_try:
                continue
            self._attempt(channel, functools.partial(self._send, channel), "log")

    def _send(self, channel: _Channel) -> None:
        if not channel.started:
            run_id = channel.tracker.start(channel.run_id, self.run_name, self.params)
            channel.started = True
            if run_id != channel.run_id:
                channel.run_id = run_id
                self._save()
        while channel.queue:
            step, metrics = channel.queue[0]
            channel.tracker.log(step, metrics)
            channel.queue.popleft()

    def _attempt(self, channel: _Channel, action: Callable[[], None], what: str) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 (any client error: the tracker is down, training is not)
            if not channel.failing:
                log.warning(
                    "tracker %s unreachable (%s: %s); training goes on, keeping up to %d steps for it and retrying",
                    channel.tracker.name,
                    type(error).__name__,
                    str(error)[:300],
                    channel.buffer_steps,
                )
            channel.failing = True
            channel.next_try = self.clock() + channel.delay
            channel.delay = min(channel.delay * 2, MAX_DELAY)
            return
        if channel.failing and what == "log":
            log.warning("tracker %s reachable again: queued steps sent", channel.tracker.name)
        channel.failing, channel.delay = False, FIRST_DELAY
