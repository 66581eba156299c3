"""Fixtures of the store suite: a real SeaweedFS S3 server and a store per backend."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

# `tests.support` must import under plain `pytest` too, which puts only this directory on
# sys.path (it has no __init__.py); `python -m pytest` adds the repo root itself.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from hacrl_core.store import ObjectStore, open_object_store  # noqa: E402 (the path set up above first)
from tests.support.seaweed_fixtures import seaweed_server, seaweedfs  # noqa: E402, F401 (fixtures)

# Few tries so that tests of failures stay quick; the default is tested for its value.
FAST_ATTEMPTS = 3

_AWS_ENV_TO_CLEAR = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)


@pytest.fixture
def s3_env(
    seaweedfs: tuple[str, str, dict[str, str]],  # noqa: F811 (the imported fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    """Point this test's environment at the SeaweedFS server; returns the variables set."""
    _endpoint, _bucket, env = seaweedfs
    for name in _AWS_ENV_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty store on each backend: a tmp dir, or a fresh prefix in the SeaweedFS bucket."""
    if request.param == "file":
        return open_object_store((tmp_path / "store").as_uri())
    _endpoint, bucket, _env = request.getfixturevalue("seaweedfs")
    request.getfixturevalue("s3_env")
    return open_object_store(f"s3://{bucket}/t-{uuid.uuid4().hex[:12]}", attempts=FAST_ATTEMPTS)
