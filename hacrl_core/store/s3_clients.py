"""boto3 S3 clients shared by every store that would build the same one, closed with the last user.

A boto3 client is heavy: each loads the S3 service model and endpoint rules into its own session,
about 12 MiB of resident memory. A process that opens many stores on one S3 server (the operator:
one store per experiment, all on the cluster's endpoint) needs one client per endpoint, region,
credentials and request limits, not one per store. ``SharedS3Clients.acquire`` returns that
client, counting its users; ``release`` closes it (its connection pool) when the last one lets go.
A client is thread-safe once built (boto3's documentation), so stores in several threads share it.

Most of a client's 12 MiB is the S3 service model and endpoint rules, JSON that botocore's data
loader parses anew for every session. The clients open at once share one loader, so a process
that talks to several endpoints (or rotates credentials) parses them once: a further client
costs about 0.5 MiB. The loader goes with the last client, so a process with no S3 client open
holds none of it.

Credentials come from the environment (boto3's chain, see ``s3_store``), so the key holds a
fingerprint of the variables that pick them, never the credentials themselves: a process whose
credentials change (a rotated ``AWS_*`` set in ``os.environ``) gets a new client for new users.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from typing import Any

from hacrl_core.store.s3_store import DEFAULT_ATTEMPTS, make_s3_client, resolve_endpoint, resolve_region

# The environment variables boto3's default chain reads to pick credentials.
CREDENTIAL_ENV_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)


def credentials_fingerprint(environ: dict[str, str] | None = None) -> str:
    """A digest of the credential variables in ``environ`` (``os.environ``): equal for equal credentials."""
    env = os.environ if environ is None else environ
    digest = hashlib.sha256()
    for name in CREDENTIAL_ENV_VARS:
        digest.update(f"{name}={env.get(name, '')}\0".encode())
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class ClientKey:
    """What makes two clients interchangeable."""

    endpoint: str | None
    region: str
    credentials: str  # credentials_fingerprint()
    connect_timeout: float
    read_timeout: float
    attempts: int


@dataclasses.dataclass
class _Entry:
    client: Any
    users: int = 0


class SharedS3Clients:
    """Refcounted boto3 S3 clients, one per ``ClientKey``; ``max_connections``: kept-alive
    connections of each, one per thread that may use it at once (more are opened and dropped
    per request)."""

    def __init__(self, max_connections: int = 10) -> None:
        self.max_connections = max_connections
        self._guard = threading.Lock()
        self._entries: dict[ClientKey, _Entry] = {}
        self._loader: Any = None  # botocore's data loader of the open clients (None while none is)

    def key(
        self,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> ClientKey:
        return ClientKey(
            resolve_endpoint(endpoint),
            resolve_region(region),
            credentials_fingerprint(),
            float(connect_timeout),
            float(read_timeout),
            int(attempts),
        )

    def acquire(self, key: ClientKey) -> Any:
        """The client of ``key``, built on first use; every call needs one ``release``."""
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                # Built under the lock: two first users at once must not build two ~12 MiB clients.
                client = make_s3_client(
                    endpoint=key.endpoint,
                    region=key.region,
                    connect_timeout=key.connect_timeout,
                    read_timeout=key.read_timeout,
                    attempts=key.attempts,
                    max_connections=self.max_connections,
                    session=self._session(),
                )
                entry = self._entries[key] = _Entry(client)
            entry.users += 1
            return entry.client

    def release(self, key: ClientKey) -> None:
        """One user of ``key``'s client is done; the last one closes it."""
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                raise KeyError(f"no shared S3 client for {key.endpoint or 'AWS'} ({key.region}) is held")
            entry.users -= 1
            if entry.users > 0:
                return
            del self._entries[key]
            if not self._entries:
                self._loader = None
        entry.client.close()

    def _session(self) -> Any:
        """A boto3 session of its own (boto3's are not thread-safe) over the shared data loader."""
        import boto3.session
        import botocore.loaders
        import botocore.session

        if self._loader is None:
            self._loader = botocore.loaders.create_loader()
        core = botocore.session.get_session()
        core.register_component("data_loader", self._loader)
        return boto3.session.Session(botocore_session=core)

    def __len__(self) -> int:
        """Clients open now."""
        with self._guard:
            return len(self._entries)

    def users(self) -> int:
        """Users of all clients together."""
        with self._guard:
            return sum(entry.users for entry in self._entries.values())
