"""The seconds of a learner step's stages, for the ``learner/seconds_*`` metrics."""

from __future__ import annotations

import time

#: Which ``learner/seconds_*`` each stage of ``learner_step`` (``step.STAGES``) counts in.
CLOCK_STAGES = {
    "read_own": "score",
    "read_peers": "wait_peers",
    "plan": "score",
    "pi_old": "score",
    "publish_scores": "score",
    "read_peer_scores": "wait_peers",
    "update": "update",
}


class StageClock:
    """Seconds spent in each named stage of a step, for the ``learner/seconds_*`` metrics."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> float:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now
        return self.seconds[stage]

    def lap_step_stage(self, stage: str) -> float:
        """A stage of ``learner_step`` ended: into its ``learner/seconds_*`` (``CLOCK_STAGES``)."""
        return self.lap(CLOCK_STAGES[stage])

    def metrics(self) -> dict[str, float]:
        # Spelled out: dashboards and docs/metrics.md name these series (tests look them up here).
        return {
            "learner/seconds_sample": self.seconds["sample"],
            "learner/seconds_score": self.seconds["score"],
            "learner/seconds_wait_peers": self.seconds["wait_peers"],
            "learner/seconds_update": self.seconds["update"],
            "learner/seconds_publish": self.seconds["publish"],
            "learner/seconds_eval": self.seconds["eval"],
        }
