"""The status on the wire: the camelCase JSON the API server stores, read into the typed
``ExperimentStatus`` and written back as one JSON merge patch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from hacrl_core.status import ExperimentStatus
from hacrl_operator.status.limits import CONDITION_MESSAGE_BYTES, cut

# The top-level status keys the operator manages (kopf keeps its own bookkeeping elsewhere).
STATUS_KEYS = tuple(field.alias or name for name, field in ExperimentStatus.model_fields.items())

Status = ExperimentStatus | Mapping[str, Any]


def read_status(status: Status) -> ExperimentStatus:
    """The typed status of a status as stored. A key whose value is not what the CRD declares
    (edited by hand) reads as unset rather than failing every reconcile; keys that are not ours
    are ignored. Only keys present are set (``model_fields_set``): a new experiment has no phase."""
    if isinstance(status, ExperimentStatus):
        return status
    fields: dict[str, Any] = {}
    for key in STATUS_KEYS:
        value = status.get(key)
        if value is None:
            continue
        try:
            ExperimentStatus.model_validate({key: value})
        except ValidationError:
            continue
        fields[key] = value
    return ExperimentStatus.model_validate(fields)


def to_wire(status: Status) -> dict[str, Any]:
    """The stored form of a status: camelCase keys, the keys set (``model_fields_set``) only, no
    ``None`` values (the CRD declares them nullable, absence reads the same)."""
    if isinstance(status, Mapping):
        return {key: _drop_none(status.get(key)) for key in STATUS_KEYS if status.get(key) is not None}
    written = {ExperimentStatus.model_fields[name].alias or name for name in status.model_fields_set}
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    # Within the API's limits, however long a message grew (e.g. an InvalidSpec joining many errors).
    if "message" in dumped:
        dumped["message"] = cut(dumped["message"], CONDITION_MESSAGE_BYTES)
    for condition in dumped.get("conditions", []):
        condition["message"] = cut(condition.get("message", ""), CONDITION_MESSAGE_BYTES)
    return {key: value for key, value in dumped.items() if key in written}


def status_patch(old: Status, new: Status) -> dict[str, Any] | None:
    """A JSON merge patch of ``status`` from ``old`` to ``new``, or None when nothing changed.
    Managed keys that ``new`` does not have are set to None (a merge patch removes them)."""
    before, after = to_wire(old), to_wire(new)
    patch: dict[str, Any] = {}
    for key in STATUS_KEYS:
        if key not in after:
            if key in before:
                patch[key] = None
        elif before.get(key) != after[key]:
            patch[key] = after[key]
    return patch or None


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
