"""Generate the `HACRLExperiment` CustomResourceDefinition from the pydantic spec.

Kubernetes wants a *structural* OpenAPI v3 schema: no $ref, no anyOf for nullables, every
object typed. Pydantic emits JSON Schema 2020-12; ``to_structural`` translates the subset the
spec uses and fails loudly on anything else, so a new field type cannot slip in half-translated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from hacrl_core.spec import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    SHORT_NAME,
    ExperimentSpec,
)
from hacrl_core.status import ExperimentStatus

CRD_PATH = Path("charts/hacrl-operator/crds/hacrlexperiments.hacrl.io.yaml")
# The pod-override allow-list as the validations of the chart's ValidatingAdmissionPolicy.
ADMISSION_RULES_PATH = Path("charts/hacrl-operator/files/admission-rules.yaml")

_KEPT = (
    "type",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
)

# Rules on the whole object (CEL sees metadata.name there, and status next to spec).
EXPERIMENT_NAME_RULE = {
    "rule": "self.metadata.name.size() <= 40 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
    "message": "metadata.name must be a DNS label of at most 40 characters (lower-case letters, digits, '-'): it prefixes pod names and store keys",
}
_STARTED = "!has(oldSelf.status) || !has(oldSelf.status.startTime) || oldSelf.status.startTime == ''"


def _unchanged(path: str) -> str:
    return f"(has(self.{path}) == has(oldSelf.{path})) && (!has(self.{path}) || self.{path} == oldSelf.{path})"


def _replicas(agent: str) -> str:
    return f"(has({agent}.rollout) && has({agent}.rollout.replicas) ? {agent}.rollout.replicas : 1)"


# What must not change once the pods were first created (status.startTime): a different algorithm
# or data would mix two experiments in one store prefix; an agent's model (and with it its
# tokenizer) is what its checkpoints and rows were made with; a different rollout.replicas would
# slice a step's prompts one way in the parts already written and another in the rest. Agents may
# be added, removed and suspended at any time: the workers fix each step's members in the store
# (store/membership.py), so a step's team is recorded, never inferred from the spec.
# Before that, everything may be fixed in place (an invalid spec, a typo); resources, scheduling
# and pod templates may always change.
_SAME_AGENT = "oldSelf.spec.agents.exists(o, o.name == a.name)"
IMMUTABLE_RULES = [
    {
        "rule": f"{_STARTED} || self.spec.agents.all(a, !{_SAME_AGENT} || "
        "oldSelf.spec.agents.exists(o, o.name == a.name && o.model == a.model))",
        "message": "spec.agents[].model of an existing agent cannot change once the experiment started (its checkpoints, "
        "rows and tokenizer are that model's); add an agent under a new name instead",
    },
    {
        "rule": f"{_STARTED} || self.spec.agents.all(a, !{_SAME_AGENT} || "
        f"oldSelf.spec.agents.exists(o, o.name == a.name && {_replicas('o')} == {_replicas('a')}))",
        "message": "spec.agents[].rollout.replicas of an existing agent cannot change once the experiment started (each step's "
        "prompts are sliced by it, and the parts already written were sliced by the old count); create a new experiment",
    },
    {
        "rule": f"{_STARTED} || ({_unchanged('spec.algorithm')})",
        "message": "spec.algorithm cannot change once the experiment started; create a new experiment",
    },
    {
        "rule": f"{_STARTED} || self.spec.data == oldSelf.spec.data",
        "message": "spec.data cannot change once the experiment started; create a new experiment",
    },
]


def to_structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-Schema node as a structural OpenAPI v3 node (refs inlined, nullables flattened)."""
    description = schema.get("description")
    if "$ref" in schema:
        referenced = to_structural(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
        if description:
            referenced["description"] = description
        return referenced
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf with several non-null options structurally: {schema}")
        option = to_structural(options[0], defs)
        # OpenAPI's enum applies to null too (nullable only widens the type), so a nullable enum
        # without null would refuse the null it allows. Such a field is left non-nullable: the API
        # server prunes a null there, which then reads as absent, the spec's None.
        if "enum" not in option:
            option["nullable"] = True
        if description:
            option["description"] = description
        return option
    if "const" in schema:
        schema = {**schema, "enum": [schema["const"]]}
        schema.setdefault("type", "string")

    node: dict[str, Any] = {key: schema[key] for key in _KEPT if key in schema}
    # Schema defaults, so the API server fills them in (`kubectl get -o yaml` shows what runs);
    # only plain values: objects default through their own fields' defaults.
    if schema.get("default") is not None and not isinstance(schema["default"], dict):
        node["default"] = schema["default"]
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if exclusive in schema:
            node[inclusive] = schema[exclusive]
            node[exclusive] = True
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties:
            node["properties"] = {name: to_structural(sub, defs) for name, sub in properties.items()}
            if schema.get("required"):
                node["required"] = list(schema["required"])
        elif isinstance(extra, dict) and extra:
            node["additionalProperties"] = to_structural(extra, defs)
        else:
            # Free-form Kubernetes objects (resources, affinity, pod overrides).
            node["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        if "prefixItems" in schema:  # fixed-length tuples such as ratioBounds
            item_types = {item.get("type") for item in schema["prefixItems"]}
            if len(item_types) != 1:
                raise ValueError(f"tuple with mixed item types is not structural: {schema}")
            node["items"] = {"type": item_types.pop()}
            node["minItems"] = node["maxItems"] = len(schema["prefixItems"])
        elif "items" in schema:
            node["items"] = to_structural(schema["items"], defs)
        else:
            raise ValueError(f"array without items is not structural: {schema}")
    elif kind is None and "enum" not in node:
        raise ValueError(f"schema node without a type is not structural: {schema}")
    if kind is None and "enum" in node:
        node["type"] = "integer" if all(isinstance(v, int) for v in node["enum"]) else "string"
    return node


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return to_structural(schema, schema.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(ExperimentSpec)
    status_schema = openapi_schema(ExperimentStatus)
    # kopf keeps its own bookkeeping under status (kopf #574): do not let the server prune it.
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
                        {"name": "Steps", "type": "integer", "jsonPath": ".spec.algorithm.steps"},
                        {"name": "Agents", "type": "integer", "jsonPath": ".status.agents"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A team of heterogeneous language-model agents trained together with HACPO.",
                            "required": ["spec"],
                            "x-kubernetes-validations": [EXPERIMENT_NAME_RULE, *IMMUTABLE_RULES],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd() -> str:
    header = "# Generated by `hacrl crd` from hacrl_core/spec/; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def render_admission_rules() -> str:
    from hacrl_core.pod_policy import admission_rules

    header = "# Generated by `hacrl crd` from hacrl_core/pod_policy.py; do not edit by hand.\n"
    return header + yaml.safe_dump(admission_rules(), sort_keys=False, width=100000)


def generated_files() -> list[tuple[Path, str]]:
    """Every chart file generated from the spec: ``(path, text)``."""
    return [(CRD_PATH, render_crd()), (ADMISSION_RULES_PATH, render_admission_rules())]
