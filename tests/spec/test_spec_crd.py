"""The committed CRD equals the one generated from the spec models, and it is structural."""

import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from hacrl_core.crd import CRD_PATH, build_crd, render_crd
from tests.support.crd_schema import openapi_to_jsonschema

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_generated():
    committed = (ROOT / CRD_PATH).read_text(encoding="utf-8")
    assert committed == render_crd(), "run `hacrl crd` and commit the result"


def test_check_flag_fails_on_drift(tmp_path):
    stale = tmp_path / "crd.yaml"
    stale.write_text("stale\n")
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "crd", "--check", "-o", str(stale)], capture_output=True, text=True
    )
    assert result.returncode == 1 and "out of date" in result.stderr


def walk(node, path="$"):
    yield path, node
    for key in ("properties",):
        for name, child in node.get(key, {}).items():
            yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node, f"{path} has no type"
        if node["type"] == "object" and path != "$.metadata":  # the API server owns metadata's schema
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), path


def test_crd_names_and_printer_columns():
    crd = build_crd()
    assert crd["spec"]["names"]["shortNames"] == ["hx"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Step", "Steps", "Agents", "Age"]


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate_against_crd_schema(example):
    schema = openapi_to_jsonschema(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.validate(yaml.safe_load(example.read_text()), schema)


def test_crd_schema_rejects_bad_manifest():
    schema = openapi_to_jsonschema(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    document = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    document["spec"]["algorithm"]["groupSize"] = 1
    with pytest.raises(jsonschema.ValidationError, match="groupSize|less than the minimum"):
        jsonschema.validate(document, schema)
