"""S3 backend against a real SeaweedFS: retries, and errors that name the endpoint and bucket.

Failures are injected at the boto3 edge: a botocore ``before-send`` hook answers the request
itself (an HTTP 503 SlowDown) or raises a connection error, before anything reaches the wire.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError

from hacrl_core.store import (
    ObjectNotFound,
    S3ObjectStore,
    StoreUnavailable,
)
from tests.support.seaweed import closed_port

FAST_ATTEMPTS = 3

SLOW_DOWN = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Any:
        yield self._data


def _slow_down(request: Any) -> AWSResponse:
    return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Body(SLOW_DOWN))


def _connection_refused(request: Any) -> AWSResponse:
    raise EndpointConnectionError(endpoint_url=request.url)


class FailFirst:
    """before-send hook: the first calls fail with ``failures`` in order, then pass through."""

    def __init__(self, *failures: Callable[[Any], AWSResponse]) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        self.calls += 1
        if self.failures:
            return self.failures.pop(0)(request)
        return None


class CountRequests:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, **_: Any) -> None:
        self.calls += 1


@pytest.fixture
def s3_store(seaweedfs: tuple[str, str, dict[str, str]], s3_env: dict[str, str]) -> S3ObjectStore:
    _endpoint, bucket, _env = seaweedfs
    return S3ObjectStore(bucket, f"t-{uuid.uuid4().hex[:12]}", attempts=FAST_ATTEMPTS)


def test_transient_errors_are_retried_until_success(s3_store: S3ObjectStore, seaweed_server: Any) -> None:
    hook = FailFirst(_slow_down, _connection_refused)
    s3_store.client.meta.events.register("before-send.s3.PutObject", hook)
    s3_store.put("retry/obj", b"made it")
    assert hook.calls == 3
    assert s3_store.retries == 2
    stored = seaweed_server.client().get_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/retry/obj")
    assert stored["Body"].read() == b"made it"

    get_hook = FailFirst(_connection_refused, _slow_down)
    s3_store.client.meta.events.register("before-send.s3.GetObject", get_hook)
    assert s3_store.get("retry/obj") == b"made it"
    assert s3_store.retries == 4


def test_persistent_5xx_gives_store_unavailable_after_the_last_attempt(
    s3_store: S3ObjectStore,
) -> None:
    hook = FailFirst(*[_slow_down] * 10)
    s3_store.client.meta.events.register("before-send.s3.ListObjectsV2", hook)
    with pytest.raises(StoreUnavailable, match=r"SlowDown \(HTTP 503\).*after 3 attempts") as info:
        s3_store.list("x/")
    assert s3_store.bucket in str(info.value)
    assert s3_store.endpoint in str(info.value)
    assert hook.calls == 3
    assert s3_store.retries == 2


def test_missing_bucket_is_not_retried_and_says_create_it(
    seaweedfs: tuple[str, str, dict[str, str]], s3_env: dict[str, str]
) -> None:
    endpoint, _bucket, _env = seaweedfs
    store = S3ObjectStore("hacrl-no-such-bucket", "p", attempts=FAST_ATTEMPTS)
    requests = CountRequests()
    store.client.meta.events.register("before-send.s3", requests)
    for operation in (
        lambda: store.get("k"),
        lambda: store.list(""),
        lambda: store.exists("k"),
        lambda: store.put("k", b"x"),
    ):
        with pytest.raises(StoreUnavailable, match="'hacrl-no-such-bucket'.*create the bucket") as info:
            operation()
        assert endpoint in str(info.value)
    assert store.retries == 0
    assert requests.calls == 5  # get, list, exists (HEAD object + HEAD bucket), put: one try each


def test_refused_credentials_are_not_retried_and_never_echoed(
    seaweedfs: tuple[str, str, dict[str, str]],
    s3_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _endpoint, bucket, _env = seaweedfs
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-do-not-print")
    store = S3ObjectStore(bucket, "p", attempts=FAST_ATTEMPTS)
    with pytest.raises(StoreUnavailable, match=f"access denied .*'{bucket}'.*AWS_SECRET_ACCESS_KEY") as info:
        store.get("k")
    assert "wrong-secret-do-not-print" not in str(info.value)
    assert store.retries == 0


def test_unreachable_endpoint_fails_fast_naming_the_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    endpoint = f"http://127.0.0.1:{closed_port()}"
    store = S3ObjectStore(
        "some-bucket",
        endpoint=endpoint,
        attempts=4,
        connect_timeout=1.0,
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="HACRL_S3_ENDPOINT") as info:
        store.get("k")
    assert time.monotonic() - started < 5
    assert endpoint in str(info.value)
    assert "'some-bucket'" in str(info.value)
    assert store.retries == 3


def test_missing_key_is_object_not_found_not_unavailable(s3_store: S3ObjectStore, tmp_path: Any) -> None:
    with pytest.raises(ObjectNotFound):
        s3_store.get("absent")
    with pytest.raises(ObjectNotFound):
        s3_store.get_file("absent", tmp_path / "absent")
    assert s3_store.exists("absent") is False
    assert s3_store.retries == 0


def test_a_skewed_clock_is_reported_as_clock_skew_not_access_denied(
    seaweedfs: tuple[str, str, dict[str, str]],
    s3_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node whose clock is an hour off signs requests the server refuses (RequestTimeTooSkewed,
    HTTP 403): the error must send the user to the clock, not to credentials they got right."""
    import datetime

    import botocore.auth

    _endpoint, bucket, _env = seaweedfs
    skewed = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(hours=1)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: skewed)  # the node's clock
    store = S3ObjectStore(bucket, "p", attempts=FAST_ATTEMPTS)
    with pytest.raises(
        StoreUnavailable, match=r"clock .* differs from the S3 server's .*RequestTimeTooSkewed.*NTP"
    ) as info:
        store.get("k")
    assert "access denied" not in str(info.value) and bucket in str(info.value)
    assert store.retries == 0
