"""Every name pattern the spec checks agrees with the CRD's on hostile strings: what `hacrl
validate` accepts, the API server accepts, and the other way round.

The CRD's ``pattern`` is read as the API server reads it (RE2: ``$`` ends the text); Python's ``$``
also matches before a final newline, which let ``name: "llama-char\\n"`` validate locally while
the API server refused it (issue 35).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from hacrl_core.crd import render_crd
from hacrl_core.spec import SpecError, parse_experiment
from tests.integration.runs import tiny_spec

HOSTILE = [
    "llama-char",
    "llama-char\n",
    "llama-char\n\n",
    "\nllama-char",
    "llama-char\r\n",
    "llama char",
    "llama\tchar",
    "",
    "a",
    "-a",
    "a-",
    "A",
    "a.b",
    "a..b",
    ".a",
    "a_b",
    "a/b",
    "../../x",
    "x\x00",
    "é",
    "日本",
    "a" * 41,
    "a" * 64,
    "a" * 254,
    "key.name_1",
    "_x",
    "9x",
    "x:y",
    "a\u2028",
    "ok\u00a0",
]

BASE = tiny_spec("patterns", "file:///tmp/patterns-store")


def spec_with(value: str, put: Callable[[dict], None]) -> dict:
    document = copy.deepcopy(BASE)
    put(document["spec"])
    return document


def _key_ref(kind: str, field: str) -> Callable[[str], Callable[[dict], None]]:
    def setter(value: str) -> Callable[[dict], None]:
        ref = {"name": "cfg", "key": "k", field: value}
        return lambda spec: spec.update(env=[{"name": "V", "valueFrom": {kind: ref}}])

    return setter


# Where each patterned field of the CRD lives in a spec: a function of the value that sets it.
SETTERS: dict[str, Callable[[str], Callable[[dict], None]]] = {
    "spec.agents[].name": lambda v: lambda spec: spec["agents"][0].update(name=v),
    "spec.agents[].modelCache.claimName": lambda v: lambda spec: spec["agents"][0].update(modelCache={"claimName": v}),
    "spec.env[].name": lambda v: lambda spec: spec.update(env=[{"name": v, "value": "1"}]),
    "spec.env[].valueFrom.configMapKeyRef.name": _key_ref("configMapKeyRef", "name"),
    "spec.env[].valueFrom.configMapKeyRef.key": _key_ref("configMapKeyRef", "key"),
    "spec.env[].valueFrom.secretKeyRef.name": _key_ref("secretKeyRef", "name"),
    "spec.env[].valueFrom.secretKeyRef.key": _key_ref("secretKeyRef", "key"),
    "spec.envFrom[].configMapRef.name": lambda v: lambda spec: spec.update(envFrom=[{"configMapRef": {"name": v}}]),
    "spec.envFrom[].secretRef.name": lambda v: lambda spec: spec.update(envFrom=[{"secretRef": {"name": v}}]),
    "spec.modelCache.claimName": lambda v: lambda spec: spec.update(modelCache={"claimName": v}),
    "spec.data.reward": lambda v: lambda spec: spec["data"].update(reward=v),
    "spec.tracking.mlflow.trackingUri": lambda v: lambda spec: spec.update(tracking={"mlflow": {"trackingUri": v}}),
    "spec.tracking.wandb.project": lambda v: lambda spec: spec.update(tracking={"wandb": {"project": v}}),
    "spec.agents[].learner.lora.targetModules[]": lambda v: (
        lambda spec: spec["agents"][0].update(learner={"lora": {"targetModules": [v]}})
    ),
}


def patterned_fields() -> dict[str, dict[str, Any]]:
    """CRD field path -> its schema, for every field of spec with a ``pattern``."""
    crd = yaml.safe_load(render_crd())
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        if "pattern" in node:
            found[path] = node
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}" if path else name)
        if "items" in node:
            walk(node["items"], f"{path}[]")
        for sub in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
            walk(sub, path)

    walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec")
    return found


def crd_accepts(schema: dict[str, Any], value: str) -> bool:
    """The API server's reading: RE2 search, ``$`` only at the end of the text; maxLength in characters."""
    pattern = re.sub(r"\$$", r"\\Z", schema["pattern"])
    return (
        re.search(pattern, value) is not None
        and len(value) <= schema.get("maxLength", len(value))
        and len(value) >= schema.get("minLength", 0)
    )


def spec_accepts(path: str, value: str) -> bool:
    try:
        parse_experiment(spec_with(value, SETTERS[path](value)))
    except SpecError as error:
        assert any(line.startswith(path.replace("[]", "[0]")) for line in error.errors), error
        return False
    return True


def test_every_patterned_crd_field_is_checked_here() -> None:
    assert set(patterned_fields()) == set(SETTERS), "add the new patterned field to SETTERS"


@pytest.mark.parametrize("path", sorted(SETTERS))
def test_spec_and_crd_agree_on_hostile_strings(path: str) -> None:
    schema = patterned_fields()[path]
    disagreements = [
        (value, crd_accepts(schema, value))
        for value in HOSTILE
        if spec_accepts(path, value) != crd_accepts(schema, value)
    ]
    assert not disagreements, f"{path}: (value, CRD accepts) where `hacrl validate` says otherwise: {disagreements}"


@pytest.mark.parametrize(
    "put",
    [
        lambda spec: spec["store"].update(credentialsSecret="hacrl-store\n"),
        lambda spec: spec.update(modelTokenSecret="hf-token\n"),
        lambda spec: spec["store"].update(uri="s3://bucket/p", endpoint="http://minio:9000\n"),
        lambda spec: spec.update(scheduling={"gang": "kueue", "queueName": "q\n"}),
    ],
    ids=["credentialsSecret", "modelTokenSecret", "endpoint", "queueName"],
)
def test_names_checked_only_here_refuse_a_trailing_newline(put) -> None:
    with pytest.raises(SpecError, match=r"\\n"):
        parse_experiment(spec_with("", put))


def test_two_agents_differing_by_a_newline_are_refused() -> None:
    document = copy.deepcopy(BASE)
    document["spec"]["agents"][1]["name"] = "llama\n"
    with pytest.raises(SpecError, match=r"spec.agents\[1\].name"):
        parse_experiment(document)
