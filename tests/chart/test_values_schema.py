"""Bad values fail at install time, and the error names the value to fix.

values.schema.json catches types, ranges, patterns and unknown keys; template `fail` calls catch
combinations. Each row: the --set/--set-json arguments and what helm's error must contain.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from tests.chart.rendering import CHART, run_helm, template_args

SCHEMA_CASES = [
    # (id, arguments, the field path helm must name)
    ("unknown-top-level-key", ["--set", "watchNamespace=ml"], "additional properties 'watchNamespace'"),
    ("unknown-nested-key", ["--set", "minio.enable=true"], "additional properties 'enable'"),
    ("metrics-port-not-a-number", ["--set", "metrics.port=abc"], "/metrics/port"),
    ("metrics-port-too-high", ["--set", "metrics.port=70000"], "/metrics/port"),
    ("health-port-zero", ["--set", "health.port=0"], "/health/port"),
    ("negative-reconcile-interval", ["--set", "reconcileInterval=-1"], "/reconcileInterval"),
    ("zero-reconcile-interval", ["--set", "reconcileInterval=0"], "/reconcileInterval"),
    ("reconcile-interval-words", ["--set", "reconcileInterval=soon"], "/reconcileInterval"),
    ("bad-namespace-name", ["--set-json", 'watchNamespaces=["Team_A"]'], "/watchNamespaces/0"),
    ("namespaces-not-a-list", ["--set", "watchNamespaces=team-a"], "/watchNamespaces"),
    ("duplicate-namespaces", ["--set-json", 'watchNamespaces=["a","a"]'], "/watchNamespaces"),
    ("empty-operator-repository", ["--set", "images.operator.repository="], "/images/operator/repository"),
    ("image-tag-with-space", ["--set-string", "images.learner.tag=1 2"], "/images/learner/tag"),
    ("bad-digest", ["--set", "images.rollout.digest=md5:abc"], "/images/rollout/digest"),
    ("bad-pull-policy", ["--set", "images.operator.pullPolicy=Sometimes"], "/images/operator/pullPolicy"),
    ("root-worker-uid", ["--set", "workerRunAsUser=0"], "/workerRunAsUser"),
    ("bad-memory-quantity", ["--set", "resources.limits.memory=lots"], "/resources/limits/memory"),
    ("minio-enabled-not-bool", ["--set-string", "minio.enabled=yes"], "/minio/enabled"),
    ("bad-bucket-name", ["--set", "minio.bucket=Bad_Bucket"], "/minio/bucket"),
    ("bad-scrape-interval", ["--set", "metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
    ("store-endpoint-not-a-url", ["--set", "store.endpoint=minio:9000"], "/store/endpoint"),
    ("default-store-not-s3", ["--set", "defaultStore.uri=file://./runs"], "/defaultStore/uri"),
    (
        "default-store-endpoint-not-a-url",
        ["--set", "defaultStore.uri=s3://runs", "--set", "defaultStore.endpoint=minio:9000"],
        "/defaultStore/endpoint",
    ),
    (
        "default-store-bad-secret-name",
        ["--set", "defaultStore.uri=s3://runs", "--set", "defaultStore.credentialsSecret=S3_Keys"],
        "/defaultStore/credentialsSecret",
    ),
    ("service-type", ["--set", "metrics.service.type=Ingress"], "/metrics/service/type"),
]

FAIL_CASES = [
    # (id, arguments, the message (naming the value path) the template's `fail` gives)
    (
        "service-monitor-without-metrics",
        ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.port=0"],
        "metrics.serviceMonitor.enabled=true needs the operator's metrics: set metrics.port",
    ),
    (
        "service-monitor-without-service",
        ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"],
        "set metrics.service.enabled=true",
    ),
    (
        "client-timeout-below-server",
        ["--set", "watchTimeouts.client=100"],
        "watchTimeouts.client (100) must be greater than watchTimeouts.server (300)",
    ),
    ("same-health-and-metrics-port", ["--set", "health.port=8081"], "health.port and metrics.port are both 8081"),
    (
        "secret-copies-with-existing-secret",
        [
            "--set",
            "minio.enabled=true",
            "--set",
            "minio.existingSecret=mine",
            "--set-json",
            'minio.secretNamespaces=["default"]',
        ],
        "minio.secretNamespaces copies only a generated Secret",
    ),
    (
        "secret-copies-without-minio",
        ["--set-json", 'minio.secretNamespaces=["default"]'],
        "minio.secretNamespaces is set but minio.enabled is false",
    ),
    (
        "default-store-fields-without-uri",
        ["--set", "defaultStore.endpoint=http://minio.storage:9000"],
        "defaultStore.endpoint, defaultStore.region and defaultStore.credentialsSecret need defaultStore.uri",
    ),
    (
        "no-service-account-name",
        ["--set", "serviceAccount.create=false"],
        "serviceAccount.name is required when serviceAccount.create is false",
    ),
]


@pytest.mark.parametrize(("args", "field"), [c[1:] for c in SCHEMA_CASES], ids=[c[0] for c in SCHEMA_CASES])
def test_schema_rejects_bad_values(args, field):
    result = run_helm(*template_args(extra=tuple(args)), check=False)
    assert result.returncode != 0, f"helm accepted {args}"
    assert "don't meet the specifications of the schema" in result.stderr, result.stderr
    assert field in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "message"), [c[1:] for c in FAIL_CASES], ids=[c[0] for c in FAIL_CASES])
def test_templates_reject_bad_combinations(args, message):
    result = run_helm(*template_args(extra=tuple(args)), check=False)
    assert result.returncode != 0, f"helm accepted {args}"
    assert message in result.stderr, result.stderr


def test_defaults_and_documented_values_satisfy_the_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()) or {}, _merge_free(schema))


def _merge_free(schema):
    """The schema without `required` (a ci/ file holds only the values it changes)."""
    if isinstance(schema, dict):
        return {k: _merge_free(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_merge_free(v) for v in schema]
    return schema


def test_every_value_is_documented_in_place():
    """Each leaf of values.yaml has a `# --` comment block above it or above one of its parent keys
    (KubeRay style), read by the same walker that puts them into values.schema.json."""
    from tests.chart.test_values_schema_generated import gen

    text = (CHART / "values.yaml").read_text()
    documented = set(gen.comments(text))

    def leaves(value, path=()):
        if isinstance(value, dict) and value:
            for key, child in value.items():
                yield from leaves(child, (*path, key))
        else:
            yield path

    undocumented = [
        ".".join(path)
        for path in leaves(yaml.safe_load(text))
        if not any(path[:n] in documented for n in range(1, len(path) + 1))
    ]
    assert not undocumented, "values without a `# --` comment:\n" + "\n".join(undocumented)
