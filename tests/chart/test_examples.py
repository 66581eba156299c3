"""Every manifest under examples/ is a valid experiment (the CRD's schema and `hacrl validate`),
and bad manifests are rejected with the field named."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from hacrl_core.crd import build_crd
from hacrl_core.spec import SpecError, load_experiment, parse_experiment
from tests.chart.rendering import ROOT
from tests.support.crd_schema import openapi_to_jsonschema
from tests.support.documents import DELETE, set_path

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SCHEMA = openapi_to_jsonschema(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def test_the_deployment_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"kind-tiny.yaml", "gpu-qwen3-llama.yaml"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(example: Path):
    document = yaml.safe_load(example.read_text())
    jsonschema.validate(document, SCHEMA)
    load_experiment(example)  # what `hacrl validate` runs


def test_hacrl_validate_cli_accepts_every_example():
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", *map(str, EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == len(EXAMPLES)
    # Only kind-tiny names no store: validate says what that means here and on a cluster.
    assert result.stdout.count("no spec.store:") == 1
    assert (
        "no spec.store: `hacrl run` uses file://./runs; the operator fills in its install's default store"
        in result.stdout
    )


def test_gpu_example_runs_today_and_asks_for_gpus():
    experiment = load_experiment(ROOT / "examples" / "gpu-qwen3-llama.yaml")
    for agent in experiment.spec.agents:
        assert agent.rollout.engine == "hf"  # runs without vLLM's GPU requirements
        for role in ("rollout", "learner"):
            assert getattr(agent.resources, role)["limits"]["nvidia.com/gpu"] >= 1
    assert experiment.spec.store.uri.startswith("s3://") and experiment.spec.store.credentials_secret
    assert experiment.spec.scheduling.tolerations and experiment.spec.scheduling.node_selector


def test_no_example_draws_a_warning():
    """E.g. the torch backend in bfloat16, which keeps no fp32 master weights: at the paper's lr 1e-6
    most updates round away (docs/scaling.md 3.2). bf16 examples train with DeepSpeed, which keeps them."""
    for path in EXAMPLES:
        assert load_experiment(path).spec.warnings() == [], path.name


def test_kind_example_is_cpu_and_takes_the_default_store():
    """kind-tiny names no store: the operator fills in the install's (the in-chart MinIO's, whose
    names do not depend on the release; tests/chart/test_chart_render.py checks them)."""
    experiment = load_experiment(ROOT / "examples" / "kind-tiny.yaml")
    assert all(a.model.startswith("tiny://") for a in experiment.spec.agents)
    assert not any("nvidia.com/gpu" in str(a.resources) for a in experiment.spec.agents)
    assert "store" not in experiment.spec.model_fields_set


def test_quickstart_is_heterogeneous_on_worked_chains_with_an_honest_eval_set():
    """The quickstart's agents differ in architecture and tokenizer, warm-start on worked chains of
    the difficulty they train and are evaluated on, and the eval set has at least 200 problems
    (the training run itself is timed by hand: examples/quickstart.yaml's header)."""
    from urllib.parse import parse_qs, urlparse

    from hacrl_core.models.tiny import get_preset, parse_tiny_uri

    spec = load_experiment(ROOT / "examples" / "quickstart.yaml").spec
    assert [a.name for a in spec.agents] == ["llama-char", "qwen-bpe"]  # the names docs and tests use
    builds = [parse_tiny_uri(a.model) for a in spec.agents]
    presets = [get_preset(b["preset"]) for b in builds]
    assert len({p.architecture for p in presets}) == 2 and len({p.tokenizer for p in presets}) == 2
    difficulty = parse_qs(urlparse(spec.data.train.source).query)["difficulty"][0]
    for build in builds:
        query = parse_qs(urlparse(build["task_spec"]).query)
        assert query["format"] == ["chain"]
        assert query["difficulty"][0] in (difficulty, f"{difficulty}-{difficulty}")
    assert all(a.rollout.max_new_tokens >= 32 for a in spec.agents)  # two-step chains are ~22 characters
    (evaluation,) = spec.data.eval
    assert evaluation.max_prompts >= 200 and "split=eval" in evaluation.source
    assert parse_qs(urlparse(evaluation.source).query)["difficulty"] == [difficulty]
    assert spec.algorithm.name == "hacpo"


# (id, path to change in examples/kind-tiny.yaml, new value, field named by the CRD schema, field named by `hacrl validate`)
BAD = [
    ("group-size-1", "spec.algorithm.groupSize", 1, "groupSize", "spec.algorithm.groupSize"),
    ("unknown-engine", "spec.agents.0.rollout.engine", "sglang", "engine", "spec.agents[0].rollout.engine"),
    ("unknown-backend", "spec.agents.1.learner.backend", "jax", "backend", "spec.agents[1].learner.backend"),
    ("typo-in-field", "spec.algorithm.stepz", 3, "stepz", "spec.algorithm.stepz"),
    ("negative-lr", "spec.agents.0.learner.lr", -1.0, "lr", "spec.agents[0].learner.lr"),
    ("top-p-above-1", "spec.agents.0.rollout.topP", 1.5, "topP", "spec.agents[0].rollout.topP"),
    ("no-agents", "spec.agents", [], "agents", "spec.agents"),
    ("agent-without-model", "spec.agents.0.model", DELETE, "model", "spec.agents[0].model"),
    ("bad-cleanup", "spec.cleanup.onSuccess", "explode", "onSuccess", "spec.cleanup.onSuccess"),
    ("bad-pull-policy", "spec.images.pullPolicy", "Sometimes", "pullPolicy", "spec.images.pullPolicy"),
    ("metrics-port-too-high", "spec.metrics.port", 70000, "port", "spec.metrics.port"),
    ("restart-limit-negative", "spec.restartLimit", -1, "restartLimit", "spec.restartLimit"),
    ("unknown-reward", "spec.data.reward", "fuzzy", "reward", "spec.data.reward"),
    ("store-as-string", "spec.store", "s3://hacrl", "store", "spec.store"),
]


@pytest.mark.parametrize(("path", "value", "schema_field", "spec_field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_manifest_is_rejected_naming_the_field(path, value, schema_field, spec_field):
    document = set_path(copy.deepcopy(yaml.safe_load((ROOT / "examples" / "kind-tiny.yaml").read_text())), path, value)
    with pytest.raises(jsonschema.ValidationError) as schema_error:
        jsonschema.validate(document, SCHEMA)
    error = schema_error.value
    assert schema_field in "/".join(map(str, error.absolute_path)) + " " + error.message, error
    with pytest.raises(SpecError) as spec_error:
        parse_experiment(document, "bad.yaml")
    assert any(line.startswith(spec_field) for line in spec_error.value.errors), spec_error.value.errors


def test_bad_manifest_fails_the_cli(tmp_path):
    document = yaml.safe_load((ROOT / "examples" / "gpu-qwen3-llama.yaml").read_text())
    document["spec"]["agents"][0]["resources"]["rollout"] = "one gpu please"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [sys.executable, "-m", "hacrl_core.cli", "validate", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "spec.agents[0].resources.rollout" in result.stderr


GATED = ("meta-llama/",)  # hub organisations whose models need an accepted licence and a token
GPU_EXAMPLES = [p for p in EXAMPLES if "nvidia.com/gpu" in p.read_text()]


@pytest.mark.parametrize("example", GPU_EXAMPLES, ids=lambda p: p.name)
def test_gated_models_get_the_token_and_gpu_pods_ask_for_local_disk(example: Path):
    """A gated Llama needs spec.modelTokenSecret (HF_TOKEN in every pod), and every pod of a real
    model asks for the local disk its download, checkpoint staging and weights need (issue 15 item 4)."""
    spec = load_experiment(example).spec
    if any(agent.model.startswith(GATED) for agent in spec.agents):
        assert spec.model_token_secret, f"{example.name}: a gated model without spec.modelTokenSecret"
    for agent in spec.agents:
        for role in ("rollout", "learner"):
            resources = getattr(agent.resources, role)
            assert resources["requests"].get("ephemeral-storage") and resources["limits"].get("ephemeral-storage"), (
                example.name,
                agent.name,
                role,
            )
