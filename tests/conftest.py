"""Fixtures shared by every suite: one real SeaweedFS S3 server and one tiny-model cache per test session."""

import os
from pathlib import Path

import pytest

from tests.support.seaweed_fixtures import seaweed_server, seaweedfs  # noqa: F401


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HACRL_CACHE shared by every `hacrl run` of the session (end-to-end and reliability suites): the
    tiny models are built once.

    HACRL_TEST_MODEL_CACHE names a persistent one instead (a developer's re-runs skip the build).
    """
    override = os.environ.get("HACRL_TEST_MODEL_CACHE")
    return Path(override) if override else tmp_path_factory.mktemp("model-cache")
