"""Non-finite training never wins: a NaN or inf never reaches published weights or a checkpoint.

A non-finite loss or gradient norm skips that optimizer update (``run_updates`` counts it in
``learner/skipped_updates`` and logs it); weights are checked before every publish and checkpoint,
and non-finite ones stop the learner (it restarts from its last checkpoint, which is therefore
always finite; pruning only ever removes older ones).
"""

from __future__ import annotations

import math

import torch


class NonFiniteWeightsError(RuntimeError):
    """The policy's weights hold NaN or inf values: nothing is published or checkpointed."""


def is_finite(value: float | torch.Tensor) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all())
    return math.isfinite(value)


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters that hold any NaN or inf."""
    return [name for name, parameter in model.named_parameters() if not bool(torch.isfinite(parameter).all())]


def ensure_finite_weights(model: torch.nn.Module, agent: str, what: str) -> None:
    """Raise ``NonFiniteWeightsError`` naming the parameters when ``model`` is not finite."""
    bad = nonfinite_parameters(model)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteWeightsError(
            f"learner {agent}: weights hold NaN/inf values ({shown}); refusing to {what}. The last checkpoint "
            "is unchanged and the learner restarts from it; if this repeats, lower learner.lr or check the data."
        )
