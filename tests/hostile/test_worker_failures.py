"""Which errors a worker ends with one line and which exit code (hacrl_core/runtime/worker_failures.py),
on errors raised for real: a store write under a file, a write to a full device."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacrl_core.runtime.worker_failures import FINAL_EXIT_CODE, MARK, failure_line, known_failure
from hacrl_core.store.file_store import FileObjectStore


def raised(action) -> BaseException:
    with pytest.raises(BaseException) as caught:
        action()
    return caught.value


def test_a_folder_of_the_store_replaced_by_a_file_is_final_naming_the_path(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "store")
    store.put("run/steps/000000/metrics/llama.json", b"{}")
    (tmp_path / "store" / "run" / "steps" / "000000" / "metrics" / "llama.json").unlink()
    (tmp_path / "store" / "run" / "steps" / "000000" / "metrics").rmdir()
    (tmp_path / "store" / "run" / "steps" / "000000" / "metrics").write_text("a file")
    code, line = known_failure(raised(lambda: store.put("run/steps/000000/metrics/llama.json", b"{}")))
    assert code == FINAL_EXIT_CODE
    assert "steps/000000/metrics" in line and "a file stands where a folder belongs" in line


def test_a_step_folder_replaced_by_a_file_is_final_naming_it(tmp_path: Path) -> None:
    """Issue 43, 9: ``NotADirectoryError`` in a traceback, restarted into the same error."""
    import shutil

    store = FileObjectStore(tmp_path / "store")
    store.put("run/steps/000000/rollouts/llama.parquet", b"x")
    shutil.rmtree(tmp_path / "store" / "run" / "steps" / "000000")
    (tmp_path / "store" / "run" / "steps" / "000000").write_text("a file")
    code, line = known_failure(raised(lambda: store.put("run/steps/000000/rollouts/llama.parquet", b"x")))
    assert code == FINAL_EXIT_CODE
    assert "steps/000000/rollouts: Not a directory" in line and "a file stands where a folder belongs" in line


def test_a_full_disk_is_final_and_says_to_free_space() -> None:
    def write_to_full() -> None:
        with open("/dev/full", "wb") as device:
            device.write(b"x" * 10)
            device.flush()

    code, line = known_failure(raised(write_to_full))
    assert code == FINAL_EXIT_CODE and "No space left on device" in line and "free space" in line


def test_an_unknown_error_is_left_to_the_last_resort_handler_with_its_traceback() -> None:
    assert known_failure(ZeroDivisionError("x")) is None
    assert known_failure(FileNotFoundError(2, "No such file or directory", "x")) is None


def test_the_supervisor_reads_the_last_marked_line_without_the_logger_prefix() -> None:
    log = f"2026-01-01 INFO started\n2026-01-01 ERROR {MARK}first\nnoise\n2026-01-01 ERROR {MARK}the one\nWarning: at exit\n"
    assert failure_line(log) == "the one"
    assert failure_line("no mark here\n") is None
