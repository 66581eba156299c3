"""Object store on S3 or an S3-compatible server (MinIO, SeaweedFS, AWS) through boto3.

Configuration comes from arguments or the environment, never from a spec or URI:

- endpoint: ``endpoint=`` argument, else ``HACRL_S3_ENDPOINT``, else ``AWS_ENDPOINT_URL``, else
  AWS's own endpoint for the region;
- region: ``region=`` argument, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``, else
  ``us-east-1``;
- credentials: boto3's standard chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, web identity for IRSA). They are never logged.

Addressing is path-style (MinIO and SeaweedFS need it). Transient failures (connection errors,
timeouts, HTTP 500/502/503/504 and 429, SlowDown/throttling codes) are retried by botocore's
``standard`` retry mode, ``attempts`` tries in all, with its exponential full-jitter backoff
(50 ms doubling, 1 s doubling for throttling, at most 20 s); ``retries`` counts the retries made.
A missing bucket, refused credentials, or an endpoint still failing after the last attempt
raise ``StoreUnavailable`` naming the endpoint, the bucket and the fix.
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
    SSLError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from hacrl_core.store.errors import ObjectNotFound, StoreError, StoreUnavailable
from hacrl_core.store.file_store import atomic_write
from hacrl_core.store.keys import check_key, check_prefix

log = logging.getLogger(__name__)
T = TypeVar("T")

ENDPOINT_ENV_VARS = ("HACRL_S3_ENDPOINT", "AWS_ENDPOINT_URL")
REGION_ENV_VARS = ("AWS_REGION", "AWS_DEFAULT_REGION")
DEFAULT_REGION = "us-east-1"
# Tries of one request, the first included. botocore's backoff for connection errors starts at
# 50 ms and doubles with full jitter: 8 tries ride out about 3 s of outage on average (6 s at
# most), what the hand-written policy before it gave, so a store blip costs no worker restart.
DEFAULT_ATTEMPTS = 8

# Error codes of a failure worth retrying (AWS S3, MinIO, SeaweedFS, Ceph spellings): botocore
# decides the retries; these only word the error once they ran out.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "ServerBusy",
        "XMinioServerNotInitialized",
    }
)
ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AllAccessDisabled",
        "AccountProblem",
    }
)
_MULTIPART_THRESHOLD = 64 * 1024 * 1024


def resolve_endpoint(endpoint: str | None = None) -> str | None:
    """The endpoint URL to use: the argument, else the first set of ``ENDPOINT_ENV_VARS``."""
    if endpoint:
        return endpoint
    for name in ENDPOINT_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def resolve_region(region: str | None = None) -> str:
    """The region to use: the argument, else the first set of ``REGION_ENV_VARS``, else us-east-1."""
    if region:
        return region
    for name in REGION_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return DEFAULT_REGION


def make_s3_client(
    *,
    endpoint: str | None = None,
    region: str | None = None,
    connect_timeout: float = 5.0,
    read_timeout: float = 60.0,
    attempts: int = DEFAULT_ATTEMPTS,
    max_connections: int = 10,
    session: Any = None,
) -> Any:
    """A boto3 S3 client with path-style addressing, retrying each request ``attempts`` times in
    all (botocore's ``standard`` mode), keeping up to ``max_connections`` connections alive
    (botocore's default 10; a client that more threads share needs one per thread). ``session``:
    the boto3 session to build it in (one of its own by default)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    config = Config(
        region_name=resolve_region(region),
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"total_max_attempts": attempts, "mode": "standard"},
        max_pool_connections=max_connections,
        s3={"addressing_style": "path"},
        # Only send/verify checksums S3 requires; we verify sha256 ourselves, and older
        # S3-compatible servers reject the newer default CRC headers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    # A fresh session per client: boto3's default session is not thread-safe.
    client = (session or boto3.session.Session()).client("s3", endpoint_url=resolve_endpoint(endpoint), config=config)
    client.meta.events.register("before-send.s3", _drop_expect_for_empty_body)
    return client


def _drop_expect_for_empty_body(request: Any, **_: Any) -> None:
    """Send empty file-like bodies without ``Expect: 100-continue``.

    botocore adds the header to every PUT with a file-like body (e.g. ``upload_fileobj`` of an
    empty file). SeaweedFS 4.x answers such an empty upload without a ``100 Continue`` in a way
    that desynchronises the kept-alive connection: the *next* request on it times out. The
    header is unsigned (SigV4 skips ``expect``), so dropping it here is safe.
    """
    if request.headers.get("Content-Length") == "0" and "Expect" in request.headers:
        del request.headers["Expect"]


def _redact(url: str) -> str:
    """``url`` without any ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _boto_cause(exc: BaseException) -> BaseException:
    """The ClientError/BotoCoreError behind ``exc`` (boto3's transfer wrappers hide it)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ClientError, BotoCoreError)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _code_status(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return str(error.get("Code", "")), int(status or 0)
    return "", 0


_FAILURE = "hacrl_failure"  # request-context key: what the last attempt failed with


def _remember_failure(
    request_dict: dict[str, Any], response: Any, caught_exception: BaseException | None, **_: Any
) -> None:
    """``needs-retry`` hook, run beside botocore's retry handler: keeps what the attempt failed
    with for the warning ``_count_retry`` logs if botocore sends the request again."""
    if caught_exception is not None:
        what = type(caught_exception).__name__
    elif response is not None and response[0].status_code >= 400:
        what = f"{response[1].get('Error', {}).get('Code', '')} (HTTP {response[0].status_code})"
    else:
        return
    request_dict["context"][_FAILURE] = what


# The store whose request is being sent in this thread: a client that several stores share
# (s3_clients) has one retry hook, which counts the retry on the store that made the request.
_CALLER: contextvars.ContextVar[S3ObjectStore | None] = contextvars.ContextVar("hacrl_s3_caller", default=None)


def _count_retry_of_caller(request: Any, **kwargs: Any) -> None:
    store = _CALLER.get()
    if store is not None:
        store._count_retry(request, **kwargs)


def is_transient(exc: BaseException) -> bool:
    """True if retrying ``exc`` may succeed: connection trouble, timeouts, 5xx, 429, throttling."""
    exc = _boto_cause(exc)
    if isinstance(exc, SSLError):
        return False
    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
        return True
    if isinstance(exc, ClientError):
        code, status = _code_status(exc)
        return code in TRANSIENT_CODES or status >= 500 or status == 429
    return False


class S3ObjectStore:
    """``ObjectStore`` over ``s3://<bucket>/<prefix>``; keys are relative to ``prefix``.

    client: a boto3 S3 client; built with ``make_s3_client(endpoint=, region=,
    connect_timeout=, read_timeout=)`` when None.
    attempts: tries of one request, the first included (default 8; 1 disables retrying); it
    configures the client built here, an injected client keeps its own retry settings.
    shared_client: the injected client serves other stores too (``s3_clients.SharedS3Clients``):
    its hooks are registered once per client, not once per store (which would grow the client's
    handler list with every store and log every retry once per store).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        client: Any | None = None,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        shared_client: bool = False,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a non-empty name without '/', got {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self.bucket = bucket
        self.prefix = prefix
        self.client = client or make_s3_client(
            endpoint=endpoint,
            region=region,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            attempts=attempts,
        )
        self.attempts = attempts
        self.retries = 0  # requests sent again after a transient failure, so far
        self._bucket_checked = False
        events = self.client.meta.events
        events.register("needs-retry.s3", _remember_failure, unique_id="hacrl-remember-failure")
        if shared_client:
            events.register("request-created.s3", _count_retry_of_caller, unique_id="hacrl-count-retry")
        else:
            events.register("request-created.s3", self._count_retry)

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.uri!r}, endpoint={self.endpoint!r})"

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def endpoint(self) -> str:
        return _redact(str(self.client.meta.endpoint_url))

    # -- ObjectStore -----------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        full = self._full(key)
        self._call("put", key, lambda: self.client.put_object(Bucket=self.bucket, Key=full, Body=data))

    def put_file(self, key: str, local_path: Path | str) -> None:
        """Upload the local file ``local_path`` as ``key`` (multipart above 64 MiB), streaming."""
        full = self._full(key)
        transfer = TransferConfig(multipart_threshold=_MULTIPART_THRESHOLD)

        def upload() -> None:
            with open(local_path, "rb") as f:
                self.client.upload_fileobj(f, self.bucket, full, Config=transfer)

        self._call("put", key, upload)

    def get(self, key: str) -> bytes:
        full = self._full(key)

        def download() -> bytes:
            # botocore retries a request until a response arrives; a body that breaks off while
            # it is read here fails after botocore has returned, so that read is retried here.
            for attempt in range(1, self.attempts + 1):
                response = self.client.get_object(Bucket=self.bucket, Key=full)
                try:
                    with closing(response["Body"]) as body:
                        return body.read()
                except (IncompleteReadError, ResponseStreamingError, ReadTimeoutError) as error:
                    if attempt == self.attempts:
                        raise
                    self.retries += 1
                    log.warning(
                        "store: reading %r from %s broke off (%s); retry %d/%d",
                        key,
                        self.endpoint,
                        type(error).__name__,
                        attempt,
                        self.attempts - 1,
                    )
            raise AssertionError("unreachable")

        return self._call("get", key, download)

    def get_file(self, key: str, local_path: Path | str) -> None:
        """Download ``key`` to ``local_path`` (written atomically), streaming."""
        full = self._full(key)
        transfer = TransferConfig(multipart_threshold=_MULTIPART_THRESHOLD)

        def download() -> None:
            try:
                atomic_write(
                    Path(local_path),
                    lambda f: self.client.download_fileobj(self.bucket, full, f, Config=transfer),
                )
            except ClientError as exc:
                if _code_status(exc)[1] == 404:  # HeadObject: no body, so no NoSuchKey code
                    raise ObjectNotFound(key, self.uri) from None
                raise

        try:
            self._call("get", key, download)
        except ObjectNotFound:
            self._check_bucket()
            raise

    def exists(self, key: str) -> bool:
        full = self._full(key)

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=full)
            except ClientError as exc:
                if _code_status(exc)[1] == 404:
                    return False
                raise
            return True

        found = self._call("exists", key, head)
        if not found:
            self._check_bucket()  # HEAD cannot tell a missing key from a missing bucket
        return found

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0

        def list_all() -> list[str]:
            paginator = self.client.get_paginator("list_objects_v2")
            keys: list[str] = []
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
            return keys

        return sorted(self._call("list", prefix, list_all))

    def delete(self, key: str) -> None:
        full = self._full(key)
        # DeleteObject succeeds (204) whether or not the key exists, as the interface wants.
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=full))

    def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise ValueError("refusing to delete the whole store: pass a non-empty prefix")
        keys = self.list(prefix)
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._full(k)} for k in keys[start : start + 1000]]

            def delete(batch: list[dict[str, str]] = batch) -> None:
                response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
                errors = response.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StoreError(
                        f"could not delete {len(errors)} object(s) under {prefix!r} in "
                        f"{self.uri} at {self.endpoint}, e.g. {first.get('Key')!r}: "
                        f"{first.get('Code')} {first.get('Message')}"
                    )

            self._call("delete", prefix, delete)
        return len(keys)

    # -- internals -------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _check_bucket(self) -> None:
        """Raise StoreUnavailable if the bucket is missing or refused; checked once per store."""
        if self._bucket_checked:
            return
        self._call("head_bucket", "", lambda: self.client.head_bucket(Bucket=self.bucket))
        self._bucket_checked = True

    def _count_retry(self, request: Any, **_: Any) -> None:
        """``request-created`` hook: botocore is sending a request again (attempt 2 or later)."""
        retries = request.context.get("retries", {})
        if retries.get("attempt", 1) > 1:
            self.retries += 1
            log.warning(
                "store: %s %s on %s failed with %s; retry %d/%d",
                request.method, urlsplit(request.url).path, self.endpoint,
                request.context.get(_FAILURE, "an error"), retries["attempt"] - 1, self.attempts - 1,
            )  # fmt: skip

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        caller = _CALLER.set(self)
        try:
            return fn()
        except StoreError:
            raise
        except Exception as exc:
            translated = self._translate(exc, op, key)
            if translated is None:
                raise
            raise translated from exc
        finally:
            _CALLER.reset(caller)

    def _translate(self, exc: BaseException, op: str, key: str) -> StoreError | None:
        cause = _boto_cause(exc)
        where = f"bucket {self.bucket!r} at S3 endpoint {self.endpoint}"
        code, status = _code_status(cause)
        if isinstance(cause, (NoCredentialsError, PartialCredentialsError)):
            return StoreUnavailable(
                f"no usable S3 credentials for {where}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE / a web identity) in the environment"
            )
        if is_transient(cause):
            attempts = self.attempts
            if isinstance(cause, ClientError):
                return StoreUnavailable(
                    f"S3 {op} of {key!r} kept failing with {code} (HTTP {status}) on {where} "
                    f"after {attempts} attempts: the server is overloaded or down; retry later "
                    "or check the server's health"
                )
            return StoreUnavailable(
                f"S3 endpoint {self.endpoint} unreachable ({type(cause).__name__}) for bucket "
                f"{self.bucket!r} after {attempts} attempts: check HACRL_S3_ENDPOINT (or "
                "AWS_ENDPOINT_URL) and that the server is running and reachable"
            )
        if code == "NoSuchBucket" or (op == "head_bucket" and status == 404):
            return StoreUnavailable(
                f"{where} does not exist: create the bucket (e.g. `aws --endpoint-url "
                f"{self.endpoint} s3 mb s3://{self.bucket}`) or fix the store URI"
            )
        if code == "RequestTimeTooSkewed":  # a 403, but the credentials are fine
            return StoreUnavailable(
                f"the clock of this machine differs from the S3 server's by more than it allows "
                f"(RequestTimeTooSkewed, HTTP {status}) on {where}: synchronise the node's clock (NTP, "
                "chrony, or the container host's); the credentials are not the problem"
            )
        if code in ACCESS_CODES or status == 403:
            return StoreUnavailable(
                f"access denied ({code or status}) to {where}: check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) and the bucket policy"
            )
        if code == "NoSuchKey":
            return ObjectNotFound(key, self.uri)
        if isinstance(cause, ClientError):
            message = cause.response.get("Error", {}).get("Message", "")
            return StoreError(f"S3 {op} of {key!r} on {where} failed: {code} (HTTP {status}) {message}")
        return None
