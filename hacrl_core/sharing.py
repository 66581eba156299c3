"""Is sharing doing anything in this run? What share of the peers' rows a HACPO learner could learn
from, and one warning when most of them fall outside the clipping window step after step.

HACPO trains on a peer's row only while its sequence ratio s = pi_learner / pi_source sits inside
[lo_m, 1] (lo_m = 1 - delta at the step's first update); outside, the row's gradient is zero
(`learner/cross_clip_frac` counts those rows). Pure functions over step metrics: the learner's
log, `hacrl run`'s display and the report all use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The warning fires when more than this share of cross rows is outside the window ...
CLIPPED_MAJORITY = 0.5
#: ... in this many consecutive steps.
WARN_AFTER_STEPS = 3


def shared_rows_used(step_metrics: Mapping[str, Any]) -> float | None:
    """Share of the step's cross rows inside the clipping window (1 - ``cross_clip_frac``);
    None for a step without cross rows or an algorithm that does not clip them (gspo, grpo, naive)."""
    clipped = step_metrics.get("learner/cross_clip_frac")
    if not step_metrics.get("learner/cross_rows") or clipped is None:
        return None
    return 1.0 - float(clipped)


def sharing_warning(agent: str, steps_metrics: Sequence[Mapping[str, Any]], *, delta: float) -> str | None:
    """The warning for ``agent`` when most of its cross rows were outside the window in
    ``WARN_AFTER_STEPS`` consecutive steps of ``steps_metrics`` (in step order), else None."""
    run: list[float] = []
    for metrics in steps_metrics:
        used = shared_rows_used(metrics)
        run = run + [1.0 - used] if used is not None and 1.0 - used > CLIPPED_MAJORITY else []
        if len(run) >= WARN_AFTER_STEPS:
            outside = sum(run) / len(run)
            return (
                f"{agent}: {outside:.0%} of the rows shared by other agents fell outside HACPO's clipping window "
                f"[{1 - delta:g}, 1] in {len(run)} consecutive steps, so they add almost no gradient. Likely causes: "
                "responses of only a few tokens (the per-token mean ratio is noisy), very different tokenizers, "
                "or agents whose policies diverged (about 0.2 nats/token of KL between them is enough). Knobs: "
                "algorithm.delta widens the window, algorithm.alpha weights rows inside it; see docs/algorithm.md, "
                "'When does sharing help?'."
            )
    return None


def format_share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"
