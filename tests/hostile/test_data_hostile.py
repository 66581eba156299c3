"""Hostile dataset rows: counted under a reason as docs/metrics.md promises, never a refusal of
the whole dataset with a message naming neither file nor row, and read with bounded memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.data import open_source
from hacrl_core.data.datasets import MAX_LINE_BYTES

GOOD = b'{"prompt": "1+1", "answer": "2"}\n'

ROWS = [
    ("5000-digit-integer-answer", b'{"prompt": "1+1", "answer": ' + b"9" * 5000 + b"}\n", "invalid_json"),
    ("5000-digit-integer-key", b'{"prompt": "1+1", "answer": "2", "id": ' + b"1" * 5000 + b"}\n", "invalid_json"),
    ("line-over-the-bound", b'{"prompt": "' + b"a" * (MAX_LINE_BYTES + 10) + b'", "answer": "2"}\n', "too_long"),
    ("unterminated-last-line-over-the-bound", b'{"prompt": "' + b"a" * (MAX_LINE_BYTES + 10), "too_long"),
    ("nan-answer", b'{"prompt": "1+1", "answer": NaN}\n', "bad_answer"),
    ("nested-thousands-deep", b"[" * 100_000 + b"]" * 100_000 + b"\n", "invalid_json"),
]


@pytest.mark.parametrize("case, row, reason", ROWS, ids=[r[0] for r in ROWS])
def test_a_hostile_row_is_one_counted_skip(case: str, row: bytes, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(GOOD + GOOD + row)  # the hostile row last: an unterminated one must be
    source = open_source(str(path))
    assert len(source) == 2
    assert source.skipped == {reason: 1}


def test_a_long_line_is_not_held_in_memory(tmp_path: Path) -> None:
    """A 200 MB single-line row raised the reader's peak memory by several times its size."""
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as handle:
        handle.write(GOOD)
        handle.write(b'{"prompt": "')
        chunk = b"a" * (1 << 20)
        for _ in range(200):
            handle.write(chunk)
        handle.write(b'", "answer": "2"}\n')
    # VmHWM, the peak of this process's own memory map: getrusage's ru_maxrss survives exec, so a
    # child of a large pytest process would report the parent's size (478 MiB late in the suite).
    probe = (
        "import re, sys; from pathlib import Path; from hacrl_core.data import open_source; source = open_source(sys.argv[1]); "
        "print(source.skipped, int(re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text()).group(1)) // 1024)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=300, check=True
    )
    skipped, peak_mib = done.stdout.rsplit(" ", 1)
    assert skipped == "{'too_long': 1}"
    assert int(peak_mib) < 150, f"the reader peaked at {peak_mib} MiB reading a 200 MiB line"


def test_prompts_longer_than_the_model_context_are_said_at_validation(finished, model_cache, tmp_path) -> None:
    """Issue 35, 10: `hacrl validate --data` names the dataset, the agent and the context."""
    import copy

    import yaml

    from hacrl_core.models.uri import resolve_model
    from tests.hostile.harness import check, run_cli

    document = copy.deepcopy(finished["document"])
    llama = document["spec"]["agents"][0]
    llama["model"] = str(
        resolve_model(llama["model"], model_cache / "models")
    )  # built by the finished run: a local folder
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1", "answer": "2"}\n' + '{"prompt": "%s", "answer": "2"}\n' % ("1+" * 400 + "1"))
    document["spec"]["data"]["train"] = {"source": str(rows)}
    document["spec"]["algorithm"].update(promptsPerStep=2, miniBatchPrompts=2)  # both rows fill a step
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    outcome = run_cli(["validate", "--data", str(spec)])
    check(
        "data",
        outcome,
        0,
        "warning: spec.data.train: 1 of its 2 longest prompts",
        "agent 'llama'",
        "context of 512 tokens",
    )
    assert "agent 'qwen'" not in outcome.output  # a hub or tiny:// model is checked by `hacrl run`, once fetched


@pytest.mark.parametrize("command", [["validate", "--data"], ["run", "--quiet"]])
def test_a_training_set_smaller_than_a_step_is_refused_naming_both_fields(command, tmp_path, model_cache, monkeypatch):
    """Issue 43, 6: one row with promptsPerStep 2 gave two rows with the same (prompt uid, sample
    index), against the store's "each row once"."""
    from tests.hostile.harness import check, run_cli
    from tests.integration.runs import tiny_spec, write_spec

    rows = tmp_path / "one.jsonl"
    rows.write_text('{"prompt": "1+1", "answer": "2"}\n')
    document = tiny_spec("too-small", (tmp_path / "store").as_uri(), steps=1)
    document["spec"]["data"]["train"] = {"source": str(rows)}
    document["spec"]["algorithm"].update(promptsPerStep=2, miniBatchPrompts=2)
    spec = write_spec(tmp_path, document)
    monkeypatch.setenv("HACRL_CACHE", str(model_cache))
    outcome = run_cli(
        [command[0], *command[1:], str(spec), *(["--workdir", str(tmp_path / "work")] if command[0] == "run" else [])],
        cwd=tmp_path,
    )
    check(
        "data",
        outcome,
        1,
        "spec.data.train (one.jsonl): 1 usable rows, fewer than spec.algorithm.promptsPerStep (2)",
        "lower promptsPerStep to 1",
    )
    assert not (tmp_path / "store" / "too-small").exists(), "refused before the store is claimed"


def test_a_named_pipe_as_a_dataset_is_called_one_without_being_opened(tmp_path):
    """Issue 43, 11: it was reported as "no such file"; opening it would wait for a writer."""
    import os

    from tests.hostile.harness import check, run_cli
    from tests.integration.runs import tiny_spec, write_spec

    os.mkfifo(tmp_path / "rows.jsonl")
    document = tiny_spec("piped", (tmp_path / "store").as_uri(), steps=1)
    document["spec"]["data"]["train"] = {"source": str(tmp_path / "rows.jsonl")}
    check(
        "data",
        run_cli(["validate", "--data", str(write_spec(tmp_path, document))]),
        1,
        "spec.data.train.source",
        "rows.jsonl",
        "a named pipe (FIFO), not a file",
    )
