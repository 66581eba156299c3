"""The generated CRD's schema as the tests read it: as JSON Schema, and its CEL rules by path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def openapi_to_jsonschema(node):
    """Enough of OpenAPI v3 -> JSON Schema (nullable, boolean exclusive bounds) to validate manifests."""
    if isinstance(node, dict):
        out = {k: openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        if out.pop("nullable", False) and "type" in out:
            out["type"] = [out["type"], "null"]
        for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if out.get(exclusive) is True:
                out[exclusive] = out.pop(inclusive)
        if (
            node.get("type") == "object"
            and "properties" in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    return node


def rules(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    """Every CEL rule (``x-kubernetes-validations``) of ``schema`` with the path of its node."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in (schema.get("properties") or {}).items():
        yield from rules(sub, (*path, name))
    if "items" in schema:
        yield from rules(schema["items"], (*path, "*"))
