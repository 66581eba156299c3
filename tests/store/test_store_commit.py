"""Committed objects and directories: visible only when complete, verified on read."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hacrl_core.store import (
    CorruptObject,
    ObjectStore,
    dir_committed,
    get_committed,
    get_dir,
    is_committed,
    list_committed_dirs,
    put_committed,
    put_dir,
)


def test_committed_round_trip_writes_data_then_marker(store: ObjectStore) -> None:
    put_committed(store, "x/data.bin", b"hello")
    assert store.list("x/") == ["x/data.bin", "x/data.bin.commit.json"]
    marker = json.loads(store.get("x/data.bin.commit.json"))
    assert marker == {
        "size": 5,
        "sha256": "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
    }
    assert is_committed(store, "x/data.bin")
    assert get_committed(store, "x/data.bin") == b"hello"


def test_data_without_marker_is_never_read(store: ObjectStore) -> None:
    store.put("x/partial.bin", b"written but not committed")
    assert not is_committed(store, "x/partial.bin")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"x/partial\.bin"):
        get_committed(store, "x/partial.bin", wait=0.3, poll=0.05)
    assert time.monotonic() - started >= 0.3


def test_waiting_reader_gets_the_object_once_committed(store: ObjectStore) -> None:
    writer = threading.Timer(0.2, put_committed, args=(store, "x/late.bin", b"late"))
    writer.start()
    try:
        assert get_committed(store, "x/late.bin", wait=10, poll=0.02) == b"late"
    finally:
        writer.join()


@pytest.mark.parametrize("corrupt", [b"hellO", b"hello!", b""], ids=["same-size", "longer", "empty"])
def test_data_changed_after_commit_is_corrupt(store: ObjectStore, corrupt: bytes) -> None:
    put_committed(store, "x/data.bin", b"hello")
    store.put("x/data.bin", corrupt)
    with pytest.raises(CorruptObject, match="does not match its commit marker"):
        get_committed(store, "x/data.bin", wait=1)


def test_marker_without_data_is_corrupt(store: ObjectStore) -> None:
    put_committed(store, "x/data.bin", b"hello")
    store.delete_prefix("x/data.bin")
    store.put("x/data.bin.commit.json", json.dumps({"size": 5, "sha256": "0" * 64}).encode())
    with pytest.raises(CorruptObject, match="missing"):
        get_committed(store, "x/data.bin")


def test_rewrite_replaces_data_and_marker(store: ObjectStore) -> None:
    put_committed(store, "x/data.bin", b"first")
    put_committed(store, "x/data.bin", b"second version")
    assert store.list("x/") == ["x/data.bin", "x/data.bin.commit.json"]
    assert get_committed(store, "x/data.bin") == b"second version"


class _Recording:
    """An ObjectStore that forwards to ``inner`` and records the name of every call."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)

        return call


def test_rewrite_hides_the_marker_with_one_delete_before_the_data(store: ObjectStore) -> None:
    put_committed(store, "x/data.bin", b"first")
    recording = _Recording(store)
    put_committed(recording, "x/data.bin", b"second")
    # One DELETE of the marker key, no LIST (delete_prefix would need one), then data, marker.
    assert recording.calls == ["delete", "put", "put"]
    assert get_committed(store, "x/data.bin") == b"second"


def _make_dir(root: Path) -> dict[str, bytes]:
    files = {
        "config.json": b'{"hidden_size": 8}',
        "model.safetensors": bytes(range(256)) * 64,
        "tokenizer/vocab.txt": "héllo\nwörld\n".encode(),
        "empty.txt": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_put_dir_get_dir_round_trip_with_manifest(store: ObjectStore, tmp_path: Path) -> None:
    files = _make_dir(tmp_path / "src")
    manifest = put_dir(store, "w/agent/000001", tmp_path / "src")
    assert [e["path"] for e in manifest["files"]] == sorted(files)
    assert store.list("w/agent/000001/") == sorted(
        [f"w/agent/000001/{rel}" for rel in files] + ["w/agent/000001/_COMMIT.json"]
    )
    assert json.loads(store.get("w/agent/000001/_COMMIT.json")) == manifest
    assert dir_committed(store, "w/agent/000001")
    fetched = get_dir(store, "w/agent/000001", tmp_path / "dst")
    assert fetched == manifest
    for rel, data in files.items():
        assert (tmp_path / "dst" / rel).read_bytes() == data
    assert sorted(
        p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*") if p.is_file()
    ) == sorted(files)


def test_get_dir_waits_for_the_manifest(store: ObjectStore, tmp_path: Path) -> None:
    _make_dir(tmp_path / "src")
    store.put("w/agent/000002/config.json", b"{}")  # a publish that has not finished
    assert not dir_committed(store, "w/agent/000002")
    with pytest.raises(TimeoutError, match="w/agent/000002"):
        get_dir(store, "w/agent/000002", tmp_path / "dst", wait=0.2)
    assert not (tmp_path / "dst").exists()


def test_get_dir_rejects_a_corrupt_file_and_leaves_nothing_behind(store: ObjectStore, tmp_path: Path) -> None:
    _make_dir(tmp_path / "src")
    put_dir(store, "w/agent/000003", tmp_path / "src")
    store.put("w/agent/000003/config.json", b'{"hidden_size": 9}')
    with pytest.raises(CorruptObject, match="config.json"):
        get_dir(store, "w/agent/000003", tmp_path / "dst")
    assert not (tmp_path / "dst" / "config.json").exists()
    assert not [p for p in (tmp_path / "dst").rglob("*") if "hacrl-tmp" in p.name]


def test_republishing_a_dir_drops_stale_files(store: ObjectStore, tmp_path: Path) -> None:
    _make_dir(tmp_path / "src")
    put_dir(store, "w/agent/000004", tmp_path / "src")
    (tmp_path / "src" / "model.safetensors").unlink()
    put_dir(store, "w/agent/000004", tmp_path / "src")
    assert "w/agent/000004/model.safetensors" not in store.list("w/agent/000004/")
    get_dir(store, "w/agent/000004", tmp_path / "dst")
    assert not (tmp_path / "dst" / "model.safetensors").exists()


def test_list_committed_dirs_ignores_uncommitted_children(store: ObjectStore, tmp_path: Path) -> None:
    _make_dir(tmp_path / "src")
    put_dir(store, "w/agent/000001", tmp_path / "src")
    put_dir(store, "w/agent/000005", tmp_path / "src")
    store.put("w/agent/000009/model.safetensors", b"half-uploaded")
    store.put("w/agent/000007/nested/_COMMIT.json", b"{}")  # not a child manifest
    assert list_committed_dirs(store, "w/agent") == ["000001", "000005"]
    assert list_committed_dirs(store, "w/agent/") == ["000001", "000005"]
    assert list_committed_dirs(store, "w/other") == []


def test_readers_racing_a_rewriter_see_whole_versions_only(store: ObjectStore) -> None:
    """Regression: a reader that pairs the old marker with the new data must wait, not fail."""
    versions = [b"a" * 10, b"b" * 20_000, b"c" * 3]
    put_committed(store, "race/obj", versions[0])
    stop = threading.Event()

    def rewrite() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            put_committed(store, "race/obj", versions[i % len(versions)])

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        deadline = time.monotonic() + 0.6
        reads = 0
        while time.monotonic() < deadline:
            assert get_committed(store, "race/obj", wait=5, poll=0.001) in versions
            reads += 1
    finally:
        stop.set()
        writer.join()
    assert reads > 0
