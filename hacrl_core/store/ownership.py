"""Who owns an experiment's store prefix: the owner record ``<experiment>/owner.json``.

Operator experiments are keyed by namespace and name (``open_experiment_store``), so two teams
that pick the same name and store URI get different prefixes. Within one prefix the record says
which experiment object (by its Kubernetes uid) wrote it: a re-created experiment of the same
name has a new uid and is refused unless its spec says ``store.adoptExisting: true`` (then it
takes the record over and resumes from the checkpoints), and cleanup deletes only a prefix whose
record names the experiment being cleaned up. Explicit, never silent.

The workers write the record (they hold write credentials; the operator may only read) and the
operator reads it before it creates pods and before it deletes anything.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass

from hacrl_core.store import layout
from hacrl_core.store.errors import CorruptObject, ObjectNotFound, StoreError
from hacrl_core.store.trajectory_store import TrajectoryStore


class StoreOwnedByAnother(StoreError):
    """The prefix belongs to another experiment (another uid); the message says what to do."""


@dataclass(frozen=True)
class Owner:
    name: str
    uid: str
    namespace: str | None = None

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"experiment {where} (uid {self.uid})"


def utc_timestamp() -> str:
    """When a record was written, for people reading the store (never compared)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_owner(store: TrajectoryStore) -> Owner | None:
    key = layout.owner_key(store.experiment)
    try:
        record = json.loads(store.objects.get(key))
        return Owner(name=record["name"], uid=record["uid"], namespace=record.get("namespace"))
    except ObjectNotFound:
        return None
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptObject(f"owner record {key!r} is not valid: {error}") from None


def _write(store: TrajectoryStore, owner: Owner) -> None:
    record = {**asdict(owner), "claimedAt": utc_timestamp()}
    store.objects.put(layout.owner_key(store.experiment), json.dumps(record, sort_keys=True).encode())


def refusal(current: Owner, claimant: Owner, where: str) -> str:
    """Why ``claimant`` may not use a prefix ``current`` owns, and what to do about it."""
    same_name = (current.namespace, current.name) == (claimant.namespace, claimant.name)
    if same_name:
        fix = (
            "this is a re-created experiment of the same name: set spec.store.adoptExisting: true to resume from the "
            "old run's checkpoints, or delete the old data, or use another name"
        )
    else:
        fix = "use another name or store URI"
    return f"store prefix {where} belongs to {current.describe()}, not to {claimant.describe()}; {fix}"


def check_owner(store: TrajectoryStore, claimant: Owner, *, adopt: bool, where: str) -> Owner | None:
    """The record if ``claimant`` may use the prefix (None when there is none yet); raises
    ``StoreOwnedByAnother`` otherwise. Reads only (the operator's check)."""
    current = read_owner(store)
    if current is None or current.uid == claimant.uid:
        return current
    if adopt and (current.namespace, current.name) == (claimant.namespace, claimant.name):
        return current
    raise StoreOwnedByAnother(refusal(current, claimant, where))


def claim(store: TrajectoryStore, claimant: Owner, *, adopt: bool, where: str) -> Owner:
    """Make ``claimant`` the prefix's owner: write the record when there is none, take it over
    when ``adopt`` allows, or raise ``StoreOwnedByAnother`` (the workers' check)."""
    current = check_owner(store, claimant, adopt=adopt, where=where)
    if current is None or current.uid != claimant.uid:
        _write(store, claimant)
    return claimant


def delete_if_owned(store: TrajectoryStore, uid: str, *, where: str) -> int:
    """Delete the prefix only if its record names ``uid``; a prefix with no record is deleted
    only when it holds nothing (a record is the first thing a worker writes)."""
    current = read_owner(store)
    if current is None:
        leftovers = store.objects.list(layout.experiment_prefix(store.experiment) + "/")
        if leftovers:
            raise StoreOwnedByAnother(
                f"store prefix {where} has {len(leftovers)} objects but no owner record; left alone (delete it by hand if it is yours)"
            )
        return 0
    if current.uid != uid:
        raise StoreOwnedByAnother(f"store prefix {where} belongs to {current.describe()}; left alone")
    return store.delete_experiment()
