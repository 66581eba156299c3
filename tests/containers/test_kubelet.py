"""tests/containers/kubelet.py without podman: the manifest it hands `podman kube play` for a pod
the operator builds (examples/kind-tiny.yaml with an S3 store and an envFrom ConfigMap), its env
resolved from Secrets and ConfigMaps of the real API emulator (scripts/container-e2e.sh runs the
rest: the pods as containers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hacrl_core.spec import load_experiment
from hacrl_operator import builders
from hacrl_operator.config import OperatorConfig
from tests.containers.e2e import ENV_CONFIGMAP, STORE_SECRET, experiment
from tests.containers.kubelet import (
    Api,
    ManifestError,
    container_status,
    playable,
    pod_phase,
)
from tests.operator.harness import EmulatedCluster


@pytest.fixture
def cluster(tmp_path: Path):
    cluster = EmulatedCluster(tmp_path).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def operator_pod(cluster: EmulatedCluster, tmp_path: Path) -> dict:
    """The learner pod the operator builds for the e2e's experiment, created in the emulator."""
    document = experiment("s3://bucket/e2e", "http://127.0.0.1:9000")
    document["metadata"]["namespace"] = "default"
    spec_file = tmp_path / "experiment.yaml"
    spec_file.write_text(yaml.safe_dump(document))
    owner = {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": "ce2e", "namespace": "default", "uid": "u-1"},
    }
    exp = load_experiment(spec_file)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(builders.build_configmap(exp, owner)))
    pod = builders.build_pod(
        exp, exp.spec.agents[0].name, "learner", owner, OperatorConfig(learner_image="img/worker:1")
    )
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    return cluster.get("pod", pod["metadata"]["name"], "default")


def test_the_played_manifest_is_the_pod_with_its_env_resolved_and_host_network(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": STORE_SECRET, "namespace": "default"},
                    "stringData": {"AWS_ACCESS_KEY_ID": "key-1", "AWS_SECRET_ACCESS_KEY": "secret-1"},
                },
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": ENV_CONFIGMAP, "namespace": "default"},
                    "data": {"OMP_NUM_THREADS": "1"},
                },
            ]
        ),
    )
    pod = operator_pod(cluster, tmp_path)
    manifest, configmaps = playable(pod, Api.from_kubeconfig(cluster.kubeconfig))

    spec, original = manifest["spec"], pod["spec"]
    assert spec["hostNetwork"] is True
    [worker], [written] = spec["containers"], original["containers"]
    for field in ("command", "image", "imagePullPolicy", "securityContext", "resources", "workingDir"):
        assert worker.get(field) == written.get(field), field
    assert spec["securityContext"] == original["securityContext"] and spec["restartPolicy"] == "Never"
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == "key-1" and env["AWS_SECRET_ACCESS_KEY"] == "secret-1"
    assert env["POD_NAME"] == pod["metadata"]["name"] and env["OMP_NUM_THREADS"] == "1"
    assert env["HACRL_S3_ENDPOINT"] == "http://127.0.0.1:9000"
    assert all(set(e) == {"name", "value"} for e in worker["env"]) and "envFrom" not in worker and "ports" not in worker
    # Every volume but the memory-backed /dev/shm, mounted where the pod mounts it.
    assert [v["name"] for v in spec["volumes"]] == [v["name"] for v in original["volumes"] if v["name"] != "dshm"]
    assert [m for m in written["volumeMounts"] if m["mountPath"] != "/dev/shm"] == worker["volumeMounts"]
    assert [c["metadata"]["name"] for c in configmaps] == [builders.configmap_name("ce2e")]
    assert "spec.yaml" in configmaps[0]["data"]


def test_a_missing_configmap_or_secret_is_named(cluster: EmulatedCluster, tmp_path: Path) -> None:
    pod = operator_pod(cluster, tmp_path)
    api = Api.from_kubeconfig(cluster.kubeconfig)
    with pytest.raises(
        ManifestError, match=f"envFrom configMapRef '{ENV_CONFIGMAP}': no such configmap in namespace default"
    ):
        playable(pod, api)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": ENV_CONFIGMAP, "namespace": "default"},
                "data": {},
            }
        ),
    )
    with pytest.raises(ManifestError, match=f"secretKeyRef {STORE_SECRET}/AWS_ACCESS_KEY_ID not found"):
        playable(pod, api)


def test_phase_follows_the_containers_as_with_restart_policy_never() -> None:
    running = container_status("learner", "img", {"Running": True, "StartedAt": "2026-01-01T00:00:00.1Z"})
    killed = container_status(
        "learner",
        "img",
        {
            "Status": "exited",
            "ExitCode": 137,
            "StartedAt": "2026-01-01T00:00:00Z",
            "FinishedAt": "2026-01-01T00:01:00Z",
        },
    )
    done = container_status("learner", "img", {"Status": "exited", "ExitCode": 0})
    assert pod_phase([running]) == "Running" and pod_phase([killed]) == "Failed" and pod_phase([done]) == "Succeeded"
    assert killed["state"]["terminated"] == {
        "exitCode": 137,
        "reason": "Error",
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:01:00Z",
    }
    assert pod_phase([container_status("learner", "img", {})]) == "Pending"
