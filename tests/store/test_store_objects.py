"""The ObjectStore contract, run against both backends (file:// and a real SeaweedFS s3://)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacrl_core.store import (
    FileObjectStore,
    ObjectNotFound,
    ObjectStore,
    S3ObjectStore,
    open_object_store,
)
from hacrl_core.store.errors import StoreUnavailable
from hacrl_core.store.s3_store import resolve_endpoint, resolve_region


def test_put_get_exists(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert not store.exists("a/b.bin")
    store.put("a/b.bin", b"\x00\x01payload")
    assert store.exists("a/b.bin")
    assert store.get("a/b.bin") == b"\x00\x01payload"
    store.put("a/b.bin", b"replaced")
    assert store.get("a/b.bin") == b"replaced"
    store.put("empty", b"")
    assert store.get("empty") == b""


def test_get_missing_raises_object_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound, match="nope/x"):
        store.get("nope/x")
    assert not store.exists("nope/x")


def test_list_is_sorted_full_keys_by_string_prefix(store: ObjectStore) -> None:
    for key in ["exp/b/2", "exp/a/1", "exp/a/0", "exp10/a", "expx", "other/z"]:
        store.put(key, key.encode())
    assert store.list("exp/") == ["exp/a/0", "exp/a/1", "exp/b/2"]
    assert store.list("exp/a") == ["exp/a/0", "exp/a/1"]
    assert store.list("exp") == ["exp/a/0", "exp/a/1", "exp/b/2", "exp10/a", "expx"]
    assert store.list("") == ["exp/a/0", "exp/a/1", "exp/b/2", "exp10/a", "expx", "other/z"]
    assert store.list("missing/") == []


def test_delete_prefix_counts_and_spares_siblings(store: ObjectStore) -> None:
    for key in ["exp/a/0", "exp/a/1", "exp/b", "exp10/a"]:
        store.put(key, b"x")
    assert store.delete_prefix("exp/") == 3
    assert store.list("") == ["exp10/a"]
    assert store.delete_prefix("exp/") == 0
    with pytest.raises(ValueError, match="non-empty prefix"):
        store.delete_prefix("")


def test_delete_removes_exactly_one_key_and_ignores_a_missing_one(store: ObjectStore) -> None:
    for key in ["exp/a", "exp/ab", "exp/a.commit.json"]:
        store.put(key, b"x")
    store.delete("exp/a")
    assert store.list("") == ["exp/a.commit.json", "exp/ab"]  # keys it prefixes are spared
    store.delete("exp/a")
    store.delete("never/written")
    assert store.list("") == ["exp/a.commit.json", "exp/ab"]
    with pytest.raises(ValueError, match="key"):
        store.delete("")


@pytest.mark.parametrize("key", ["", "/abs", "trailing/", "a//b", "a/../b", "./a", "a\\b"])
def test_invalid_keys_are_rejected(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="key"):
        store.put(key, b"x")


def test_put_file_get_file_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(bytes(range(256)) * 1000)
    store.put_file("files/blob.bin", source)
    assert store.get("files/blob.bin") == source.read_bytes()
    dest = tmp_path / "out" / "nested" / "blob.bin"
    store.get_file("files/blob.bin", dest)
    assert dest.read_bytes() == source.read_bytes()
    with pytest.raises(ObjectNotFound):
        store.get_file("files/missing.bin", tmp_path / "never.bin")
    assert not (tmp_path / "never.bin").exists()


def test_file_store_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    for i in range(3):
        store.put("d/obj", f"v{i}".encode())
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["obj"]
    # An in-flight write (its temporary file) is invisible to readers.
    (tmp_path / "d" / ".obj.123.hacrl-tmp").write_bytes(b"partial")
    assert store.list("d/") == ["d/obj"]


def test_file_store_delete_prefix_prunes_empty_directories(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "root")
    store.put("exp/steps/000001/rollouts/a.parquet", b"x")
    store.put("keep/me", b"x")
    assert store.delete_prefix("exp/") == 1
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["keep"]


def test_open_object_store_uris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_object_store(tmp_path.as_uri()).root == tmp_path  # type: ignore[attr-defined]
    assert open_object_store(str(tmp_path / "p")).root == tmp_path / "p"  # type: ignore[attr-defined]
    assert open_object_store("file://./runs").root == tmp_path / "runs"  # type: ignore[attr-defined]
    s3 = open_object_store("s3://bucket/some/prefix/", endpoint="http://127.0.0.1:1")
    assert isinstance(s3, S3ObjectStore)
    assert (s3.bucket, s3.prefix, s3.endpoint) == ("bucket", "some/prefix", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"allowed: file://, s3://"):
        open_object_store("gs://bucket/x")
    with pytest.raises(ValueError, match="no bucket"):
        open_object_store("s3:///x")


def test_s3_endpoint_and_region_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HACRL_S3_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert resolve_endpoint() is None
    assert resolve_region() == "us-east-1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws-env:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert resolve_endpoint() == "http://aws-env:9000"
    assert resolve_region() == "eu-west-1"
    monkeypatch.setenv("HACRL_S3_ENDPOINT", "http://hacrl-env:9000")
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert resolve_endpoint() == "http://hacrl-env:9000"
    assert resolve_region() == "eu-central-1"
    assert resolve_endpoint("http://arg:1") == "http://arg:1"
    assert resolve_region("ap-south-1") == "ap-south-1"
    store = S3ObjectStore("b", "p")
    assert store.endpoint == "http://hacrl-env:9000"
    assert store.client.meta.region_name == "eu-central-1"
    assert store.client.meta.config.s3["addressing_style"] == "path"


def test_requests_are_retried_by_botocore_standard_mode_five_tries_by_default() -> None:
    assert S3ObjectStore("b", "p").client.meta.config.retries == {"total_max_attempts": 8, "mode": "standard"}
    assert S3ObjectStore("b", "p", attempts=2).client.meta.config.retries["total_max_attempts"] == 2
    with pytest.raises(ValueError, match="attempts"):
        S3ObjectStore("b", "p", attempts=0)


def test_a_body_that_breaks_off_while_read_is_fetched_again() -> None:
    """botocore retries requests, not the reading of a response body: get() does that itself."""
    import io

    from botocore.exceptions import IncompleteReadError

    class BrokenBody(io.BytesIO):
        def read(self, *_: object) -> bytes:
            raise IncompleteReadError(actual_bytes=2, expected_bytes=5)

    store = S3ObjectStore("b", "p", endpoint="http://127.0.0.1:1", attempts=2)
    bodies = [BrokenBody(), io.BytesIO(b"whole")]
    store.client.get_object = lambda **_: {"Body": bodies.pop(0)}
    assert store.get("k") == b"whole"
    assert store.retries == 1
    store.client.get_object = lambda **_: {"Body": BrokenBody()}
    with pytest.raises(StoreUnavailable, match="after 2 attempts"):
        store.get("k")
    assert store.retries == 2
