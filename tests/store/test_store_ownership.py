"""Store ownership: experiments keyed by namespace and name, and the owner record that keeps one
experiment object out of another's prefix (claim, adopt, refuse, clean up only what is owned)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from hacrl_core.context import WorkerContext
from hacrl_core.spec import parse_experiment
from hacrl_core.store import describe_prefix, open_experiment_store
from hacrl_core.store.ownership import (
    Owner,
    StoreOwnedByAnother,
    check_owner,
    claim,
    delete_if_owned,
    read_owner,
)
from tests.support.documents import MINIMAL

# The spec suite's minimal document, under a name two teams might both pick.
DOCUMENT = {**MINIMAL, "metadata": {"name": "shared-name"}}


def experiment(tmp_path: Path, namespace: str | None, **store):
    document = copy.deepcopy(DOCUMENT)
    if namespace:
        document["metadata"]["namespace"] = namespace
    document["spec"]["store"] = {"uri": (tmp_path / "store").as_uri(), **store}
    return parse_experiment(document)


def test_same_name_and_uri_in_two_namespaces_are_two_prefixes(tmp_path: Path) -> None:
    team_a, team_b = (
        open_experiment_store(experiment(tmp_path, "team-a")),
        open_experiment_store(experiment(tmp_path, "team-b")),
    )
    team_a.write_progress("small", {"step": 7})
    assert team_b.read_progress("small") is None  # team-b can neither resume from nor see team-a's run
    assert team_b.delete_experiment() == 0 and team_a.read_progress("small") == {"step": 7}
    assert describe_prefix(experiment(tmp_path, "team-a")).endswith("/store/team-a/shared-name/")
    # `hacrl run` of a spec without a namespace keeps the plain <uri>/<name>/ prefix.
    assert describe_prefix(experiment(tmp_path, None)).endswith("/store/shared-name/")


def test_claim_writes_the_record_once_and_refuses_another_uid(tmp_path: Path) -> None:
    store = open_experiment_store(experiment(tmp_path, "ml"))
    first = Owner(name="shared-name", uid="uid-1", namespace="ml")
    claim(store, first, adopt=False, where="p/")
    assert read_owner(store) == first
    claim(store, first, adopt=False, where="p/")  # the same object again (a restarted worker)
    recreated = Owner(name="shared-name", uid="uid-2", namespace="ml")
    with pytest.raises(StoreOwnedByAnother) as refused:
        claim(store, recreated, adopt=False, where="s3://b/ml/shared-name/")
    message = str(refused.value)
    assert "s3://b/ml/shared-name/ belongs to experiment ml/shared-name (uid uid-1)" in message
    assert "spec.store.adoptExisting: true" in message  # same name: re-created, here is the explicit way to resume
    assert read_owner(store) == first  # nothing written by the refused claim


def test_adopt_takes_over_only_a_prefix_of_the_same_namespace_and_name(tmp_path: Path) -> None:
    store = open_experiment_store(experiment(tmp_path, "ml"))
    claim(store, Owner(name="shared-name", uid="uid-1", namespace="ml"), adopt=False, where="p/")
    stranger = Owner(name="other", uid="uid-9", namespace="other-team")
    with pytest.raises(StoreOwnedByAnother, match="use another name or store URI"):
        check_owner(store, stranger, adopt=True, where="p/")
    recreated = Owner(name="shared-name", uid="uid-2", namespace="ml")
    claim(store, recreated, adopt=True, where="p/")
    assert read_owner(store) == recreated
    with pytest.raises(StoreOwnedByAnother):  # and now the old object is the stranger
        claim(store, Owner(name="shared-name", uid="uid-1", namespace="ml"), adopt=False, where="p/")


def test_cleanup_deletes_only_an_owned_prefix(tmp_path: Path) -> None:
    store = open_experiment_store(experiment(tmp_path, "ml"))
    assert delete_if_owned(store, "uid-1", where="p/") == 0  # nothing there, nothing to refuse
    store.write_progress("small", {"step": 1})
    with pytest.raises(StoreOwnedByAnother, match="no owner record"):
        delete_if_owned(store, "uid-1", where="p/")
    claim(store, Owner(name="shared-name", uid="uid-1", namespace="ml"), adopt=False, where="p/")
    with pytest.raises(StoreOwnedByAnother, match="belongs to experiment ml/shared-name"):
        delete_if_owned(store, "uid-2", where="p/")
    assert store.read_progress("small") == {"step": 1}
    assert delete_if_owned(store, "uid-1", where="p/") == 2  # progress and the record
    assert read_owner(store) is None


def test_an_operator_worker_stops_before_touching_a_prefix_another_experiment_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = experiment(tmp_path, "ml")
    claim(open_experiment_store(exp), Owner(name="shared-name", uid="old-uid", namespace="ml"), adopt=False, where="p/")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(exp.model_dump(mode="json", by_alias=True, exclude_none=True)))
    monkeypatch.setenv("HACRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HACRL_EXPERIMENT_UID", "new-uid")
    with pytest.raises(StoreOwnedByAnother, match="belongs to experiment ml/shared-name"):
        WorkerContext.from_spec_file(spec_file, "small")
    adopting = copy.deepcopy(yaml.safe_load(spec_file.read_text()))
    adopting["spec"]["store"]["adoptExisting"] = True
    spec_file.write_text(yaml.safe_dump(adopting))
    context = WorkerContext.from_spec_file(spec_file, "small")
    assert read_owner(context.store) == Owner(name="shared-name", uid="new-uid", namespace="ml")
