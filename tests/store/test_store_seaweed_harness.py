"""The SeaweedFS harness says when the disk, not the code, is why S3 fails.

A CI run once failed 73 tests with timeouts and HTTP 500s from a server that had started on a
disk 96% full: weed mini sizes its volumes from the free space and, with none left, serves no
writes and says nothing on the S3 API. The free space is the operating system's answer, so
it is the one thing replaced here.
"""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from tests.support import seaweed

Usage = namedtuple("Usage", "total used free")


def test_a_nearly_full_disk_is_refused_before_starting_naming_the_disk_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seaweed.shutil, "disk_usage", lambda path: Usage(10 << 30, (10 << 30) - (40 << 20), 40 << 20))
    with pytest.raises(RuntimeError) as caught:
        seaweed.start_seaweedfs(tmp_path / "s3")
    message = str(caught.value)
    assert "has 40 MiB free" in message and str(tmp_path / "s3") in message
    assert "free disk space" in message and "pytest-of-" in message
    assert not (tmp_path / "s3" / "weed.log").exists(), "no server should have been started"


def test_the_free_space_note_names_the_path_and_its_free_mebibytes(tmp_path: Path) -> None:
    free_mib = shutil.disk_usage(tmp_path).free >> 20
    note = seaweed.disk_free_note(tmp_path)
    assert note.startswith(f"the disk holding {tmp_path} has ")
    # the disk may change by a few MiB between the two reads
    assert abs(int(note.split(" has ")[1].split(" MiB")[0]) - free_mib) < 64
