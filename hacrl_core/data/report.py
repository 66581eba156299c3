"""Reading a spec's datasets and reporting what each kept and skipped (``DatasetReport``, in
``hacrl_core.skipped_rows`` so that the operator reads heartbeats without the data readers)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from hacrl_core.data.base import PromptSource
from hacrl_core.data.datasets import open_source
from hacrl_core.rewards.remote import is_reward_url
from hacrl_core.skipped_rows import DatasetReport

__all__ = [
    "DatasetReport",
    "describe_source",
    "open_dataset",
    "read_datasets",
    "rows_digest",
    "spec_datasets",
    "train_set_refusal",
]


def describe_source(field_path: str, source: PromptSource, digest: str = "") -> DatasetReport:
    first_row = {reason: position + 1 for reason, position in source.first_skipped.items()}
    return DatasetReport(
        field=field_path,
        name=source.name,
        rows=len(source),
        skipped=dict(source.skipped),
        first_row=first_row,
        digest=digest,
    )


def rows_digest(source: PromptSource) -> str:
    """sha256 of every row ``source`` gives (uid, question, answer), in order: what a run trained on,
    whatever the file is called (a dataset replaced under the same path changes it)."""
    digest = hashlib.sha256()
    for problem in source:
        digest.update(json.dumps([problem.uid, problem.question, problem.answer]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def spec_datasets(data_spec) -> Iterator[tuple[str, Any]]:
    """``(field path, DataSource)`` of the training set and every eval set of ``spec.data``."""
    yield "data.train", data_spec.train
    for eval_set in data_spec.eval:
        yield f"data.eval[{eval_set.name}]", eval_set


def open_dataset(data_spec, dataset) -> PromptSource:
    """The ``PromptSource`` of one ``DataSource`` of ``spec.data`` (keys and reward applied)."""
    return open_source(
        dataset.source,
        prompt_key=dataset.prompt_key,
        answer_key=dataset.answer_key,
        reward=None if is_reward_url(data_spec.reward) else data_spec.reward,
    )  # a reward server checks its own golds


def read_datasets(data_spec) -> list[DatasetReport]:
    """Open every dataset of ``spec.data`` and report it; ``ValueError`` names the field of a
    dataset that cannot be read or has no usable row."""
    reports = []
    for field_path, dataset in spec_datasets(data_spec):
        try:
            source = open_dataset(data_spec, dataset)
        except (ValueError, OSError) as error:
            raise ValueError(f"spec.{field_path}.source: {error}") from None
        reports.append(describe_source(field_path, source, rows_digest(source)))
    return reports


def train_set_refusal(reports: list[DatasetReport], prompts_per_step: int) -> str | None:
    """Why the training set cannot fill a step, or None. A step of ``promptsPerStep`` prompts is
    drawn from one pass over the rows, so with fewer rows a step held one prompt twice: two rows
    with the same (prompt uid, sample index), which the store keeps once."""
    train = next((report for report in reports if report.field == "data.train"), None)
    if train is None or train.rows >= prompts_per_step:
        return None
    return (
        f"spec.data.train ({train.name}): {train.rows} usable rows, fewer than spec.algorithm.promptsPerStep "
        f"({prompts_per_step}), so a step would hold a prompt twice: add rows, or lower promptsPerStep to {train.rows}"
    )
