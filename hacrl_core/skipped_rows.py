"""Skipped dataset rows, in one shape for every place users look. Standard library only: the
operator reads these reports from heartbeats without importing the data readers.

Readers never raise on a bad row: they count it under a reason (``PromptSource.skipped``). A
``DatasetReport`` turns those counts into the lines `hacrl run`, the workers' logs and
`hacrl validate --data` print, the numbers the report and the metrics carry, and the JSON the
learner's progress heartbeat hands to the operator (which raises a condition when a large share
of a dataset is skipped). Reading datasets lives in ``hacrl_core.data.report``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Why a reader drops a row, as users read it in logs, reports and `hacrl validate --data`.
SKIP_REASONS = {
    "non_utf8": "text that is not valid UTF-8",
    "invalid_json": "a line that is not valid JSON",
    "not_object": "a row that is not a JSON object",
    "missing_prompt": "no value under the prompt key (check promptKey)",
    "missing_answer": "no value under the answer key (check answerKey)",
    "bad_prompt": "a prompt that is neither text nor a chat message list",
    "bad_answer": "an answer that is neither text nor a finite number",
    "empty_prompt": "an empty prompt",
    "empty_answer": "an empty answer",
    "too_long": "a prompt or answer longer than any model context",
    "invalid_gold": "a gold answer the spec's reward cannot verify (check data.reward)",
}


#: A dataset that loses at least this share of its rows is worth a warning on the cluster.
LARGE_SKIPPED_SHARE = 0.1


@dataclass(frozen=True)
class DatasetReport:
    """One dataset of a spec: where it is configured, what it is, rows kept and skipped."""

    field: str  # the spec's field path: "data.train", "data.eval[arith]"
    name: str  # the source's name (file name or built-in URI)
    rows: int  # usable rows
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # reason -> rows dropped
    first_row: dict[str, int] = dataclasses.field(
        default_factory=dict
    )  # reason -> 1-based row (jsonl: line) of its first drop
    digest: str = ""  # sha256 of the rows kept, in order (read_datasets sets it: what `--resume` compares)

    @property
    def metric_prefix(self) -> str:
        """``data/train`` or ``data/eval/<name>``: the metric namespace of this dataset."""
        return self.field.replace(".", "/").replace("[", "/").rstrip("]")

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def skipped_share(self) -> float:
        read = self.rows + self.skipped_total
        return self.skipped_total / read if read else 0.0

    def lines(self) -> list[str]:
        """One line per skip reason (none when nothing was skipped)."""
        read = self.rows + self.skipped_total
        return [
            f"{self.field} ({self.name}): skipped {count} of {read} rows as {reason}: {SKIP_REASONS.get(reason, reason)}"
            + (f" (first at row {self.first_row[reason]})" if reason in self.first_row else "")
            for reason, count in sorted(self.skipped.items())
        ]

    def summary(self) -> str:
        """``data.train (rows.jsonl): 998 rows, 2 skipped (invalid_json 1, missing_answer 1)``."""
        if not self.skipped:
            return f"{self.field} ({self.name}): {self.rows} rows, none skipped"
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(self.skipped.items()))
        return f"{self.field} ({self.name}): {self.rows} rows, {self.skipped_total} skipped ({reasons})"

    def metrics(self) -> dict[str, float]:
        values = {
            f"{self.metric_prefix}/rows": float(self.rows),
            f"{self.metric_prefix}/skipped": float(self.skipped_total),
        }
        for reason, count in self.skipped.items():
            values[f"{self.metric_prefix}/skipped/{reason}"] = float(count)
        return values

    def as_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "name": self.name,
            "rows": self.rows,
            "skipped": dict(sorted(self.skipped.items())),
            "first_row": dict(sorted(self.first_row.items())),
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> DatasetReport:
        def counts(key: str) -> dict[str, int]:
            found = value.get(key)
            return {str(k): int(v) for k, v in found.items()} if isinstance(found, Mapping) else {}

        return cls(
            field=str(value.get("field", "data")),
            name=str(value.get("name", "")),
            rows=int(value.get("rows") or 0),
            skipped=counts("skipped"),
            first_row=counts("first_row"),
        )
