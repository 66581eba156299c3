"""Integration: kopf runs the operator against the kmock API server; the real kubectl drives it.

Nothing runs pods in the emulator: the tests play kubelet by patching pod status with kubectl,
and play the learner by writing `progress/<agent>.json` heartbeats to a file:// store.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import (
    REPO,
    EmulatedCluster,
    OperatorHandle,
    measure,
    rbac_problems,
    run_operator,
    wait_for,
)

from hacrl_core.spec import parse_experiment
from hacrl_core.store import open_trajectory_store
from hacrl_core.store.ownership import Owner, claim
from hacrl_operator.builders import pod_name

NS = "hx-test"
QUICKSTART = REPO / "examples/quickstart.yaml"
AGENTS = ("llama-char", "qwen-bpe")


QUICKSTART_STEPS = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").read_text())[
    "spec"
]["algorithm"]["steps"]


def create_namespace(cluster: EmulatedCluster, name: str = NS) -> None:
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    )


def quickstart(**spec_changes: Any) -> dict[str, Any]:
    document = yaml.safe_load(QUICKSTART.read_text())
    document["spec"].update(spec_changes)
    return document


def apply(cluster: EmulatedCluster, document: dict[str, Any], namespace: str = NS) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document))


def pods_of(cluster: EmulatedCluster, experiment: str = "quickstart", namespace: str = NS) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in cluster.get("pods", namespace=namespace, selector=f"hacrl.io/experiment={experiment}")
    }


def status_of(cluster: EmulatedCluster, name: str = "quickstart", namespace: str = NS) -> dict[str, Any]:
    body = cluster.get("hx", name, namespace)
    return (body or {}).get("status") or {}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def agent(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next((a for a in status.get("agentProgress") or [] if a["name"] == name), {})


def event_reasons(cluster: EmulatedCluster, namespace: str = NS) -> list[str]:
    return [e["reason"] for e in cluster.get("events", namespace=namespace)]


def run_all_pods(cluster: EmulatedCluster, experiment: str = "quickstart", namespace: str = NS) -> None:
    for name, pod in pods_of(cluster, experiment, namespace).items():
        if pod["status"].get("phase") == "Pending":
            cluster.set_pod_phase(name, namespace, "Running")


def store_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


def worker_store(cluster: EmulatedCluster, uri: str, name: str = "quickstart") -> Any:
    """The experiment's store as its workers open it (keyed by namespace and name), with the owner
    record they write when they start (HACRL_EXPERIMENT_UID, hacrl_core/store/ownership.py)."""
    store = open_trajectory_store(f"{uri}/{NS}", name)
    claim(
        store,
        Owner(name=name, uid=cluster.get("hx", name, NS)["metadata"]["uid"], namespace=NS),
        adopt=False,
        where=uri,
    )
    return store


def start_running(cluster: EmulatedCluster, document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    create_namespace(cluster)
    apply(cluster, document)
    pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")
    run_all_pods(cluster)
    wait_for(lambda: status_of(cluster).get("phase") == "Running", what="phase Running")
    return pods


# -- 1. create ----------------------------------------------------------------------------------


def test_quickstart_creates_configmap_and_labelled_owned_pods(cluster: EmulatedCluster, op: OperatorHandle) -> None:
    create_namespace(cluster)
    start = time.monotonic()
    cluster.kubectl("apply", "-n", NS, "-f", str(QUICKSTART))
    pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")
    measure("create-to-4-pods (kubectl apply -> pods listed)", time.monotonic() - start)

    body = cluster.get("hx", "quickstart", NS)
    uid = body["metadata"]["uid"]
    configmap = cluster.get("configmap", "quickstart-spec", NS)
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == uid
    rendered = parse_experiment(yaml.safe_load(configmap["data"]["spec.yaml"]))
    assert rendered.spec == parse_experiment(yaml.safe_load(QUICKSTART.read_text())).spec

    assert sorted(pods) == sorted(pod_name("quickstart", a, r) for a in AGENTS for r in ("rollout", "learner"))
    for name, pod in pods.items():
        labels = pod["metadata"]["labels"]
        role, agent_name = labels["hacrl.io/role"], labels["hacrl.io/agent"]
        assert labels["hacrl.io/experiment"] == "quickstart" and name == pod_name("quickstart", agent_name, role)
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "HACRLExperiment",
            "quickstart",
            uid,
            True,
        )
        (container,) = pod["spec"]["containers"]
        assert container["command"] == [
            "hacrl",
            "worker",
            role,
            "--spec",
            "/etc/hacrl/spec.yaml",
            "--agent",
            agent_name,
        ]
        assert container["image"] == f"registry.test/hacrl-{role}:test"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/etc/hacrl", "/tmp", "/var/cache/hacrl"}
        assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HACRL_METRICS_BIND"] == "0.0.0.0" and env["HACRL_METRICS_PORT"] == "9400"

    status = wait_for(lambda: status_of(cluster).get("agentProgress") and status_of(cluster), what="status")
    assert status["phase"] == "Pending" and status["steps"] == QUICKSTART_STEPS and status["agents"] == 2
    assert condition(status, "Ready")["reason"] == "PodsPending"

    start = time.monotonic()
    run_all_pods(cluster)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Running" and status_of(cluster), what="phase Running")
    measure("pods-running-to-status-Running", time.monotonic() - start)
    assert condition(status, "Ready")["status"] == "True"
    assert agent(status, "qwen-bpe")["learnerPod"] == "Running"
    reasons = event_reasons(cluster)
    assert {"ConfigMapCreated", "PodsCreated", "Pending", "Running", "FileStore"} <= set(reasons), reasons
    assert "quickstart" in cluster.kubectl("get", "hx", "-n", NS).stdout


def test_store_credentials_by_reference_resources_and_scheduling(cluster: EmulatedCluster, op: OperatorHandle) -> None:
    document = quickstart(
        store={
            "uri": "s3://hacrl-bucket/runs",
            "endpoint": "http://127.0.0.1:9",
            "region": "eu-west-1",
            "credentialsSecret": "s3-creds",
        },
        images={"learner": "registry.test/custom-learner:1", "pullPolicy": "Always"},
        scheduling={
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "training",
            "schedulerName": "volcano",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
        },
    )
    document["spec"]["agents"][0]["resources"] = {"learner": {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}}}
    document["spec"]["agents"][0]["podTemplate"] = {
        "learner": {
            "containers": [{"name": "learner", "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}],
            "runtimeClassName": "nvidia",
        }
    }
    document["spec"]["modelTokenSecret"] = "store-creds"
    create_namespace(cluster)
    apply(cluster, document)
    pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")
    learner = pods[pod_name("quickstart", "llama-char", "learner")]
    (container,) = learner["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": key}}}
    assert env["HACRL_S3_ENDPOINT"]["value"] == "http://127.0.0.1:9" and env["AWS_REGION"]["value"] == "eu-west-1"
    assert env["NCCL_DEBUG"]["value"] == "INFO" and env["HACRL_METRICS_BIND"]["value"] == "0.0.0.0"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}}
    assert container["image"] == "registry.test/custom-learner:1" and container["imagePullPolicy"] == "Always"
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "store-creds", "key": "HF_TOKEN"}},
    }
    spec = learner["spec"]
    assert (
        spec["runtimeClassName"] == "nvidia"
        and spec["automountServiceAccountToken"] is False
        and "serviceAccountName" not in spec
    )
    assert (
        spec["nodeSelector"] == {"gpu": "h100"}
        and spec["priorityClassName"] == "training"
        and spec["schedulerName"] == "volcano"
    )
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu" and "nodeAffinity" in spec["affinity"]
    rollout = pods[pod_name("quickstart", "llama-char", "rollout")]
    assert rollout["spec"]["containers"][0]["image"] == "registry.test/hacrl-rollout:test"
    assert "resources" not in rollout["spec"]["containers"][0] and "serviceAccountName" not in rollout["spec"]
    # The operator has no S3 credentials here: the store is unreachable, and the status says so.
    status = wait_for(
        lambda: condition(status_of(cluster), "StoreReachable").get("status") == "False" and status_of(cluster),
        what="StoreReachable False",
    )
    assert condition(status, "StoreReachable")["reason"] == "StoreUnreachable"
    assert "s3://hacrl-bucket/runs" in condition(status, "StoreReachable")["message"]
    assert "StoreUnreachable" in event_reasons(cluster)
    # No secret value is ever inline: nothing in any pod carries a literal credential.
    assert 'AWS_SECRET_ACCESS_KEY", "value"' not in json.dumps(pods)


def without_store() -> dict[str, Any]:
    document = quickstart()
    del document["spec"]["store"]
    return document


def test_an_experiment_without_store_gets_the_install_default_store(cluster: EmulatedCluster) -> None:
    """The chart's default store (here as the in-chart MinIO sets it up) reaches the pods of an
    experiment that names none, by reference, and the rendered spec; the resource stays as written."""
    default = {
        "HACRL_DEFAULT_STORE_URI": "s3://hacrl",
        "HACRL_DEFAULT_STORE_ENDPOINT": "http://127.0.0.1:9",
        "HACRL_DEFAULT_STORE_REGION": "us-east-1",
        "HACRL_DEFAULT_STORE_CREDENTIALS_SECRET": "hacrl-minio",
        "HACRL_EXPERIMENT_SECRETS": "hacrl-minio",
    }
    with run_operator(cluster, **default):
        create_namespace(cluster)
        apply(cluster, without_store())
        pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")
        for pod in pods.values():
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            assert (
                env["HACRL_S3_ENDPOINT"]["value"] == "http://127.0.0.1:9" and env["AWS_REGION"]["value"] == "us-east-1"
            )
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "hacrl-minio", "key": key}}}
        rendered = yaml.safe_load(cluster.get("configmap", "quickstart-spec", NS)["data"]["spec.yaml"])
        assert rendered["spec"]["store"] == {
            "uri": "s3://hacrl",
            "endpoint": "http://127.0.0.1:9",
            "region": "us-east-1",
            "credentialsSecret": "hacrl-minio",
            "adoptExisting": False,
        }
        assert "store" not in cluster.get("hx", "quickstart", NS)["spec"], "the operator never writes the user's spec"
        # The operator reads progress from the default store too (unreachable here, and it says where).
        status = wait_for(
            lambda: condition(status_of(cluster), "StoreReachable").get("status") == "False" and status_of(cluster),
            what="StoreReachable False",
        )
        assert "s3://hacrl" in condition(status, "StoreReachable")["message"]
        assert "FileStore" not in event_reasons(cluster) and "InvalidSpec" not in json.dumps(status)


def test_an_experiment_keeps_the_default_store_it_started_on_when_the_install_changes_it(
    cluster: EmulatedCluster,
) -> None:
    """The store an experiment without spec.store got is read back from its ConfigMap: after the
    install's default changes (an operator restarted with other HACRL_DEFAULT_STORE_*), a pod it
    recreates still carries the old store, so the run keeps its checkpoints."""
    first = {"HACRL_DEFAULT_STORE_URI": "s3://first", "HACRL_DEFAULT_STORE_ENDPOINT": "http://127.0.0.1:9"}
    second = {"HACRL_DEFAULT_STORE_URI": "s3://second", "HACRL_DEFAULT_STORE_ENDPOINT": "http://127.0.0.1:10"}
    failing = pod_name("quickstart", "llama-char", "learner")
    with run_operator(cluster, **first):
        create_namespace(cluster)
        apply(cluster, without_store())
        uid = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")[failing]["metadata"][
            "uid"
        ]
    with run_operator(cluster, **second):
        cluster.set_pod_phase(failing, NS, "Failed")
        pod = wait_for(
            lambda: (
                (pods_of(cluster).get(failing) or {}).get("metadata", {}).get("uid") not in (None, uid)
                and pods_of(cluster)[failing]
            ),
            what="failed pod recreated",
        )
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["HACRL_S3_ENDPOINT"] == "http://127.0.0.1:9"
        rendered = yaml.safe_load(cluster.get("configmap", "quickstart-spec", NS)["data"]["spec.yaml"])
        assert rendered["spec"]["store"]["uri"] == "s3://first" and "ConfigMapUpdated" not in event_reasons(cluster)
    # A new experiment gets the new default.
    with run_operator(cluster, **second):
        apply(cluster, {**without_store(), "metadata": {"name": "later"}})
        pods = wait_for(
            lambda: len(pods_of(cluster, "later")) == 4 and pods_of(cluster, "later"),
            what="4 pods of the new experiment",
        )
        assert {e["name"]: e.get("value") for e in next(iter(pods.values()))["spec"]["containers"][0]["env"]}[
            "HACRL_S3_ENDPOINT"
        ] == "http://127.0.0.1:10"


def refused_then_fixed(
    cluster: EmulatedCluster, document: dict[str, Any], field: str, fix: dict[str, Any]
) -> dict[str, Any]:
    """Apply an invalid experiment: phase Failed (InvalidSpec naming ``field``), a Warning Event
    naming it, no pod; then merge-patch ``fix`` into its spec and wait for its 4 pods. Returns the
    Failed condition."""
    create_namespace(cluster)
    apply(cluster, document)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Failed" and status_of(cluster), what="phase Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "InvalidSpec" and field in failed["message"], failed
    events = wait_for(
        lambda: [e for e in cluster.get("events", namespace=NS) if field in e["message"]],
        what=f"an Event naming {field}",
    )
    assert any(e["type"] == "Warning" for e in events)
    assert pods_of(cluster) == {}
    patch = json.dumps({"spec": fix})
    cluster.kubectl("patch", "hx", "quickstart", "-n", NS, "--type=merge", "-p", patch)
    wait_for(lambda: len(pods_of(cluster)) == 4, what=f"pods once {field} is fixed")
    return failed


def test_without_a_default_store_an_experiment_without_store_is_refused_naming_spec_store(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """The harness's operator has no default store: an experiment naming none gets no pod (a
    file:// path inside each pod is no store its pods share) and the status and an Event say why
    and what to do; naming a store starts it."""
    op.expect_errors("invalid experiment spec")
    failed = refused_then_fixed(
        cluster, without_store(), "spec.store: no store given", {"store": {"uri": "file://./runs"}}
    )
    assert "defaultStore.uri" in failed["message"] and "minio.enabled=true" in failed["message"]


# -- 2. status reasons ------------------------------------------------------------------------------


def test_pod_waiting_reasons_become_conditions_and_warnings(cluster: EmulatedCluster, op: OperatorHandle) -> None:
    create_namespace(cluster)
    apply(cluster, quickstart())
    wait_for(lambda: len(pods_of(cluster)) == 4, what="4 pods")
    cluster.set_pod_phase(
        pod_name("quickstart", "qwen-bpe", "rollout"),
        NS,
        "Pending",
        containerStatuses=[
            {
                "name": "rollout",
                "ready": False,
                "restartCount": 0,
                "image": "x",
                "imageID": "",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}},
            }
        ],
    )
    status = wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "ImagePullBackOff" and status_of(cluster),
        what="ImagePullBackOff",
    )
    assert pod_name("quickstart", "qwen-bpe", "rollout") in condition(status, "Ready")["message"]
    assert agent(status, "qwen-bpe")["rolloutPod"] == "ImagePullBackOff"
    cluster.set_pod_phase(
        pod_name("quickstart", "qwen-bpe", "rollout"),
        NS,
        "Pending",
        containerStatuses=None,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes have nvidia.com/gpu",
                "lastTransitionTime": ago(3600),
            }  # past spec.scheduling.pendingTimeoutSeconds (600)
        ],
    )
    wait_for(lambda: condition(status_of(cluster), "Ready").get("reason") == "Unschedulable", what="Unschedulable")
    warnings = {e["reason"] for e in cluster.get("events", namespace=NS) if e["type"] == "Warning"}
    assert {"ImagePullBackOff", "Unschedulable"} <= warnings


def ago(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_pod_pending_beyond_the_timeout_is_a_condition_and_one_warning(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    start_running(cluster, quickstart(scheduling={"pendingTimeoutSeconds": 60}))
    waiting = pod_name("quickstart", "qwen-bpe", "learner")
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    cluster.set_pod_phase(waiting, NS, "Pending", conditions=[{**unschedulable, "lastTransitionTime": ago(5)}])
    ready = wait_for(
        lambda: (
            condition(status_of(cluster), "Ready").get("reason") == "PodsPending"
            and condition(status_of(cluster), "Ready")
        ),
        what="PodsPending within the timeout",
    )
    assert "waiting to be scheduled" in ready["message"] and "pendingTimeoutSeconds 60" in ready["message"]
    assert "Unschedulable" not in {e["reason"] for e in cluster.get("events", namespace=NS) if e["type"] == "Warning"}

    cluster.set_pod_phase(waiting, NS, "Pending", conditions=[{**unschedulable, "lastTransitionTime": ago(120)}])
    status = wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "Unschedulable" and status_of(cluster),
        what="Unschedulable past the timeout",
    )
    message = condition(status, "Ready")["message"]
    assert (
        waiting in message
        and "spec.scheduling.pendingTimeoutSeconds 60" in message
        and "3 Insufficient nvidia.com/gpu" in message
    )
    assert status["phase"] == "Running" and agent(status, "qwen-bpe")["learnerPod"] == "Unschedulable"
    # Later reconciles (one sees the rollout pod stop running) post no second Warning.
    cluster.set_pod_phase(
        pod_name("quickstart", "llama-char", "rollout"),
        NS,
        "Pending",
        conditions=[{**unschedulable, "lastTransitionTime": ago(1)}],
    )
    wait_for(lambda: agent(status_of(cluster), "llama-char").get("rolloutPod") == "Pending", what="a later reconcile")
    warnings = [
        e for e in cluster.get("events", namespace=NS) if e["type"] == "Warning" and e["reason"] == "Unschedulable"
    ]
    assert len(warnings) == 1 and "3 Insufficient nvidia.com/gpu" in warnings[0]["message"]


def test_invalid_spec_fails_with_the_field_path_then_recovers_when_fixed(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    op.expect_errors("invalid experiment spec")
    document = quickstart()
    document["spec"]["algorithm"]["groupSize"] = 1
    refused_then_fixed(cluster, document, "spec.algorithm.groupSize", {"algorithm": {"groupSize": 8}})
    status = wait_for(
        lambda: status_of(cluster).get("phase") == "Pending" and status_of(cluster), what="phase Pending after the fix"
    )
    assert not condition(status, "Failed")


def test_an_invalid_spec_longer_than_the_apis_limits_still_fails_with_its_message_cut(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """The joined InvalidSpec text of 40 long (multi-byte) field names is about 60 kB: the condition
    and Event messages are cut to the API's limits at a character boundary, so the status PATCH is
    accepted (the emulator answers 422 to a longer message, as the API server does)."""
    op.expect_errors("invalid experiment spec")
    create_namespace(cluster)
    document = quickstart()
    document["spec"]["agents"][0]["podTemplate"] = {"learner": {"ü" * 600 + str(i): 1 for i in range(40)}}
    apply(cluster, document)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Failed" and status_of(cluster), what="phase Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "InvalidSpec" and failed["message"].startswith(
        "invalid spec: spec.agents[0].podTemplate.learner: ü"
    )
    assert failed["message"].endswith("…") and len(failed["message"].encode()) <= 32768
    events = wait_for(
        lambda: [e for e in cluster.get("events", namespace=NS) if e["reason"] == "Failed"], what="the Failed event"
    )
    assert events[0]["message"].endswith("…") and len(events[0]["message"].encode()) <= 1024
    assert pods_of(cluster) == {}


def test_a_pod_override_that_would_run_privileged_is_refused_before_any_pod(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    op.expect_errors("invalid experiment spec")
    document = quickstart()
    document["spec"]["agents"][0]["podTemplate"] = {
        "learner": {"containers": [{"name": "learner", "securityContext": {"privileged": True}}]}
    }
    create_namespace(cluster)
    apply(cluster, document)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Failed" and status_of(cluster), what="phase Failed")
    field = "spec.agents[0].podTemplate.learner.containers[0].securityContext.privileged"
    assert condition(status, "Failed")["reason"] == "InvalidSpec" and field in condition(status, "Failed")["message"]
    assert pods_of(cluster) == {}


def test_a_secret_the_admin_did_not_approve_gets_no_pod_until_the_spec_names_one_that_is(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """The harness approves s3-creds and store-creds only (HACRL_EXPERIMENT_SECRETS), as a cluster
    admin would: an experiment naming another team's Secret must not get a pod that reads it."""
    document = quickstart(
        store={"uri": "s3://bucket/runs", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "team-b-creds"}
    )
    document["spec"]["modelTokenSecret"] = "team-b-hf"
    document["spec"]["env"] = [
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "team-b-wandb", "key": "key"}}}
    ]
    document["spec"]["envFrom"] = [{"secretRef": {"name": "team-b-extra"}}]
    create_namespace(cluster)
    apply(cluster, document)
    status = wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "SecretNotAllowed" and status_of(cluster),
        what="SecretNotAllowed",
    )
    message = condition(status, "Ready")["message"]
    assert (
        "spec.store.credentialsSecret: Secret 'team-b-creds'" in message
        and "spec.modelTokenSecret: Secret 'team-b-hf'" in message
    )
    assert (
        "spec.env[0].valueFrom.secretKeyRef: Secret 'team-b-wandb'" in message
        and "spec.envFrom[0].secretRef: Secret 'team-b-extra'" in message
    )
    assert "experimentSecrets" in message and status["phase"] == "Pending"
    warnings = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "SecretNotAllowed"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    op.wait_for_reconciles(3, trigger="periodic")  # its chances to act: still no pod, still one warning
    assert pods_of(cluster) == {}
    assert len([e for e in cluster.get("events", namespace=NS) if e["reason"] == "SecretNotAllowed"]) == 1
    cluster.kubectl(
        "patch",
        "hx",
        "quickstart",
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "store": {"credentialsSecret": "s3-creds"},
                    "modelTokenSecret": None,
                    "env": [
                        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "store-creds", "key": "key"}}}
                    ],
                    "envFrom": [{"configMapRef": {"name": "tuning"}}],
                }
            }
        ),
    )
    pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods once the Secret is approved")
    container = pods[pod_name("quickstart", "llama-char", "learner")]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds" and "HF_TOKEN" not in env
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "store-creds"
    assert container["envFrom"] == [{"configMapRef": {"name": "tuning", "optional": False}}]


def test_a_store_prefix_left_by_a_deleted_experiment_is_refused_until_adopted(
    cluster: EmulatedCluster, op: OperatorHandle, tmp_path: Path
) -> None:
    """An experiment deleted and re-created with the same name gets a new uid: the old run's
    prefix (owner record with the old uid) is refused, with a condition and a Warning, and taken
    over only when the spec says so (store.adoptExisting). Cleanup never deletes what it does not own."""
    uri = store_uri(tmp_path)
    old = open_trajectory_store(f"{uri}/{NS}", "quickstart")
    claim(old, Owner(name="quickstart", uid="uid-of-the-deleted-one", namespace=NS), adopt=False, where=uri)
    old.write_progress("llama-char", heartbeat("llama-char", 5))
    create_namespace(cluster)
    apply(cluster, quickstart(store={"uri": uri}, cleanup={"onFailure": "delete-store", "onSuccess": "delete-store"}))
    status = wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "StoreOwnedByAnother" and status_of(cluster),
        what="StoreOwnedByAnother",
    )
    message = condition(status, "Ready")["message"]
    assert f"{NS}/quickstart/ belongs to experiment {NS}/quickstart (uid uid-of-the-deleted-one)" in message
    assert "adoptExisting" in message and status["phase"] == "Pending"
    warnings = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "StoreOwnedByAnother"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert pods_of(cluster) == {}
    # Deleting it now must not delete the old run's data (the finalizer checks the record).
    cluster.kubectl("delete", "hx", "quickstart", "-n", NS, "--timeout=20s")
    assert old.read_progress("llama-char") is not None
    # Re-created with adoptExisting: the operator creates the pods; the workers take the record over.
    apply(cluster, quickstart(store={"uri": uri, "adoptExisting": True}))
    wait_for(lambda: len(pods_of(cluster)) == 4, what="4 pods once the prefix is adopted")


def test_pod_names_are_injective_and_a_name_taken_by_something_else_is_a_condition(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """Experiment `qs-ab` with agent `cd` and experiment `qs` with agent `ab-cd` would both need a
    pod `qs-ab-cd-learner` without the hash suffix: both now get their own 4 pods. A pod of the
    needed name that something else created must be said (PodNameTaken), not waited for."""
    first, second = quickstart(), quickstart()
    first["metadata"]["name"], first["spec"]["agents"][0]["name"] = "qs-ab", "cd"
    second["metadata"]["name"], second["spec"]["agents"][0]["name"] = "qs", "ab-cd"
    create_namespace(cluster)
    apply(cluster, first)
    apply(cluster, second)
    wait_for(
        lambda: len(pods_of(cluster, "qs-ab")) == 4 and len(pods_of(cluster, "qs")) == 4,
        what="4 pods of each experiment",
    )
    names = set(pods_of(cluster, "qs-ab")) | set(pods_of(cluster, "qs"))
    assert len(names) == 8 and pod_name("qs-ab", "cd", "learner") != pod_name("qs", "ab-cd", "learner")

    squatter = pod_name("quickstart", "llama-char", "learner")
    cluster.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": squatter, "namespace": NS},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
        ),
    )
    apply(cluster, quickstart())
    status = wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "PodNameTaken" and status_of(cluster),
        what="PodNameTaken",
    )
    message = condition(status, "Ready")["message"]
    assert squatter in message and "no owner" in message and "rename" in message
    assert agent(status, "llama-char")["learnerPod"] == "CreateFailed"
    warnings = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "PodNameTaken"]
    assert warnings and warnings[0]["type"] == "Warning" and warnings[0]["involvedObject"]["name"] == "quickstart"
    assert not cluster.get("pods", squatter, NS)["metadata"].get("ownerReferences")  # left alone


GANG_KEYS = ("kueue.x-k8s.io/", "scheduling.k8s.io/group-name")


def gang_keys(pod: dict[str, Any]) -> set[str]:
    metadata = pod["metadata"]
    return {k for k in {**metadata.get("labels", {}), **metadata.get("annotations", {})} if k.startswith(GANG_KEYS)}


def test_gang_scheduling_with_kueue_labels_or_a_volcano_pod_group_and_none_by_default(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    create_namespace(cluster)
    for name, scheduling in (
        ("plain", {}),
        ("kq", {"gang": "kueue", "queueName": "team-a"}),
        ("vq", {"gang": "volcano", "queueName": "research"}),
    ):
        apply(cluster, {**quickstart(scheduling=scheduling), "metadata": {"name": name}})
    pods = {
        name: wait_for(
            lambda name=name: len(pods_of(cluster, name)) == 4 and pods_of(cluster, name), what=f"4 pods of {name}"
        )
        for name in ("plain", "kq", "vq")
    }
    uids = {name: cluster.get("hx", name, NS)["metadata"]["uid"] for name in pods}

    for pod in pods["plain"].values():  # nothing of either by default
        assert not gang_keys(pod) and "schedulerName" not in pod["spec"]
        assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    group = f"kq-{uids['kq'].replace('-', '')[:8]}"
    for pod in pods["kq"].values():
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert (labels["kueue.x-k8s.io/queue-name"], labels["kueue.x-k8s.io/pod-group-name"]) == ("team-a", group)
        assert (
            annotations["kueue.x-k8s.io/pod-group-total-count"] == "4"
            and "scheduling.k8s.io/group-name" not in annotations
        )
    group = f"vq-{uids['vq'].replace('-', '')[:8]}"
    for pod in pods["vq"].values():
        assert (
            gang_keys(pod) == {"scheduling.k8s.io/group-name"}
            and pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == group
        )
        assert pod["spec"]["schedulerName"] == "volcano"

    (podgroup,) = wait_for(
        lambda: cluster.get("podgroups", namespace=NS), what="the Volcano PodGroup"
    )  # kubectl, through discovery
    assert podgroup["metadata"]["name"] == group and podgroup["spec"] == {"minMember": 4, "queue": "research"}
    assert podgroup["metadata"]["ownerReferences"][0]["uid"] == uids["vq"]
    assert (
        "create",
        "scheduling.volcano.sh",
        "podgroups",
    ) in cluster.emulator.access  # and granted: checked when the operator stops
    assert "PodGroupCreated" in event_reasons(cluster)


def test_with_kueue_a_failed_pod_held_by_its_finalizer_is_replaced_under_the_other_name(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """Kueue keeps its finalizer on a failed pod of a group until a replacement exists: waiting for
    the old pod to go before creating one of the same name would wait forever."""
    pods = start_running(cluster, quickstart(scheduling={"gang": "kueue", "queueName": "team-a"}, restartLimit=1))
    failing = pod_name("quickstart", "llama-char", "learner")
    cluster.kubectl(
        "patch",
        "pod",
        failing,
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"finalizers": ["kueue.x-k8s.io/managed"]}}),
    )
    cluster.fail_pod(failing, NS, "learner")
    replacement = wait_for(lambda: pods_of(cluster).get(failing + "-r"), what="the replacement under the other name")
    assert (
        replacement["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
        == pods[failing]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]
    )
    assert pods_of(cluster)[failing]["metadata"].get("deletionTimestamp")  # still held
    status = wait_for(
        lambda: agent(status_of(cluster), "llama-char").get("restarts") == 1 and status_of(cluster), what="one restart"
    )
    cluster.set_pod_phase(failing + "-r", NS, "Running")
    wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "AllPodsRunning",
        what="the replacement counted as the agent's pod",
    )
    assert agent(status_of(cluster), "llama-char")["restarts"] == 1 and status["phase"] == "Running"
    cluster.kubectl(
        "patch", "pod", failing, "-n", NS, "--type=merge", "-p", json.dumps({"metadata": {"finalizers": None}})
    )  # Kueue lets go


def test_every_request_the_operator_makes_is_granted_by_the_rbac_the_chart_renders(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """The emulator records (verb, group, resource) of every request not sent by kubectl, and every
    operator test ends by checking them against hacrl_operator.rbac (= the chart's rules,
    tests/chart/test_rbac.py). Here: the record holds what a run needs, and a request outside the
    rules is caught."""
    start_running(cluster, quickstart())
    access = cluster.emulator.access
    for needed in (
        ("create", "", "pods"),
        ("list", "", "pods"),
        ("create", "", "configmaps"),
        ("create", "", "events"),
        ("watch", "hacrl.io", "hacrlexperiments"),
        ("patch", "hacrl.io", "hacrlexperiments/status"),
        # OwnerReferencesPermissionEnforcement's checks on children created with owner references
        ("update", "hacrl.io", "hacrlexperiments/finalizers"),
        ("delete", "", "configmaps"),
    ):
        assert needed in access, (needed, sorted(access))
    assert rbac_problems(cluster) == []
    op.reconciler.kube.get(f"/api/v1/namespaces/{NS}/secrets/anything")  # the operator never reads Secrets
    assert rbac_problems(cluster) == ["get core/secrets"]
    access.discard(("get", "", "secrets"))  # the harness checks again when the operator stops


# -- 3. failure domains -----------------------------------------------------------------------


def test_failed_pod_recreated_for_its_agent_only_up_to_the_restart_limit(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    pods = start_running(cluster, quickstart(restartLimit=2))
    uids = {name: p["metadata"]["uid"] for name, p in pods.items()}
    failing = pod_name("quickstart", "llama-char", "learner")

    start = time.monotonic()
    cluster.fail_pod(failing, NS, "learner", 137, "OOMKilled")
    wait_for(
        lambda: (pods_of(cluster).get(failing) or {}).get("metadata", {}).get("uid") not in (None, uids[failing]),
        what="failed pod recreated",
    )
    measure("pod-failed-to-recreated", time.monotonic() - start)
    now = pods_of(cluster)
    for name in uids:
        if not name.startswith("quickstart-llama-char"):
            assert now[name]["metadata"]["uid"] == uids[name], f"{name} of the other agent was touched"
    assert (
        now[pod_name("quickstart", "llama-char", "rollout")]["metadata"]["uid"]
        == uids[pod_name("quickstart", "llama-char", "rollout")]
    )
    status = wait_for(
        lambda: agent(status_of(cluster), "llama-char").get("restarts") == 1 and status_of(cluster), what="restarts 1"
    )
    assert agent(status, "qwen-bpe")["restarts"] == 0
    failed_events = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "PodFailed"]
    assert failed_events and "OOMKilled" in failed_events[0]["message"]

    # Deleting a pod by hand is healed the same way (and counts).
    before = pods_of(cluster)[pod_name("quickstart", "llama-char", "rollout")]["metadata"]["uid"]
    cluster.set_pod_phase(pod_name("quickstart", "llama-char", "learner"), NS, "Running")
    wait_for(
        lambda: agent(status_of(cluster), "llama-char").get("learnerPod") == "Running", what="recreated learner running"
    )
    cluster.kubectl("delete", "pod", pod_name("quickstart", "llama-char", "rollout"), "-n", NS, "--wait=false")
    wait_for(
        lambda: (
            (pods_of(cluster).get(pod_name("quickstart", "llama-char", "rollout")) or {}).get("metadata", {}).get("uid")
            not in (None, before)
        ),
        what="deleted pod recreated",
    )
    wait_for(lambda: agent(status_of(cluster), "llama-char").get("restarts") == 2, what="restarts 2")
    assert "PodLost" in event_reasons(cluster)

    # The third failure exceeds restartLimit 2: the experiment fails with the reason.
    cluster.set_pod_phase(pod_name("quickstart", "llama-char", "rollout"), NS, "Failed")
    status = wait_for(lambda: status_of(cluster).get("phase") == "Failed" and status_of(cluster), what="phase Failed")
    assert condition(status, "Failed")["reason"] == "RestartLimitExceeded"
    assert (
        "llama-char" in condition(status, "Failed")["message"]
        and "restartLimit 2" in condition(status, "Failed")["message"]
    )
    assert status.get("completionTime")
    assert agent(status, "llama-char")["restarts"] == 2
    # cleanup.onFailure defaults to keep: the failed pod stays for its logs.
    assert pods_of(cluster)[pod_name("quickstart", "llama-char", "rollout")]["status"]["phase"] == "Failed"


def test_an_evicted_pod_is_recreated_without_consuming_a_restart(cluster: EmulatedCluster, op: OperatorHandle) -> None:
    pods = start_running(cluster, quickstart(restartLimit=0))  # any counted restart would fail the experiment
    evicted = pod_name("quickstart", "llama-char", "learner")
    uid = pods[evicted]["metadata"]["uid"]
    cluster.set_pod_phase(evicted, NS, "Failed", reason="Evicted", message="The node was low on resource: memory.")
    wait_for(
        lambda: (pods_of(cluster).get(evicted) or {}).get("metadata", {}).get("uid") not in (None, uid),
        what="evicted pod recreated",
    )
    status = status_of(cluster)
    assert status["phase"] != "Failed" and [agent(status, a)["restarts"] for a in AGENTS] == [0, 0]
    disrupted = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "PodDisrupted"]
    assert (
        disrupted
        and "Evicted" in disrupted[0]["message"]
        and "not counted against restartLimit" in disrupted[0]["message"]
    )
    assert not {"PodFailed", "PodLost", "Failed"} & set(event_reasons(cluster))

    # Preempted by the scheduler (announced by DisruptionTarget, then deleted): recreated, not counted either.
    preempted = pod_name("quickstart", "qwen-bpe", "rollout")
    uid = pods_of(cluster)[preempted]["metadata"]["uid"]
    cluster.set_pod_phase(
        preempted,
        NS,
        "Running",
        conditions=[
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": "preempted by a higher-priority pod",
            }
        ],
    )
    wait_for(
        lambda: agent(status_of(cluster), "qwen-bpe").get("rolloutPod") == "Disrupted",
        what="the pod recorded as disrupted",
    )
    cluster.kubectl("delete", "pod", preempted, "-n", NS, "--wait=false")
    wait_for(
        lambda: (pods_of(cluster).get(preempted) or {}).get("metadata", {}).get("uid") not in (None, uid),
        what="preempted pod recreated",
    )
    status = status_of(cluster)
    assert status["phase"] != "Failed" and [agent(status, a)["restarts"] for a in AGENTS] == [0, 0]


# -- 4. suspend / resume ----------------------------------------------------------------------


def test_suspend_deletes_pods_keeps_the_rest_and_resume_recreates_them(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    start_running(cluster, quickstart())
    cluster.kubectl("patch", "hx", "quickstart", "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: pods_of(cluster) == {}, what="pods deleted")
    status = wait_for(
        lambda: status_of(cluster).get("phase") == "Suspended" and status_of(cluster), what="phase Suspended"
    )
    assert condition(status, "Suspended")["status"] == "True"
    assert cluster.get("configmap", "quickstart-spec", NS) is not None

    # Idempotent and quiet: reconciles write nothing more (the ticker leaves a suspended experiment
    # alone, Reconciler.resting, so they are run here).
    version = cluster.get("hx", "quickstart", NS)["metadata"]["resourceVersion"]
    for _ in range(3):
        assert op.reconciler.reconcile(NS, "quickstart", trigger="test").phase == "Suspended"
    assert cluster.get("hx", "quickstart", NS)["metadata"]["resourceVersion"] == version
    assert pods_of(cluster) == {}

    cluster.kubectl("patch", "hx", "quickstart", "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: len(pods_of(cluster)) == 4, what="pods recreated on resume")
    run_all_pods(cluster)
    status = wait_for(
        lambda: status_of(cluster).get("phase") == "Running" and status_of(cluster), what="Running after resume"
    )
    assert [a["restarts"] for a in status["agentProgress"]] == [0, 0]
    assert condition(status, "Suspended")["reason"] == "Resumed"
    assert {"Suspended", "PodsDeleted"} <= set(event_reasons(cluster))


def test_colocated_experiment_runs_one_pod_per_agent_and_can_switch_to_split_pods(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """spec.colocate: one pod per agent (`hacrl worker colocated`, the learner's image, resources and
    podTemplate), the gang sized to it, failures restarted and counted per agent; set to false on a
    running experiment, the colocated pods go and rollout and learner pods come (they resume from
    the store's checkpoints)."""
    gpu = {"limits": {"nvidia.com/gpu": 1}}
    document = quickstart(colocate=True, scheduling={"gang": "kueue", "queueName": "team-a"})
    for spec_agent in document["spec"]["agents"]:
        spec_agent["resources"] = {"learner": gpu, "rollout": {"limits": {"nvidia.com/gpu": 2}}}
        spec_agent["podTemplate"] = {"learner": {"metadata": {"labels": {"team": "a"}}}}
    create_namespace(cluster)
    apply(cluster, document)
    pods = wait_for(lambda: len(pods_of(cluster)) == 2 and pods_of(cluster), what="2 colocated pods")
    assert sorted(pods) == sorted(pod_name("quickstart", a, "colocated") for a in AGENTS)
    for pod in pods.values():
        agent_name = pod["metadata"]["labels"]["hacrl.io/agent"]
        assert pod["metadata"]["labels"]["hacrl.io/role"] == "colocated" and pod["metadata"]["labels"]["team"] == "a"
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
        (container,) = pod["spec"]["containers"]
        assert container["command"] == [
            "hacrl",
            "worker",
            "colocated",
            "--spec",
            "/etc/hacrl/spec.yaml",
            "--agent",
            agent_name,
        ]
        assert container["name"] == "learner" and container["image"] == "registry.test/hacrl-learner:test"
        assert container["resources"] == gpu
    run_all_pods(cluster)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Running" and status_of(cluster), what="phase Running")
    assert agent(status, "llama-char")["colocatedPod"] == "Running" and "learnerPod" not in agent(status, "llama-char")

    failing = pod_name("quickstart", "llama-char", "colocated")
    uid = pods[failing]["metadata"]["uid"]
    cluster.set_pod_phase(failing, NS, "Failed")
    wait_for(
        lambda: (pods_of(cluster).get(failing) or {}).get("metadata", {}).get("uid") not in (None, uid),
        what="failed pod recreated",
    )
    status = wait_for(
        lambda: agent(status_of(cluster), "llama-char").get("restarts") == 1 and status_of(cluster), what="restarts 1"
    )
    assert agent(status, "qwen-bpe")["restarts"] == 0

    cluster.kubectl("patch", "hx", "quickstart", "-n", NS, "--type=merge", "-p", '{"spec":{"colocate":false}}')
    split = sorted(pod_name("quickstart", a, r) for a in AGENTS for r in ("rollout", "learner"))
    wait_for(lambda: sorted(pods_of(cluster)) == split, what="the colocated pods replaced by rollout and learner pods")
    assert all(
        p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "4" for p in pods_of(cluster).values()
    )


def test_a_learner_over_two_nodes_runs_two_pods_behind_a_headless_service_restarted_together(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """learner.nodes 2: two learner pods for that agent (node ranks 0 and 1, DNS names under the
    agent's headless Service, node 0's the rendezvous), the gang counting both; one node's pod
    failing deletes and recreates both, one restart; the other agent is untouched."""
    from hacrl_operator.builders import pod_names, rendezvous_service_name

    document = quickstart(scheduling={"gang": "kueue", "queueName": "team-a"})
    document["spec"]["agents"][1]["learner"] = {**document["spec"]["agents"][1].get("learner", {}), "nodes": 2}
    create_namespace(cluster)
    apply(cluster, document)
    pods = wait_for(lambda: len(pods_of(cluster)) == 5 and pods_of(cluster), what="5 pods")
    learners = pod_names(parse_experiment(document), "qwen-bpe", "learner")
    assert sorted(pods) == sorted(
        [
            *learners,
            *(
                pod_name("quickstart", a, r)
                for a, r in (("llama-char", "rollout"), ("llama-char", "learner"), ("qwen-bpe", "rollout"))
            ),
        ]
    )
    service_name = rendezvous_service_name("quickstart", "qwen-bpe")
    service = cluster.get("service", service_name, NS)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        "hacrl.io/experiment": "quickstart",
        "hacrl.io/agent": "qwen-bpe",
        "hacrl.io/role": "learner",
    }
    assert service["metadata"]["ownerReferences"][0]["uid"] == cluster.get("hx", "quickstart", NS)["metadata"]["uid"]
    assert [s["metadata"]["name"] for s in cluster.get("services", namespace=NS)] == [
        service_name
    ]  # none for the one-node learner
    for node, name in enumerate(learners):
        spec = pods[name]["spec"]
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert pods[name]["metadata"]["labels"]["hacrl.io/node"] == str(node)
        assert (spec["hostname"], spec["subdomain"]) == (f"learner-{node}", service_name)
        assert (env["HACRL_NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
            str(node),
            f"learner-0.{service_name}.{NS}.svc",
            "29500",
        )
    assert {p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for p in pods.values()} == {"5"}
    run_all_pods(cluster)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Running" and status_of(cluster), what="phase Running")
    assert (
        agent(status, "qwen-bpe")["learnerPod"] == "Running"
        and condition(status, "Ready")["reason"] == "AllPodsRunning"
    )

    uids = {name: p["metadata"]["uid"] for name, p in pods_of(cluster).items()}
    cluster.fail_pod(learners[1], NS, "learner")
    wait_for(
        lambda: all(
            (pods_of(cluster).get(n) or {}).get("metadata", {}).get("uid") not in (None, uids[n]) for n in learners
        ),
        what="both learner pods recreated",
    )
    status = wait_for(
        lambda: agent(status_of(cluster), "qwen-bpe").get("restarts") == 1 and status_of(cluster), what="restarts 1"
    )
    assert agent(status, "llama-char")["restarts"] == 0
    now = pods_of(cluster)
    assert all(now[n]["metadata"]["uid"] == uids[n] for n in uids if n not in learners), (
        "pods other than the learner's were touched"
    )
    (failed,) = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "PodFailed"]
    assert learners[1] in failed["message"] and "all 2 pods of the learner" in failed["message"]
    run_all_pods(cluster)
    wait_for(
        lambda: condition(status_of(cluster), "Ready").get("reason") == "AllPodsRunning",
        what="the recreated learner running",
    )
    assert agent(status_of(cluster), "qwen-bpe")["restarts"] == 1


def test_a_rollout_with_two_replicas_runs_two_pods_each_replaced_alone(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """rollout.replicas 2: two rollout pods for that agent (HACRL_ROLLOUT_REPLICA 0 and 1), the
    gang counting both; a replica's pod deleted by hand, then one failing, is recreated alone,
    each a restart of the agent; the other replica and the other pods are untouched."""
    from hacrl_operator.builders import pod_names

    document = quickstart(scheduling={"gang": "kueue", "queueName": "team-a"})
    document["spec"]["agents"][0]["rollout"] = {**document["spec"]["agents"][0].get("rollout", {}), "replicas": 2}
    create_namespace(cluster)
    apply(cluster, document)
    pods = wait_for(lambda: len(pods_of(cluster)) == 5 and pods_of(cluster), what="5 pods")
    replicas = pod_names(parse_experiment(document), "llama-char", "rollout")
    assert sorted(pods) == sorted(
        [
            *replicas,
            *(
                pod_name("quickstart", a, r)
                for a, r in (("llama-char", "learner"), ("qwen-bpe", "rollout"), ("qwen-bpe", "learner"))
            ),
        ]
    )
    for replica, name in enumerate(replicas):
        env = {e["name"]: e.get("value") for e in pods[name]["spec"]["containers"][0]["env"]}
        assert env["HACRL_ROLLOUT_REPLICA"] == str(replica) and pods[name]["metadata"]["labels"][
            "hacrl.io/replica"
        ] == str(replica)
        assert pods[name]["metadata"]["labels"]["hacrl.io/role"] == "rollout" and "hostname" not in pods[name]["spec"]
    assert all(
        "HACRL_ROLLOUT_REPLICA" not in {e["name"] for e in pods[n]["spec"]["containers"][0]["env"]}
        for n in pods
        if n not in replicas
    )
    assert {p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for p in pods.values()} == {"5"}
    assert cluster.get("services", namespace=NS) == []  # replicas need no rendezvous
    run_all_pods(cluster)
    status = wait_for(lambda: status_of(cluster).get("phase") == "Running" and status_of(cluster), what="phase Running")
    assert (
        agent(status, "llama-char")["rolloutPod"] == "Running, Running"
        and condition(status, "Ready")["reason"] == "AllPodsRunning"
    )

    def replaced_alone(name: str, restarts: int) -> None:
        wait_for(
            lambda: (pods_of(cluster).get(name) or {}).get("metadata", {}).get("uid") not in (None, uids[name]),
            what=f"{name} recreated",
        )
        wait_for(
            lambda: agent(status_of(cluster), "llama-char").get("restarts") == restarts, what=f"restarts {restarts}"
        )
        now = pods_of(cluster)
        assert sorted(now) == sorted(uids) and all(now[n]["metadata"]["uid"] == uids[n] for n in uids if n != name), (
            "another pod was touched"
        )
        assert agent(status_of(cluster), "qwen-bpe")["restarts"] == 0
        run_all_pods(cluster)
        wait_for(
            lambda: agent(status_of(cluster), "llama-char").get("rolloutPod") == "Running, Running",
            what="both replicas running",
        )

    uids = {name: p["metadata"]["uid"] for name, p in pods_of(cluster).items()}
    cluster.kubectl("delete", "pod", replicas[1], "-n", NS, "--wait=false")
    replaced_alone(replicas[1], 1)
    (lost,) = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "PodLost"]
    assert "agent llama-char rollout replica 1 pod disappeared" in lost["message"]

    uids = {name: p["metadata"]["uid"] for name, p in pods_of(cluster).items()}
    cluster.fail_pod(replicas[0], NS, "rollout")
    replaced_alone(replicas[0], 2)
    (failed,) = [e for e in cluster.get("events", namespace=NS) if e["reason"] == "PodFailed"]
    assert f"agent llama-char rollout replica 0 pod {replicas[0]} failed" in failed["message"]
    assert status_of(cluster)["phase"] == "Running"


# -- 5. progress and completion ---------------------------------------------------------------


def heartbeat(name: str, step: int, steps: int = QUICKSTART_STEPS, **extra: Any) -> dict[str, Any]:
    return {
        "agent": name,
        "step": step,
        "steps": steps,
        "weights_version": step,
        "reward": 0.25 + step / 100,
        "accuracy": None,
        "capability": 0.5,
        "last_checkpoint": step - step % 4 if step >= 4 else None,
        "done": step >= steps,
        "time": time.time(),
        **extra,
    }


def test_progress_heartbeats_update_status(cluster: EmulatedCluster, op: OperatorHandle, tmp_path: Path) -> None:
    uri = store_uri(tmp_path)
    start_running(cluster, quickstart(store={"uri": uri}))
    store = worker_store(cluster, uri)
    start = time.monotonic()
    store.write_progress("llama-char", heartbeat("llama-char", 5))
    store.write_progress("qwen-bpe", heartbeat("qwen-bpe", 4))
    status = wait_for(lambda: status_of(cluster).get("step") == 4 and status_of(cluster), what="step 4")
    measure("heartbeat-to-status (reconcile interval 0.2s)", time.monotonic() - start)
    llama = agent(status, "llama-char")
    assert (llama["step"], llama["weightsVersion"], llama["lastCheckpoint"], llama["capability"]) == (5, 5, 4, 0.5)
    assert llama["reward"] == pytest.approx(0.30)
    assert status["message"] == f"step 4 of {QUICKSTART_STEPS}" and status["phase"] == "Running"
    assert condition(status, "StoreReachable")["status"] == "True"


@pytest.mark.parametrize("policy", ["delete-pods", "delete-store"])
def test_completion_succeeds_and_applies_the_cleanup_policy(
    cluster: EmulatedCluster, op: OperatorHandle, tmp_path: Path, policy: str
) -> None:
    uri = store_uri(tmp_path)
    start_running(cluster, quickstart(store={"uri": uri}, cleanup={"onSuccess": policy}))
    store = worker_store(cluster, uri)
    store.write_progress("llama-char", heartbeat("llama-char", QUICKSTART_STEPS))
    status = wait_for(
        lambda: agent(status_of(cluster), "llama-char").get("step") == QUICKSTART_STEPS and status_of(cluster),
        what="llama-char done",
    )
    assert status["phase"] == "Running"
    # The other learner finishes by exiting 0 (pod Succeeded) without a final heartbeat.
    cluster.set_pod_phase(pod_name("quickstart", "qwen-bpe", "learner"), NS, "Succeeded")
    status = wait_for(
        lambda: status_of(cluster).get("phase") == "Succeeded" and status_of(cluster), what="phase Succeeded"
    )
    assert status["step"] == QUICKSTART_STEPS and status.get("completionTime")
    assert condition(status, "Succeeded")["reason"] == "AllAgentsFinished"
    wait_for(lambda: pods_of(cluster) == {}, what="pods deleted by the cleanup policy")
    assert cluster.get("configmap", "quickstart-spec", NS) is not None
    cleaned = wait_for(lambda: condition(status_of(cluster), "CleanedUp"), what="CleanedUp condition")
    assert cleaned["reason"] == ("StoreDeleted" if policy == "delete-store" else "PodsDeleted")
    assert (store.read_progress("llama-char") is None) == (policy == "delete-store")
    assert "Succeeded" in event_reasons(cluster)


def test_ttl_after_finished_deletes_the_experiment_and_children(
    cluster: EmulatedCluster, op: OperatorHandle, tmp_path: Path
) -> None:
    uri = store_uri(tmp_path)
    # 5 s: long enough for the check below on a loaded machine, short enough to wait for.
    start_running(cluster, quickstart(store={"uri": uri}, cleanup={"onSuccess": "keep", "ttlSecondsAfterFinished": 5}))
    store = worker_store(cluster, uri)
    for name in AGENTS:
        store.write_progress(name, heartbeat(name, QUICKSTART_STEPS))
    wait_for(lambda: status_of(cluster).get("phase") == "Succeeded", what="Succeeded")
    wait_for(lambda: cluster.get("hx", "quickstart", NS) is None, timeout=20, what="experiment deleted after its TTL")
    # keep: the operator deleted no pod itself (no PodsDeleted event); they went with the experiment.
    # Read from the events, not by counting pods in the TTL window, so machine speed cannot matter.
    reasons = event_reasons(cluster)
    assert "TTLExpired" in reasons and "PodsDeleted" not in reasons, reasons
    wait_for(
        lambda: pods_of(cluster) == {} and cluster.get("configmap", "quickstart-spec", NS) is None,
        what="children garbage-collected",
    )
    assert store.read_progress("llama-char") is not None  # keep: the store stays


# -- 6. deletion -------------------------------------------------------------------------------


def test_delete_runs_the_finalizer_only_when_the_policy_deletes_the_store(
    cluster: EmulatedCluster, op: OperatorHandle, tmp_path: Path
) -> None:
    uri = store_uri(tmp_path)
    create_namespace(cluster)
    kept = copy.deepcopy(quickstart(store={"uri": uri}))
    kept["metadata"]["name"] = "kept"
    apply(cluster, kept)
    apply(cluster, quickstart(store={"uri": uri}, cleanup={"onFailure": "delete-store"}))
    wait_for(lambda: len(pods_of(cluster)) == 4 and len(pods_of(cluster, "kept")) == 4, what="pods of both")
    store = worker_store(cluster, uri)
    other = worker_store(cluster, uri, "kept")
    store.write_progress("llama-char", heartbeat("llama-char", 3))
    other.write_progress("llama-char", heartbeat("llama-char", 3))
    body = wait_for(
        lambda: (
            (cluster.get("hx", "quickstart", NS)["metadata"].get("finalizers") or None)
            and cluster.get("hx", "quickstart", NS)
        ),
        what="finalizer",
    )
    assert body["metadata"]["finalizers"] == ["hacrl.io/cleanup"]
    assert not cluster.get("hx", "kept", NS)["metadata"].get("finalizers")

    start = time.monotonic()
    cluster.kubectl("delete", "hx", "quickstart", "-n", NS, "--timeout=20s")
    measure("kubectl delete (finalizer: store prefix deleted)", time.monotonic() - start)
    assert cluster.get("hx", "quickstart", NS) is None
    assert store.read_progress("llama-char") is None  # deleted before it finished: onFailure applies
    wait_for(
        lambda: pods_of(cluster) == {} and cluster.get("configmap", "quickstart-spec", NS) is None,
        what="children garbage-collected",
    )
    cluster.kubectl("delete", "hx", "kept", "-n", NS, "--timeout=20s")
    assert other.read_progress("llama-char") is not None
    assert len(pods_of(cluster, "kept")) == 0


# -- 7. operator hygiene -----------------------------------------------------------------------


def test_metrics_and_liveness_endpoints(cluster: EmulatedCluster, op: OperatorHandle) -> None:
    create_namespace(cluster)
    apply(cluster, quickstart())
    wait_for(lambda: status_of(cluster).get("phase") == "Pending", what="Pending")
    with urllib.request.urlopen(f"http://127.0.0.1:{op.config.health_port}/healthz", timeout=5) as response:
        assert response.status == 200
        assert "experiments" in json.loads(response.read())

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.config.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    text = wait_for(
        lambda: 'hacrl_operator_experiments{phase="Pending"} 1.0' in scrape() and scrape(), what="phase gauge"
    )
    assert 'hacrl_operator_reconciles_total{outcome="ok",trigger="create"} 1.0' in text
    assert 'hacrl_operator_reconcile_seconds_count{trigger="create"}' in text
    assert "hacrl_operator_errors_total" in text or "hacrl_operator_errors" in text


def test_pods_the_operator_created_trigger_no_reconcile_until_they_change(cluster: EmulatedCluster) -> None:
    """A new pod's ADDED event carries nothing its creator did not plan with; its changes do."""
    create_namespace(cluster)
    with run_operator(cluster, HACRL_RECONCILE_INTERVAL="3600") as handle:  # no ticks: only events reconcile

        def pod_event_reconciles() -> float:
            registry = handle.reconciler.metrics.registry
            return sum(
                registry.get_sample_value(
                    "hacrl_operator_reconciles_total", {"trigger": "pod-event", "outcome": outcome}
                )
                or 0
                for outcome in ("ok", "coalesced", "gone", "invalid")
            )

        apply(cluster, quickstart())
        pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")
        # Each pod's first event is its ADDED one: once the handler has returned from it for every
        # pod, a reconcile it started would have been counted.
        wait_for(
            lambda: all(handle.handled_events("pod_event", name) for name in pods),
            what="every pod's ADDED event handled",
        )
        assert pod_event_reconciles() == 0
        first = sorted(pods)[0]
        cluster.set_pod_phase(first, NS, "Running")
        wait_for(lambda: pod_event_reconciles() >= 1, what="a reconcile on the pod's change")
        assert pod_event_reconciles() == 1


def test_the_pod_watch_asks_the_api_server_for_the_operators_pods_only(
    cluster: EmulatedCluster, op: OperatorHandle
) -> None:
    """The label selector goes to the API server, which sends no event of other pods at all."""
    create_namespace(cluster)
    cluster.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "unrelated", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            }
        ),
    )
    apply(cluster, quickstart())
    wait_for(lambda: len(pods_of(cluster)) == 4, what="4 pods")
    pod_watches = [query for path, query in cluster.emulator.watches if path.rstrip("/").endswith("/pods")]
    assert pod_watches, cluster.emulator.watches
    assert all(query.get("labelSelector") == "hacrl.io/experiment" for query in pod_watches), pod_watches


def test_watch_namespaces_limits_the_scope(cluster: EmulatedCluster) -> None:
    create_namespace(cluster, "watched")
    create_namespace(cluster, "ignored")
    with run_operator(cluster, HACRL_WATCH_NAMESPACES="watched") as handle:
        assert handle.config.namespaces == ("watched",)
        apply(cluster, quickstart(), namespace="ignored")
        apply(cluster, quickstart(), namespace="watched")
        wait_for(lambda: len(pods_of(cluster, namespace="watched")) == 4, what="pods in the watched namespace")
        # The ignored one gets a few reconcile intervals to (wrongly) react.
        wait_for(
            lambda: handle.reconciler.metrics.reconciles.labels("periodic", "ok")._value.get() >= 3,
            timeout=5,
            what="periodic reconciles",
        )
        assert pods_of(cluster, namespace="ignored") == {}
        assert not status_of(cluster, namespace="ignored")
        # Nothing cluster-wide: neither namespaces nor CRDs (the chart grants this operator only Roles).
        assert rbac_problems(cluster, clusterwide=False) == []


def test_python_m_hacrl_operator_as_a_process(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """The deployed entry point: settings from the environment, SIGTERM stops it cleanly."""
    import os
    import signal
    import subprocess
    import sys

    from harness import free_port

    health = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HACRL_WATCH_NAMESPACES": NS,
        "HACRL_RECONCILE_INTERVAL": "0.5",
        "HACRL_OPERATOR_METRICS_PORT": str(free_port()),
        "HACRL_OPERATOR_HEALTH_PORT": str(health),
        # The source tree first: independent of how (or whether) the package is pip-installed.
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "operator"), os.environ.get("PYTHONPATH", "")]),
    }
    log = (tmp_path / "operator.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "hacrl_operator"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
    )
    try:
        create_namespace(cluster)
        apply(cluster, quickstart())
        pods = wait_for(
            lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), timeout=30, what="pods from the operator process"
        )
        assert pods[pod_name("quickstart", "qwen-bpe", "learner")]["spec"]["containers"][0]["image"].startswith(
            "ghcr.io/hacrl/hacrl-learner:"
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        log.close()
    output = (tmp_path / "operator.log").read_text()
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
