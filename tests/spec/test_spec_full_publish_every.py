"""`agents[].learner.fullPublishEvery` (docs/architecture.md, "Weight publishes"): its default, its
bounds refused naming the field, and the CRD carrying the same bounds."""

from __future__ import annotations

import pytest

from hacrl_core.crd import build_crd
from hacrl_core.spec import SpecError, parse_experiment


def document(learner: dict) -> dict:
    return {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": "fpe"},
        "spec": {
            "agents": [{"name": "a", "model": "tiny://llama-char", "learner": learner}],
            "algorithm": {"name": "gspo"},
            "data": {"train": {"source": "builtin://arithmetic"}},
        },
    }


def test_default_is_a_full_publish_every_10_versions() -> None:
    assert parse_experiment(document({})).spec.agents[0].learner.full_publish_every == 10
    assert parse_experiment(document({"fullPublishEvery": 1})).spec.agents[0].learner.full_publish_every == 1


@pytest.mark.parametrize("value", [0, -3, 1001, "10", True])
def test_out_of_range_or_not_an_int_is_refused_naming_the_field(value) -> None:
    with pytest.raises(SpecError) as caught:
        parse_experiment(document({"fullPublishEvery": value}), "bad.yaml")
    assert any(line.startswith("spec.agents[0].learner.fullPublishEvery:") for line in caught.value.errors), (
        caught.value.errors
    )


def test_the_crd_has_the_same_bounds() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    learner = schema["properties"]["spec"]["properties"]["agents"]["items"]["properties"]["learner"]["properties"]
    field = learner["fullPublishEvery"]
    assert (field["minimum"], field["maximum"], field["default"]) == (1, 1000, 10)
    assert "delta" in field["description"]
