"""Operator settings, read once from the environment.

Every setting has one environment variable; a bad value raises ``ConfigError`` naming the
variable, the value and what is expected, so a crash-looping operator pod says what to fix.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import uuid
from collections.abc import Mapping
from typing import TypedDict

from pydantic import ValidationError

from hacrl_core import __version__ as _HACRL_VERSION
from hacrl_core.spec import DNS_LABEL, DNS_SUBDOMAIN, StoreSpec

_IMAGE = re.compile(r"^[^\s]+$")

DEFAULT_ROLLOUT_IMAGE = f"ghcr.io/hacrl/hacrl-rollout:{_HACRL_VERSION}"
DEFAULT_LEARNER_IMAGE = f"ghcr.io/hacrl/hacrl-learner:{_HACRL_VERSION}"

FINALIZER = "hacrl.io/cleanup"


class ConfigError(ValueError):
    """A bad operator setting; the message names the environment variable and its value."""


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    # Default images of the worker pods; `spec.images` of an experiment overrides them.
    rollout_image: str = DEFAULT_ROLLOUT_IMAGE
    learner_image: str = DEFAULT_LEARNER_IMAGE
    # Namespaces watched; empty = all namespaces (HACRL_WATCH_NAMESPACES="" or "*").
    namespaces: tuple[str, ...] = ()
    # Port of the operator's own Prometheus metrics (0 disables them).
    metrics_port: int = 8081
    # Liveness endpoint served by kopf (`/healthz`); port 0 disables it.
    health_port: int = 8080
    # Seconds between two periodic reconciles of one experiment (progress heartbeats live in the
    # store, which sends no events); pod events reconcile at once in between.
    reconcile_interval: float = 10.0
    # Watch-stream timeouts (kopf `settings.watching`): without them a watch whose TCP
    # connection silently died is never re-established and the operator stalls.
    watch_server_timeout: int = 300
    watch_client_timeout: int = 330
    watch_connect_timeout: int = 30
    # Kubernetes API access: a kubeconfig file, else the in-cluster service account.
    kubeconfig: str | None = None
    # User and group the worker containers run as (non-root); None: the platform assigns them
    # (OpenShift's restricted-v2 SCC refuses a uid outside the namespace's range).
    run_as_user: int | None = 1000
    # Secrets the cluster admin marked usable by experiments (store credentials, model token):
    # "name" (any watched namespace), "namespace/name", or "*" (any; single-tenant clusters).
    # A list rather than a label on the Secret: the operator needs no permission on Secrets.
    experiment_secrets: tuple[str, ...] = ()
    # imagePullSecrets of every worker pod (the cluster admin's; experiments cannot name Secrets).
    worker_image_pull_secrets: tuple[str, ...] = ()
    # The install's default store (HACRL_DEFAULT_STORE_URI, _ENDPOINT, _REGION,
    # _CREDENTIALS_SECRET), filled into experiments without `spec.store`; None = such experiments
    # are refused (a `file://` path inside each pod is no store rollout and learner pods share).
    # Sharing one store is safe: each experiment keeps to `<uri>/<namespace>/<name>/`, claimed by
    # an owner record (hacrl_core/store/ownership.py).
    default_store: StoreSpec | None = None
    # Leader election (leader.py): the Lease "namespace/name" that replicas of one install compete
    # for; None = no election, the operator acts at once (one replica only: two would both act).
    leader_lease: tuple[str, str] | None = None
    # This replica's name in the Lease's holderIdentity (the chart passes the pod's name).
    leader_identity: str = ""
    # client-go's timing (its defaults): a leader that could not renew for `renew_deadline`
    # seconds stops acting; a standby takes the Lease `lease_duration` seconds after it last saw it
    # renewed, and tries every `retry_period` seconds.
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    def watches(self, namespace: str | None) -> bool:
        return self.clusterwide or namespace in self.namespaces

    def secret_allowed(self, namespace: str, name: str) -> bool:
        return any(entry in ("*", name, f"{namespace}/{name}") for entry in self.experiment_secrets)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        defaults = cls()
        server_timeout = _int(env, "HACRL_WATCH_SERVER_TIMEOUT", defaults.watch_server_timeout, low=1)
        return cls(
            rollout_image=_image(env, "HACRL_ROLLOUT_IMAGE", defaults.rollout_image),
            learner_image=_image(env, "HACRL_LEARNER_IMAGE", defaults.learner_image),
            namespaces=_namespaces(env, "HACRL_WATCH_NAMESPACES"),
            metrics_port=_int(env, "HACRL_OPERATOR_METRICS_PORT", defaults.metrics_port, low=0, high=65535),
            health_port=_int(env, "HACRL_OPERATOR_HEALTH_PORT", defaults.health_port, low=0, high=65535),
            reconcile_interval=_seconds(env, "HACRL_RECONCILE_INTERVAL", defaults.reconcile_interval),
            watch_server_timeout=server_timeout,
            watch_client_timeout=_int(env, "HACRL_WATCH_CLIENT_TIMEOUT", server_timeout + 30, low=server_timeout + 1),
            watch_connect_timeout=_int(env, "HACRL_WATCH_CONNECT_TIMEOUT", defaults.watch_connect_timeout, low=1),
            kubeconfig=env.get("KUBECONFIG") or None,
            run_as_user=_run_as_user(env, "HACRL_POD_RUN_AS_USER", defaults.run_as_user),
            experiment_secrets=_secrets(env, "HACRL_EXPERIMENT_SECRETS"),
            worker_image_pull_secrets=_secrets(env, "HACRL_WORKER_IMAGE_PULL_SECRETS", qualified=False),
            default_store=_default_store(env),
            **_leader_election(env, defaults),
        )


def _raw(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _int(env: Mapping[str, str], name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer (default {default})") from None
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{name}={raw!r} is out of range: must be {bounds} (default {default})")
    return value


# HACRL_POD_RUN_AS_USER's word for "set no uid, gid or fsGroup": the platform assigns them.
PLATFORM_ASSIGNED = "none"


def _run_as_user(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    if (_raw(env, name) or "").lower() == PLATFORM_ASSIGNED:
        return None
    try:
        return _int(env, name, default or 1000, low=1)
    except ConfigError as error:
        raise ConfigError(
            f"{error}; or {PLATFORM_ASSIGNED!r} to leave uid, gid and fsGroup to the platform (OpenShift)"
        ) from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds (default {default})") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds (default {default})")
    return value


def _image(env: Mapping[str, str], name: str, default: str) -> str:
    raw = _raw(env, name)
    if raw is None:
        return default
    if not _IMAGE.match(raw):
        raise ConfigError(f"{name}={raw!r} is not a container image reference (e.g. {default})")
    return raw


def _secrets(env: Mapping[str, str], name: str, qualified: bool = True) -> tuple[str, ...]:
    """Comma-separated Secret names; ``qualified`` also admits "namespace/name" and "*"."""
    raw = _raw(env, name) or ""
    entries = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    parts = 2 if qualified else 1
    bad = [
        e
        for e in entries
        if not (qualified and e == "*")
        and not (
            len(e.split("/")) <= parts and all(p and len(p) <= 253 and DNS_SUBDOMAIN.match(p) for p in e.split("/"))
        )
    ]
    if bad:
        forms = (
            "Secret names ('hacrl-store', any namespace) or 'namespace/name', or '*' for any Secret"
            if qualified
            else "Secret names"
        )
        raise ConfigError(
            f"{name}={raw!r}: {', '.join(map(repr, bad))} is not a Secret; give a comma-separated list of {forms}"
        )
    return entries


# The default store's settings: (variable, StoreSpec field).
DEFAULT_STORE_VARIABLES = (
    ("HACRL_DEFAULT_STORE_URI", "uri"),
    ("HACRL_DEFAULT_STORE_ENDPOINT", "endpoint"),
    ("HACRL_DEFAULT_STORE_REGION", "region"),
    ("HACRL_DEFAULT_STORE_CREDENTIALS_SECRET", "credentials_secret"),
)


def _default_store(env: Mapping[str, str]) -> StoreSpec | None:
    """The default store, validated as `spec.store` is; each error names its variable."""
    given = {field: (name, raw) for name, field in DEFAULT_STORE_VARIABLES if (raw := _raw(env, name)) is not None}
    if not given:
        return None
    if "uri" not in given:
        names = ", ".join(name for name, _ in given.values())
        raise ConfigError(
            f"{names} set but HACRL_DEFAULT_STORE_URI is empty: give the default store's URI (e.g. s3://hacrl), or unset {names}"
        )
    if not given["uri"][1].startswith("s3://"):
        raise ConfigError(
            f"HACRL_DEFAULT_STORE_URI={given['uri'][1]!r} is not an S3 store: give s3://bucket[/prefix] "
            "(a file:// path inside each pod is no store that rollout and learner pods share)"
        )
    try:
        return StoreSpec.model_validate({field: raw for field, (_, raw) in given.items()})
    except ValidationError as error:
        first = error.errors()[0]
        by_alias = {StoreSpec.model_fields[field].alias or field: field for field in given}
        field = str(first["loc"][0]) if first["loc"] else "uri"
        name, raw = given.get(field) or given.get(by_alias.get(field, "uri")) or given["uri"]
        raise ConfigError(f"{name}={raw!r}: {first['msg'].removeprefix('Value error, ')}") from None


def _namespaces(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = _raw(env, name)
    if raw is None or raw == "*":
        return ()
    names = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    bad = [n for n in names if len(n) > 63 or not DNS_LABEL.match(n)]
    if bad or not names:
        raise ConfigError(
            f"{name}={raw!r}: {', '.join(map(repr, bad)) or 'empty list'} is not a namespace name; "
            "give a comma-separated list of namespaces, or leave it empty (or '*') for all namespaces"
        )
    return names


class _LeaderElection(TypedDict):
    leader_lease: tuple[str, str] | None
    leader_identity: str
    lease_duration: int
    renew_deadline: float
    retry_period: float


def _leader_election(env: Mapping[str, str], defaults: OperatorConfig) -> _LeaderElection:
    """The leader-election settings; the timing checks are client-go's (leaderelection.NewLeaderElector)."""
    raw = _raw(env, "HACRL_LEADER_ELECTION_LEASE")
    lease: tuple[str, str] | None = None
    if raw is not None:
        namespace, _, name = raw.partition("/")
        if not (
            namespace
            and name
            and len(namespace) <= 63
            and DNS_LABEL.match(namespace)
            and len(name) <= 253
            and DNS_SUBDOMAIN.match(name)
        ):
            raise ConfigError(
                f"HACRL_LEADER_ELECTION_LEASE={raw!r} is not a Lease: give namespace/name (e.g. hacrl-system/hacrl-operator), "
                "or leave it empty to run without leader election (one replica only)"
            )
        lease = (namespace, name)
    duration = _int(env, "HACRL_LEADER_ELECTION_LEASE_DURATION", defaults.lease_duration, low=2)
    deadline = _seconds(env, "HACRL_LEADER_ELECTION_RENEW_DEADLINE", defaults.renew_deadline)
    retry = _seconds(env, "HACRL_LEADER_ELECTION_RETRY_PERIOD", defaults.retry_period)
    if not deadline < duration:
        raise ConfigError(
            f"HACRL_LEADER_ELECTION_RENEW_DEADLINE={deadline:g} must be shorter than HACRL_LEADER_ELECTION_LEASE_DURATION="
            f"{duration}: a leader must stop acting before a standby may take its Lease"
        )
    if not retry * 1.2 < deadline:
        raise ConfigError(
            f"HACRL_LEADER_ELECTION_RETRY_PERIOD={retry:g} must be under HACRL_LEADER_ELECTION_RENEW_DEADLINE / 1.2 "
            f"({deadline / 1.2:g}): a leader needs more than one try to renew before its deadline"
        )
    identity = _raw(env, "HACRL_LEADER_ELECTION_IDENTITY") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    return {
        "leader_lease": lease,
        "leader_identity": identity,
        "lease_duration": duration,
        "renew_deadline": deadline,
        "retry_period": retry,
    }
