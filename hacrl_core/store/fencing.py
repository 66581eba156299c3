"""Fencing: at most one live writer per (experiment, agent, role), and per rollout replica.

Two workers for the same agent and role can both be alive: a force-deleted pod whose process
still runs next to its replacement, or two `hacrl run --resume` of one spec. Without a fence they
interleave on a shard (a permanent ``CorruptObject``) and one prunes the checkpoint the other is
restoring. So each worker claims a lease when it starts:

    <experiment>/leases/<agent>.<role>.json   {generation, token, holder, claimedAt}

(a rollout with several replicas: one lease per replica, ``<agent>.rollout-<r>.json``; replicas
write disjoint parts of a step, so they must not fence each other, but a restarted replica
fences its own older incarnation as any worker does.)

The newest claim wins: a worker writes its generation with a random token, and before every
write to the store (``TrajectoryStore.fence``) re-reads the lease; when the token is no longer
its own, it raises ``FencedOut`` and writes nothing further. Two workers claiming at the same
moment both write; the store keeps one object, and the other sees a foreign token on its first
check (``acquire`` checks once right away).

Generations: a pod's worker takes ``previous + 1``. A `hacrl run` claims one generation for all
its workers (``claim_run_generation``, passed as HACRL_FENCE_GENERATION), so that a worker of an
older run that wakes up late (stopped, swapped out) is refused at once instead of taking the
lease back from the newer run, and a worker the run restarts (same generation) takes over its
dead predecessor's lease.

What this does not cover: a worker paused between its check and its write (a long GC or
SIGSTOP) can still land that one write after its successor took over. The window is one object
write; the conditional writes of S3 (If-Match) would close it where the server supports them,
which neither the file store nor the SeaweedFS in our tests does today.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass

from hacrl_core.store import layout
from hacrl_core.store.errors import ObjectNotFound, StoreError, StoreGone
from hacrl_core.store.ownership import utc_timestamp
from hacrl_core.store.trajectory_store import TrajectoryStore

# Exit code of a worker that stopped because a newer worker of its agent and role took over:
# its supervisor (`hacrl run`) must not restart it, or the two would take turns fencing each other.
FENCED_EXIT_CODE = 3


# Exit code of a worker that stopped because its store (or the experiment's prefix in it) was
# deleted under it: restarting it would re-create the store piecemeal, so its supervisor stops.
STORE_GONE_EXIT_CODE = 4


class FencedOut(StoreError):
    """A newer worker holds this worker's lease; the message names it."""


def _holder() -> str:
    pod = os.environ.get("POD_NAME")
    return f"pod {pod}" if pod else f"pid {os.getpid()} on {socket.gethostname()}"


def _read(store: TrajectoryStore, key: str) -> dict | None:
    try:
        return _parse(store.objects.get(key))
    except ObjectNotFound:
        return None


def _parse(data: bytes) -> dict | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None  # a torn or foreign object: the next claim replaces it
    return record if isinstance(record, dict) else None


@dataclass
class Lease:
    store: TrajectoryStore
    agent: str
    role: str
    generation: int
    token: str
    replica: int | None = None  # a rollout replica of several: its own lease

    @property
    def key(self) -> str:
        return layout.lease_key(self.store.experiment, self.agent, self.role, self.replica)

    @property
    def worker(self) -> str:
        """The worker in messages: ``rollout``, or ``rollout replica 1``."""
        return self.role if self.replica is None else f"{self.role} replica {self.replica}"

    @classmethod
    def acquire(
        cls, store: TrajectoryStore, agent: str, role: str, generation: int | None = None, *, replica: int | None = None
    ) -> Lease:
        """Claim ``generation`` (default: the next one) for ``agent``'s ``role`` worker (``replica``:
        that rollout replica's own lease, with several) and install the fence; ``FencedOut`` when a
        newer generation holds it already."""
        key = layout.lease_key(store.experiment, agent, role, replica)
        previous = _read(store, key) or {}
        current = int(previous.get("generation", 0))
        worker = role if replica is None else f"{role} replica {replica}"
        if generation is None:
            generation = current + 1
        elif generation < current:
            raise FencedOut(
                f"the {worker} worker of agent {agent!r} (generation {generation}) started after a newer one took over: "
                f"{previous.get('holder', 'another worker')} holds generation {current} since {previous.get('claimedAt', '?')}; "
                "it stops without writing"
            )
        lease = cls(store, agent, role, generation, uuid.uuid4().hex, replica)
        record = {"generation": generation, "token": lease.token, "holder": _holder(), "claimedAt": utc_timestamp()}
        store.objects.put(key, json.dumps(record, sort_keys=True).encode())
        lease.check()  # a claim racing ours may have replaced it already
        store.fence = lease.check
        return lease

    def check(self) -> None:
        """Raise ``FencedOut`` unless this lease is still the newest claim, ``StoreGone`` when it
        is no longer there at all."""
        try:  # one read, as before: a missing lease is told apart from a replaced one
            current = _parse(self.store.objects.get(self.key)) or {}
        except ObjectNotFound:
            raise StoreGone(
                f"the store of experiment {self.store.experiment!r} is gone: the lease {self.key} of the {self.worker} worker of "
                f"agent {self.agent!r} vanished from {self.store.objects.uri} (the store, or the experiment's data in it, was deleted); "
                "this worker stops and writes nothing further"
            ) from None
        if current.get("token") != self.token:
            raise FencedOut(
                f"the {self.worker} worker of agent {self.agent!r} was superseded by {current.get('holder', 'another worker')} "
                f"(generation {current.get('generation', '?')}, claimed {current.get('claimedAt', '?')}); this one "
                f"(generation {self.generation}) stops and writes nothing further"
            )


def require_run_generation(store: TrajectoryStore) -> None:
    """``StoreGone`` unless the record ``claim_run_generation`` wrote when this worker's `hacrl run`
    started is still there: a worker (re)started after the store was deleted must not re-create it."""
    key = layout.run_lease_key(store.experiment)
    if not store.objects.exists(key):
        raise StoreGone(
            f"the store of experiment {store.experiment!r} is gone: {key}, written when the run started, "
            f"vanished from {store.objects.uri}; this worker starts nothing"
        )


def claim_run_generation(store: TrajectoryStore) -> int:
    """A generation newer than every lease of the experiment, for all workers of one `hacrl run`."""
    newest = 0
    for key in store.objects.list(layout.leases_prefix(store.experiment) + "/"):
        newest = max(newest, int((_read(store, key) or {}).get("generation", 0)))
    generation = newest + 1
    record = {"generation": generation, "holder": _holder(), "claimedAt": utc_timestamp()}
    store.objects.put(layout.run_lease_key(store.experiment), json.dumps(record, sort_keys=True).encode())
    return generation
