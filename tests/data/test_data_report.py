"""What a spec's datasets kept and skipped: the lines, numbers and JSON users see everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacrl_core.data import open_source
from hacrl_core.data.base import PromptSource
from hacrl_core.data.report import DatasetReport, describe_source, read_datasets
from hacrl_core.skipped_rows import SKIP_REASONS
from hacrl_core.spec import parse_experiment

REPO = Path(__file__).resolve().parents[2]


def broken_jsonl(path: Path, good: int = 8) -> Path:
    """``good`` usable rows, then one line that is not JSON and one row without an answer."""
    lines = [json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) for i in range(good)]
    lines += ['{"prompt": "7 + 1 =", "answer": ', json.dumps({"prompt": "9 + 1 ="})]
    path.write_text("\n".join(lines) + "\n")
    return path


def spec_with_train(tmp_path: Path, source: str) -> Path:
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["spec"]["data"]["train"] = {"source": source}
    # the 8 usable rows of broken_jsonl fill a step (validate --data refuses a set smaller than one)
    document["spec"]["algorithm"].update(promptsPerStep=8, miniBatchPrompts=8)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_report_names_the_field_each_reason_its_count_and_first_row(tmp_path: Path) -> None:
    source = open_source(str(broken_jsonl(tmp_path / "train.jsonl")))
    report = describe_source("data.train", source)
    assert (report.rows, report.skipped, report.first_row) == (
        8,
        {"invalid_json": 1, "missing_answer": 1},
        {"invalid_json": 9, "missing_answer": 10},
    )
    assert report.skipped_share == pytest.approx(0.2)
    assert report.lines() == [
        "data.train (train.jsonl): skipped 1 of 10 rows as invalid_json: a line that is not valid JSON (first at row 9)",
        "data.train (train.jsonl): skipped 1 of 10 rows as missing_answer: no value under the answer key (check answerKey) (first at row 10)",
    ]
    assert report.summary() == "data.train (train.jsonl): 8 rows, 2 skipped (invalid_json 1, missing_answer 1)"
    assert report.metrics() == {
        "data/train/rows": 8.0,
        "data/train/skipped": 2.0,
        "data/train/skipped/invalid_json": 1.0,
        "data/train/skipped/missing_answer": 1.0,
    }
    assert DatasetReport.from_dict(json.loads(json.dumps(report.as_dict()))) == report


def test_a_clean_dataset_says_so_and_eval_sets_have_their_own_metric_names() -> None:
    report = describe_source("data.eval[arith]", open_source("builtin://arithmetic?difficulty=1&size=50"))
    assert report.lines() == []
    assert report.summary().endswith(": 50 rows, none skipped")
    assert report.metrics() == {"data/eval/arith/rows": 50.0, "data/eval/arith/skipped": 0.0}


def test_every_skip_reason_has_an_explanation_and_unknown_reasons_are_refused() -> None:
    documented = (REPO / "hacrl_core/data/datasets.py").read_text().split('"""')[1]
    for reason in SKIP_REASONS:
        assert f"``{reason}``" in documented, f"{reason} is not in the datasets module's docstring"

    class Source(PromptSource):
        name = "x"

        def __len__(self) -> int:
            return 0

        def __getitem__(self, index: int):
            raise IndexError(index)

    with pytest.raises(ValueError, match="unknown skip reason 'typo'"):
        Source()._skip("typo")


def test_read_datasets_names_the_field_of_an_unusable_dataset(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"prompt": "no answer"}\n')
    experiment = parse_experiment(yaml.safe_load(spec_with_train(tmp_path, str(empty)).read_text()))
    with pytest.raises(
        ValueError,
        match=r"spec\.data\.train\.source: empty\.jsonl: no usable rows \(skipped: \{'missing_answer': 1\}\)",
    ):
        read_datasets(experiment.spec.data)


def test_hacrl_validate_data_counts_what_the_workers_would_skip(tmp_path: Path) -> None:
    spec = spec_with_train(tmp_path, str(broken_jsonl(tmp_path / "train.jsonl")))
    plain = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", str(spec)], capture_output=True, text=True
    )
    assert plain.returncode == 0 and "skipped" not in plain.stdout  # reading data is opt-in: it can be slow

    checked = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", "--data", str(spec)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    assert "data.train (train.jsonl): 8 rows, 2 skipped (invalid_json 1, missing_answer 1)" in checked.stdout
    assert "warning: data.train (train.jsonl): skipped 1 of 10 rows as invalid_json" in checked.stdout
    assert "data.eval[arithmetic] (builtin://arithmetic" in checked.stdout and "none skipped" in checked.stdout

    missing = spec_with_train(tmp_path, str(tmp_path / "nowhere.jsonl"))
    failed = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", "--data", str(missing)], capture_output=True, text=True
    )
    assert failed.returncode == 1
    assert "spec.data.train.source: data source" in failed.stderr and "no such file" in failed.stderr
