"""pytest fixtures around ``seaweed.start_seaweedfs``, for any suite's conftest to import.

    # tests/<suite>/conftest.py (or tests/conftest.py, to share one server across suites)
    from tests.support.seaweed_fixtures import seaweed_server, seaweedfs  # noqa: F401

Each conftest that imports them gets its own session-scoped server; import them once in
``tests/conftest.py`` to run a single server for the whole session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.seaweed import SeaweedS3, start_seaweedfs


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real SeaweedFS (``weed mini``) on 127.0.0.1 with one bucket, for the whole session."""
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweedfs(seaweed_server: SeaweedS3) -> tuple[str, str, dict[str, str]]:
    """(endpoint, bucket, env): env holds HACRL_S3_ENDPOINT, AWS_ACCESS_KEY_ID, ... for it."""
    return seaweed_server.endpoint, seaweed_server.bucket, seaweed_server.env()
