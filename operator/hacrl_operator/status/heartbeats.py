"""What the learners' progress heartbeats (`progress/<agent>.json` in the store) say: each agent's
numbers, and whether a dataset lost many rows to bad rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hacrl_core.skipped_rows import LARGE_SKIPPED_SHARE, DatasetReport
from hacrl_core.status import AgentProgress

Heartbeat = Mapping[str, Any]

# Heartbeat keys copied into ``agentProgress[]`` (the same names, snake_case, in the model).
_NUMBERS = (
    ("weights_version", int),
    ("reward", float),
    ("accuracy", float),
    ("capability", float),
    ("last_checkpoint", int),
)


def _number(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, bool):
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        return None


def agent_progress(name: str, heartbeat: Heartbeat | None, previous: AgentProgress | None, steps: int) -> AgentProgress:
    """One ``agentProgress`` entry: the heartbeat's numbers, else the previously reported ones."""
    entry = previous.model_copy() if previous is not None else AgentProgress(name=name)
    if not heartbeat:
        return entry
    step = _number(heartbeat.get("step"), int)
    if step is not None:
        entry.step = min(step, steps)
    if heartbeat.get("done") is True:
        entry.step = steps
    for field, kind in _NUMBERS:
        if field in heartbeat:
            value = _number(heartbeat.get(field), kind)
            if value is not None or field != "weights_version":
                setattr(entry, field, value)
    return entry


def data_rows_condition(progress: Mapping[str, Heartbeat | None]) -> tuple[bool, str, str] | None:
    """``DataRowsSkipped`` as (status, reason, message): True (worth a Warning) when a dataset lost
    a large share of its rows to bad rows, as the learners' heartbeats report it; None while no
    heartbeat reports its datasets."""
    reports: dict[str, DatasetReport] = {}
    for heartbeat in progress.values():
        data = (heartbeat or {}).get("data")
        if isinstance(data, list):
            for entry in data:
                if isinstance(entry, Mapping):
                    report = DatasetReport.from_dict(entry)
                    reports.setdefault(report.field, report)
    if not reports:
        return None
    large = [r for r in reports.values() if r.skipped_share >= LARGE_SKIPPED_SHARE]
    if large:
        message = "; ".join(f"{r.summary()}: {r.skipped_share:.0%} of its rows" for r in large)
        return True, "ManyRowsSkipped", message + "; run `hacrl validate --data` on the spec for the reasons"
    skipped = sum(r.skipped_total for r in reports.values())
    return False, "FewRowsSkipped" if skipped else "NoRowsSkipped", f"{skipped} rows skipped in all datasets"
