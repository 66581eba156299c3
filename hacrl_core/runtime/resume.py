"""Whether `hacrl run --resume` may continue a run with the spec it is given.

A resumed run continues the stored run's training, so every field that decides what is trained
must equal the stored spec's: otherwise one store prefix would hold two experiments (steps 0-7
HACPO, 8-11 GSPO) under one name. The fields in ``RESUMABLE_FIELDS`` change only how the run is
watched, checkpointed, restarted or reached, and may differ (docs/runtime.md, "Resuming"). The
team may change: agents are compared by name, so an agent may be added, removed or suspended
(``agents[].suspend``), but an agent in both specs must be unchanged, its model (and so its
tokenizer) above all (``team_by_name``).
The check fails closed: a stored spec that cannot be read refuses the resume.

The spec names a dataset by its path, and a file replaced under the same path passed that check
(one run trained step 0 on addition rows, steps 1-3 on multiplication rows). So a run records what
each dataset gave when it was claimed (rows and their sha256, ``record_datasets``) and a resume
compares what the datasets give now (``check_datasets_unchanged``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from hacrl_core.skipped_rows import DatasetReport
from hacrl_core.store import CorruptObject, ObjectNotFound, TrajectoryStore
from hacrl_core.store.commit import get_committed, put_committed
from hacrl_core.store.layout import experiment_prefix, spec_key

#: Field paths (and everything under them) a resumed run may change.
RESUMABLE_FIELDS = (
    "spec.metrics",  # where the workers' Prometheus endpoints listen
    "spec.tracking",  # where the step metrics are also sent; the runs a resume continues are in the store
    "spec.data.rewardServer",  # how the reward server is called (timeouts, retries); not what scores
    "spec.evaluation",  # how often and with how many samples held-out sets are scored: read, never trained on
    "spec.checkpoint",  # how often checkpoints are taken and how many are kept; a resume reads the latest either way
    "spec.restartLimit",
    "spec.cleanup",
    "spec.suspend",
    # Where the store is reached: a store copied to another folder or bucket is the same run. The
    # prefix below it (namespace, name) is not here: it decides which run is resumed.
    "spec.store.uri",
    "spec.store.endpoint",
    "spec.store.region",
    "spec.store.credentialsSecret",
    "spec.store.adoptExisting",
)


class ResumeRefused(RuntimeError):
    """The run cannot be resumed with this spec; the message says which fields or what to fix."""


def leaves(node: Any, path: str = "") -> dict[str, Any]:
    """``{dotted.path[index]: value}`` of every scalar in a YAML document."""
    if isinstance(node, dict):
        found: dict[str, Any] = {}
        for key, value in node.items():
            found.update(leaves(value, f"{path}.{key}" if path else str(key)))
        return found or {path: {}}
    if isinstance(node, list):
        found = {}
        for index, value in enumerate(node):
            found.update(leaves(value, f"{path}[{index}]"))
        return found or {path: []}
    return {path: node}


def resumable(path: str) -> bool:
    return any(path == allowed or path.startswith((f"{allowed}.", f"{allowed}[")) for allowed in RESUMABLE_FIELDS)


def changed_fields(previous: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``field: old -> new`` for every field that differs, resumable ones left out."""
    before, after = leaves(previous), leaves(current)
    missing = object()
    lines = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, missing), after.get(path, missing)
        if old != new and not resumable(path):
            lines.append(f"{path}: {_shown(old, missing)} -> {_shown(new, missing)}")
    return lines


def _shown(value: Any, missing: object) -> str:
    return "(absent)" if value is missing else repr(value)


def stored_spec(store: TrajectoryStore, name: str) -> dict[str, Any]:
    """The spec the run started with, as stored; ``CorruptObject`` when it is missing or unreadable."""
    key = spec_key(name)
    try:
        text = store.get_spec()
    except (ObjectNotFound, TimeoutError):  # TimeoutError: no commit marker (waited 0 s for one)
        raise CorruptObject(f"the stored spec {key} of a run with progress is missing or incomplete") from None
    except CorruptObject as error:
        raise CorruptObject(f"the stored spec {key} is damaged ({error})") from None
    except UnicodeDecodeError as error:
        raise CorruptObject(f"the stored spec {key} is not UTF-8 text (byte {error.start})") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CorruptObject(f"the stored spec {key} is not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(document, dict):
        raise CorruptObject(f"the stored spec {key} is not a mapping")
    return document


def team_by_name(document: dict[str, Any], keep: set[str]) -> dict[str, Any]:
    """``document`` with ``spec.agents`` keyed by agent name, only the agents named in ``keep``,
    and without their ``suspend``: a resume compares an agent with the agent of the same name,
    wherever it sits in the list. Agents may join, leave and pause on resume (the steps' members
    are recorded in the store, ``store.membership``); an agent in both specs must be the same."""
    spec = dict(document.get("spec") or {})
    agents = spec.get("agents")
    if not isinstance(agents, list):
        return document
    spec["agents"] = {
        str(agent.get("name")): {key: value for key, value in agent.items() if key != "suspend"}
        for agent in agents
        if isinstance(agent, dict) and agent.get("name") in keep
    }
    return {**document, "spec": spec}


def agent_names(document: dict[str, Any]) -> set[str]:
    agents = (document.get("spec") or {}).get("agents")
    if not isinstance(agents, list):
        return set()
    return {str(a.get("name")) for a in agents if isinstance(a, dict)}


def check_resume(store: TrajectoryStore, name: str, rendered: str, spec_path: str) -> None:
    """Refuse (``ResumeRefused``) to resume the run ``name`` in ``store`` with the rendered spec
    ``rendered`` when a field outside ``RESUMABLE_FIELDS`` changed or the stored spec is unreadable."""
    try:
        previous = stored_spec(store, name)
    except CorruptObject as error:
        raise ResumeRefused(
            f"cannot resume {name!r}: {error}; without it the run's spec cannot be checked, so nothing was started. "
            f"Restore the store from a copy, or start afresh under a new metadata.name"
        ) from None
    current = yaml.safe_load(rendered)
    both = agent_names(previous) & agent_names(current)
    changes = changed_fields(team_by_name(previous, both), team_by_name(current, both))
    if changes:
        raise ResumeRefused(
            f"the spec of {name!r} changed since the run started ({spec_path}); resuming would mix two experiments in one "
            f"store prefix. Changed: {'; '.join(changes)}. Restore these fields, or use a new metadata.name "
            f"(fields that may change on resume: {', '.join(RESUMABLE_FIELDS)}; agents may be added, removed or "
            "suspended, but an existing agent (by name) must keep its settings)"
        )


def datasets_key(name: str) -> str:
    return f"{experiment_prefix(name)}/datasets.json"


def record_datasets(store: TrajectoryStore, name: str, reports: Sequence[DatasetReport]) -> None:
    """What each dataset gave this run: ``{field: {name, rows, sha256}}``."""
    record = {report.field: {"name": report.name, "rows": report.rows, "sha256": report.digest} for report in reports}
    put_committed(store.objects, datasets_key(name), json.dumps(record, indent=1, sort_keys=True).encode())


def check_datasets_unchanged(store: TrajectoryStore, name: str, reports: Sequence[DatasetReport]) -> None:
    """Refuse (``ResumeRefused``) to resume ``name`` when a dataset gives other rows than when the
    run started. A run recorded before datasets were is resumed as before: there is nothing to
    compare with."""
    key = datasets_key(name)
    try:
        recorded = json.loads(get_committed(store.objects, key))
        if not isinstance(recorded, dict):
            raise ValueError("not a mapping")
    except (ObjectNotFound, TimeoutError):  # TimeoutError: no commit marker: never recorded
        return
    except (CorruptObject, ValueError) as error:
        raise ResumeRefused(
            f"cannot resume {name!r}: the record of its datasets {key} is damaged ({error}); restore the store "
            "from a copy, or start afresh under a new metadata.name"
        ) from None
    changes = []
    for report in reports:
        before = recorded.get(report.field)
        if isinstance(before, dict) and before.get("sha256") not in (None, report.digest):
            changes.append(
                f"spec.{report.field} ({report.name}): {before.get('rows')} rows with sha256 {str(before['sha256'])[:12]} "
                f"when the run started, {report.rows} rows with sha256 {report.digest[:12]} now"
            )
    if changes:
        raise ResumeRefused(
            f"a dataset of {name!r} changed since the run started; resuming would train its later steps on other rows than its "
            f"earlier ones. Changed: {'; '.join(changes)}. Restore the data the run started with, or start afresh under a new "
            "metadata.name"
        )
