"""Fixtures shared by every suite: one real SeaweedFS S3 server per test session."""

from tests.support.seaweed_fixtures import seaweed_server, seaweedfs  # noqa: F401
