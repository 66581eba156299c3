"""hacrl_core.models.directories: a directory appears whole or not at all, and a lost race is fine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hacrl_core.models.directories import build_once, replace_directory


def _write(text: str):
    def write(directory: Path) -> None:
        (directory / "weights").write_text(text)
        (directory / "done").write_text("")

    return write


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_build_once_builds_then_reuses(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model"
    assert build_once(target, _write("first"), marker="done") == target
    assert build_once(target, _write("second"), marker="done") == target
    assert (target / "weights").read_text() == "first"
    assert _siblings(target) == ["model"]  # no temporary directory left behind


def test_build_once_keeps_a_concurrent_winner(tmp_path: Path) -> None:
    target = tmp_path / "model"

    def lose_the_race(directory: Path) -> None:
        _write("mine")(directory)
        _write("winner")(target.parent / "winner")
        os.rename(target.parent / "winner", target)  # another process renames first

    (tmp_path / "winner").mkdir()
    assert build_once(target, lose_the_race, marker="done") == target
    assert (target / "weights").read_text() == "winner"
    assert _siblings(target) == ["model"]


def test_build_once_raises_when_the_target_is_there_but_incomplete(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "junk").write_text("")
    with pytest.raises(OSError):
        build_once(target, _write("mine"), marker="done")
    assert _siblings(target) == ["model"]


def test_a_failed_or_incomplete_build_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "model"

    def fail(directory: Path) -> None:
        (directory / "half").write_text("")
        raise RuntimeError("out of disk")

    with pytest.raises(RuntimeError, match="out of disk"):
        build_once(target, fail, marker="done")
    with pytest.raises(RuntimeError, match="wrote no done"):
        build_once(target, lambda directory: None, marker="done")
    assert list(tmp_path.iterdir()) == []


def test_replace_directory_swaps_the_contents(tmp_path: Path) -> None:
    target = tmp_path / "policy"
    replace_directory(target, _write("step 1"))
    (target / "stale").write_text("")
    assert replace_directory(target, _write("step 2")) == target
    assert sorted(p.name for p in target.iterdir()) == ["done", "weights"]
    assert (target / "weights").read_text() == "step 2"
    assert _siblings(target) == ["policy"]


def test_replace_directory_keeps_the_old_one_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "policy"
    replace_directory(target, _write("step 1"))

    def fail(directory: Path) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        replace_directory(target, fail)
    assert (target / "weights").read_text() == "step 1"
    assert _siblings(target) == ["policy"]
