"""The pod-override allow-list, as `hacrl validate` applies it and as the chart's
ValidatingAdmissionPolicy does: every case is run through both, and they must agree.

The policy's CEL is evaluated with cel-python on the committed chart file (the rules the API
server would get), so an allow-list change that is not regenerated (`hacrl crd`), or a CEL rule
that lets through what Python refuses, fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from hacrl_core.crd import ADMISSION_RULES_PATH, render_admission_rules
from hacrl_core.pod_policy import override_problems

ROOT = Path(__file__).resolve().parents[2]
RULES = yaml.safe_load((ROOT / ADMISSION_RULES_PATH).read_text())

# (case, override of the learner pod, the path Python names first, or None when it is allowed).
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    # What the issue reproduced getting through the old deny-list:
    (
        "capabilities-not-dropped",
        {"containers": [{"name": "learner", "securityContext": {"capabilities": {"drop": []}}}]},
        "containers[0].securityContext.capabilities",
    ),
    ("secret-volume", {"volumes": [{"name": "s", "secret": {"secretName": "other-team"}}]}, "volumes[0].secret"),
    (
        "projected-secret",
        {"volumes": [{"name": "s", "projected": {"sources": [{"secret": {"name": "other-team"}}]}}]},
        "volumes[0].projected",
    ),
    (
        "service-account-token",
        {"serviceAccountName": "deployer", "automountServiceAccountToken": True},
        "serviceAccountName",
    ),
    (
        "host-port",
        {"containers": [{"name": "learner", "ports": [{"containerPort": 80, "hostPort": 80}]}]},
        "containers[0].ports[0].hostPort",
    ),
    (
        "proc-mount",
        {"containers": [{"name": "learner", "securityContext": {"procMount": "Unmasked"}}]},
        "containers[0].securityContext.procMount",
    ),
    ("nfs-volume", {"volumes": [{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]}, "volumes[0].nfs"),
    ("node-name", {"nodeName": "gpu-node-1"}, "nodeName"),
    (
        "sysctls",
        {"securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]}},
        "securityContext.sysctls",
    ),
    # Secrets and other ways around the lock-down:
    (
        "secret-env",
        {
            "containers": [
                {"name": "learner", "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}]}
            ]
        },
        "containers[0].env[0].valueFrom.secretKeyRef",
    ),
    (
        "secret-env-from",
        {"containers": [{"name": "learner", "envFrom": [{"secretRef": {"name": "x"}}]}]},
        "containers[0].envFrom[0].secretRef",
    ),
    ("image-pull-secret", {"imagePullSecrets": [{"name": "x"}]}, "imagePullSecrets"),
    (
        "privileged-sidecar",
        {"containers": [{"name": "side", "image": "s", "securityContext": {"privileged": True}}]},
        "containers[0].securityContext.privileged",
    ),
    (
        "root-init-container",
        {"initContainers": [{"name": "init", "image": "i", "securityContext": {"runAsUser": 0}}]},
        "initContainers[0].securityContext.runAsUser",
    ),
    ("root-pod", {"securityContext": {"runAsUser": 0}}, "securityContext.runAsUser"),
    ("non-root-off", {"securityContext": {"runAsNonRoot": False}}, "securityContext.runAsNonRoot"),
    (
        "escalation",
        {"containers": [{"name": "learner", "securityContext": {"allowPrivilegeEscalation": True}}]},
        "containers[0].securityContext.allowPrivilegeEscalation",
    ),
    ("host-network", {"hostNetwork": True}, "hostNetwork"),
    ("host-path", {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "volumes[0].hostPath"),
    ("ephemeral-container", {"ephemeralContainers": [{"name": "debug", "image": "busybox"}]}, "ephemeralContainers"),
    ("two-volume-sources", {"volumes": [{"name": "v", "emptyDir": {}, "configMap": {"name": "c"}}]}, "volumes[0]"),
    ("restart-policy", {"restartPolicy": "Always"}, "restartPolicy"),
    # What users legitimately need passes:
    (
        "scheduling",
        {
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {}},
            "priorityClassName": "training",
            "runtimeClassName": "nvidia",
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
        },
        None,
    ),
    (
        "configmap-env-and-cache-pvc",
        {
            "containers": [
                {
                    "name": "learner",
                    "env": [
                        {"name": "NCCL_DEBUG", "value": "INFO"},
                        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "x"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    ],
                    "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "APP_"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
            "volumes": [
                {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
                {"name": "data", "configMap": {"name": "d"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
            ],
        },
        None,
    ),
    (
        "sidecar-without-security-context",
        {
            "containers": [
                {"name": "log-shipper", "image": "fluent-bit:3", "ports": [{"name": "m", "containerPort": 2020}]}
            ],
            "initContainers": [{"name": "warm", "image": "w", "command": ["sh", "-c", "true"]}],
        },
        None,
    ),
    (
        "locked-values-repeated",
        {
            "securityContext": {"runAsNonRoot": True, "fsGroup": 2000, "runAsUser": 2000},
            "containers": [
                {
                    "name": "learner",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                        "runAsUser": 2000,
                    },
                }
            ],
        },
        None,
    ),
    ("delete-a-default", {"enableServiceLinks": None}, None),
    (
        "labels-and-annotations",
        {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu"}, "annotations": {"team": "a"}}},
        None,
    ),
    ("metadata-name", {"metadata": {"name": "other-pod"}}, "metadata.name"),
]


def experiment_object(override: dict[str, Any], role: str = "learner") -> dict[str, Any]:
    return {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": "x"},
        "spec": {"agents": [{"name": "a", "model": "m"}, {"name": "b", "model": "m", "podTemplate": {role: override}}]},
    }


def admission_denials(document: dict[str, Any]) -> list[str]:
    """Messages of the policy's validations that refuse ``document`` (false or an evaluation error,
    which `failurePolicy: Fail` also turns into a refusal)."""
    env = celpy.Environment()
    denied = []
    for rule in RULES:
        program = env.program(env.compile(rule["expression"]))
        try:
            allowed = program.evaluate({"object": celpy.json_to_cel(document)})
        except celpy.CELEvalError:
            allowed = False
        if isinstance(allowed, celpy.CELEvalError) or not bool(allowed):
            denied.append(rule["message"])
    return denied


@pytest.mark.parametrize(("case", "override", "first_path"), CASES, ids=[c[0] for c in CASES])
def test_python_check_and_admission_policy_agree(case: str, override: dict[str, Any], first_path: str | None) -> None:
    problems = override_problems(override)
    denied = admission_denials(experiment_object(override))
    if first_path is None:
        assert problems == [] and denied == [], (problems, denied)
    else:
        assert problems and problems[0][0] == first_path, problems
        assert denied, f"the admission policy lets {case} through"
    rollout = admission_denials(experiment_object(override, role="rollout"))
    assert bool(rollout) == bool(denied), "both roles get the same rules"


def test_documents_without_pod_templates_are_admitted() -> None:
    assert admission_denials({"spec": {"agents": [{"name": "a", "model": "m"}]}}) == []
    assert admission_denials({"spec": {}}) == []
    assert admission_denials({"spec": {"agents": [{"name": "a", "model": "m", "podTemplate": {}}]}}) == []


def test_secret_problems_point_to_the_first_class_fields() -> None:
    ((_, problem),) = override_problems(
        {"containers": [{"name": "rollout", "envFrom": [{"secretRef": {"name": "x"}}]}]}
    )
    assert (
        "spec.modelTokenSecret" in problem
        and "spec.envFrom[].secretRef" in problem
        and "approved by the cluster admin" in problem
    )
    ((_, problem),) = override_problems({"serviceAccountName": "x"})
    assert "without a service account token" in problem


def test_committed_rules_are_the_generated_ones() -> None:
    assert (ROOT / ADMISSION_RULES_PATH).read_text() == render_admission_rules(), (
        "run `hacrl crd` and commit the result"
    )
