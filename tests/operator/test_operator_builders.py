"""Unit: the pure manifest builders and the operator configuration."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from hacrl_core.spec import (
    OPERATOR_ENV,
    OPERATOR_ENV_PREFIX,
    ModelCacheSpec,
    parse_experiment,
)
from hacrl_operator import builders, rbac
from hacrl_operator.config import ConfigError, OperatorConfig

REPO = Path(__file__).resolve().parents[2]
OWNER = {
    "apiVersion": "hacrl.io/v1alpha1",
    "kind": "HACRLExperiment",
    "metadata": {"name": "quickstart", "namespace": "ns", "uid": "u-1"},
}
CONFIG = OperatorConfig(rollout_image="img/rollout:1", learner_image="img/learner:1")


def experiment(**spec_changes: Any):
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["spec"].update(spec_changes)
    return parse_experiment(document)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def env(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(pod)["env"]}


def test_configmap_holds_the_rendered_spec_and_is_owned() -> None:
    exp = experiment()
    cm = builders.build_configmap(exp, OWNER)
    assert cm["metadata"]["name"] == "quickstart-spec" and cm["metadata"]["namespace"] == "ns"
    assert cm["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "hacrl.io/v1alpha1",
            "kind": "HACRLExperiment",
            "name": "quickstart",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert parse_experiment(yaml.safe_load(cm["data"]["spec.yaml"])).spec == exp.spec


def test_experiment_from_body_drops_volatile_metadata() -> None:
    body = {
        **OWNER,
        "metadata": {**OWNER["metadata"], "resourceVersion": "7", "annotations": {"a": "b"}},
        "spec": {"x": 1},
        "status": {},
    }
    assert builders.experiment_from_body(body)["metadata"] == {"name": "quickstart", "namespace": "ns"}
    assert "status" not in builders.experiment_from_body(body)


MINIO = {
    "HACRL_DEFAULT_STORE_URI": "s3://hacrl",
    "HACRL_DEFAULT_STORE_ENDPOINT": "http://hacrl-minio.hacrl-system.svc:9000",
    "HACRL_DEFAULT_STORE_REGION": "us-east-1",
    "HACRL_DEFAULT_STORE_CREDENTIALS_SECRET": "hacrl-minio",
}


def without_store() -> dict[str, Any]:
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    del document["spec"]["store"]
    return {**document, "metadata": OWNER["metadata"]}


def test_an_experiment_without_store_gets_the_default_store_and_its_pods_the_env() -> None:
    from hacrl_operator.handlers.reconcile import Reconciler
    from hacrl_operator.metrics import OperatorMetrics

    config = OperatorConfig.from_env({**MINIO, "HACRL_EXPERIMENT_SECRETS": "hacrl-minio"})
    body = without_store()
    exp, errors = Reconciler(config, OperatorMetrics()).parse(body)
    assert errors is None and exp is not None
    assert (exp.spec.store.uri, exp.spec.store.endpoint, exp.spec.store.credentials_secret) == (
        "s3://hacrl",
        "http://hacrl-minio.hacrl-system.svc:9000",
        "hacrl-minio",
    )
    assert "store" not in body["spec"], "the custom resource itself is left as written"
    variables = env(builders.build_pod(exp, "llama-char", "learner", body, config))
    assert variables["HACRL_S3_ENDPOINT"]["value"] == "http://hacrl-minio.hacrl-system.svc:9000"
    assert variables["AWS_REGION"]["value"] == "us-east-1"
    for key in builders.CREDENTIAL_KEYS:
        assert variables[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "hacrl-minio", "key": key}}}
    # The workers read the same store from the rendered spec.
    rendered = yaml.safe_load(builders.build_configmap(exp, body)["data"]["spec.yaml"])
    assert (
        rendered["spec"]["store"]["uri"] == "s3://hacrl"
        and rendered["spec"]["store"]["credentialsSecret"] == "hacrl-minio"
    )
    # A store the experiment names is its own: the default never replaces or completes it.
    named = {**body, "spec": {**body["spec"], "store": {"uri": "s3://mine/runs"}}}
    exp, _ = Reconciler(config, OperatorMetrics()).parse(named)
    assert (exp.spec.store.uri, exp.spec.store.endpoint, exp.spec.store.credentials_secret) == (
        "s3://mine/runs",
        None,
        None,
    )


def test_an_experiment_without_store_is_refused_without_a_default_naming_spec_store_and_the_fix() -> None:
    from hacrl_operator.handlers.reconcile import Reconciler
    from hacrl_operator.metrics import OperatorMetrics

    reconciler = Reconciler(OperatorConfig(), OperatorMetrics())
    exp, errors = reconciler.parse(without_store())
    assert exp is None and errors == [builders.NO_STORE]
    assert (
        errors[0].startswith("spec.store: no store given")
        and "defaultStore.uri" in errors[0]
        and "minio.enabled=true" in errors[0]
    )
    # Other problems are reported together with the missing store.
    broken = without_store()
    broken["spec"]["algorithm"]["groupSize"] = 1
    _, errors = reconciler.parse(broken)
    assert len(errors) == 2 and "spec.algorithm.groupSize" in errors[0] and errors[1] == builders.NO_STORE
    # `store: null` is no store either; an explicit file:// store stays the user's choice.
    assert reconciler.parse({**broken, "spec": {**without_store()["spec"], "store": None}})[1] == [builders.NO_STORE]
    assert (
        reconciler.parse({**broken, "spec": {**without_store()["spec"], "store": {"uri": "file://./runs"}}})[1] is None
    )


def test_the_store_an_experiment_runs_on_is_read_back_from_its_own_configmap() -> None:
    store = OperatorConfig.from_env(MINIO).default_store
    exp = parse_experiment(builders.experiment_from_body(without_store(), store))
    configmap = builders.build_configmap(exp, OWNER)
    assert builders.rendered_store(configmap, "u-1") == store
    assert builders.rendered_store(configmap, "another-uid") is None, "a ConfigMap of another experiment object"
    assert builders.rendered_store(None, "u-1") is None
    assert builders.rendered_store({**configmap, "data": {"spec.yaml": "{not: [yaml"}}, "u-1") is None
    assert builders.rendered_store({**configmap, "data": {"spec.yaml": "spec: {store: {uri: 1}}"}}, "u-1") is None


@pytest.mark.parametrize("role", builders.ROLES)
def test_pod_runs_the_worker_with_labels_owner_security_and_metrics(role: str) -> None:
    pod = builders.build_pod(experiment(), "qwen-bpe", role, OWNER, CONFIG)
    assert pod["metadata"]["name"] == builders.pod_name("quickstart", "qwen-bpe", role)
    assert re.fullmatch(rf"quickstart-qwen-bpe-{role}-[a-z2-7]{{5}}", pod["metadata"]["name"])
    labels = pod["metadata"]["labels"]
    assert (labels["hacrl.io/experiment"], labels["hacrl.io/agent"], labels["hacrl.io/role"]) == (
        "quickstart",
        "qwen-bpe",
        role,
    )
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    c = container(pod)
    assert c["command"] == ["hacrl", "worker", role, "--spec", "/etc/hacrl/spec.yaml", "--agent", "qwen-bpe"]
    assert c["image"] == f"img/{role}:1"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/etc/hacrl"]]["configMap"]["name"] == "quickstart-spec"
    assert "emptyDir" in volumes[mounts["/tmp"]] and "emptyDir" in volumes[mounts["/var/cache/hacrl"]]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
        **builders.NO_AUTOSCALER_EVICTION,
    }
    assert env(pod)["HACRL_METRICS_BIND"]["value"] == "0.0.0.0" and env(pod)["HACRL_METRICS_PORT"]["value"] == "9400"
    assert "resources" not in c and "AWS_ACCESS_KEY_ID" not in env(pod) and "HACRL_S3_ENDPOINT" not in env(pod)


def test_metrics_port_zero_declares_no_port() -> None:
    pod = builders.build_pod(experiment(metrics={"port": 0}), "qwen-bpe", "learner", OWNER, CONFIG)
    assert "ports" not in container(pod) and pod["metadata"]["annotations"] == builders.NO_AUTOSCALER_EVICTION
    assert env(pod)["HACRL_METRICS_PORT"]["value"] == "0"


@pytest.mark.parametrize("role", builders.ROLES)
def test_pods_ask_autoscalers_not_to_evict_them_unless_the_template_says_so(role: str) -> None:
    pod = builders.build_pod(experiment(), "qwen-bpe", role, OWNER, CONFIG)
    annotations = pod["metadata"]["annotations"]
    assert (
        annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
        and annotations["karpenter.sh/do-not-disrupt"] == "true"
    )
    exp = experiment()
    setattr(
        exp.spec.agents[1].pod_template,
        role,
        {"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}}},
    )
    overridden = builders.build_pod(exp, "qwen-bpe", role, OWNER, CONFIG)["metadata"]["annotations"]
    assert overridden["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"


@pytest.mark.parametrize("role", builders.ROLES)
def test_pods_get_the_spec_grace_period_to_checkpoint_on_sigterm(role: str) -> None:
    """checkpoint.gracePeriodSeconds (default 120) is the pod's terminationGracePeriodSeconds: the
    time its worker has after SIGTERM to end its step in flight and checkpoint (hacrl_core/preemption.py)."""
    assert (
        builders.build_pod(experiment(), "qwen-bpe", role, OWNER, CONFIG)["spec"]["terminationGracePeriodSeconds"]
        == 120
    )
    exp = experiment(checkpoint={"gracePeriodSeconds": 600})
    assert builders.build_pod(exp, "qwen-bpe", role, OWNER, CONFIG)["spec"]["terminationGracePeriodSeconds"] == 600


def test_no_gang_by_default() -> None:
    exp = experiment()
    for agent in ("llama-char", "qwen-bpe"):
        for role in builders.ROLES:
            pod = builders.build_pod(exp, agent, role, OWNER, CONFIG)
            keys = set(pod["metadata"]["labels"]) | set(pod["metadata"]["annotations"])
            assert not [
                k for k in keys if k.startswith(("kueue.x-k8s.io/", "scheduling.k8s.io/", "scheduling.volcano.sh/"))
            ]
            assert "schedulerName" not in pod["spec"]
    assert builders.build_pod_group(exp, OWNER) is None


def test_kueue_gang_labels_every_pod_into_one_group_of_all_pods() -> None:
    exp = experiment(scheduling={"gang": "kueue", "queueName": "team-a"})
    pods = [builders.build_pod(exp, a, r, OWNER, CONFIG) for a in ("llama-char", "qwen-bpe") for r in builders.ROLES]
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/pod-group-name"] == builders.gang_name("quickstart", "u-1") == "quickstart-u1"
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "4"
        assert "schedulerName" not in pod["spec"] and VOLCANO_KEY not in annotations
    assert builders.build_pod_group(exp, OWNER) is None


VOLCANO_KEY = "scheduling.k8s.io/group-name"


def test_volcano_gang_is_a_pod_group_of_all_pods_and_its_annotation() -> None:
    exp = experiment(scheduling={"gang": "volcano", "queueName": "research", "priorityClassName": "high"})
    exp.spec.agents[0].pod_template.learner = {"schedulerName": "default-scheduler"}
    group = builders.build_pod_group(exp, OWNER)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1" and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "quickstart-u1" and group["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert group["spec"] == {"minMember": 4, "queue": "research", "priorityClassName": "high"}
    for agent in ("llama-char", "qwen-bpe"):
        for role in builders.ROLES:
            pod = builders.build_pod(exp, agent, role, OWNER, CONFIG)
            assert pod["metadata"]["annotations"][VOLCANO_KEY] == "quickstart-u1"
            assert pod["spec"]["schedulerName"] == "volcano"  # every pod of the gang, whatever a podTemplate said
            assert not [k for k in pod["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]
    assert "queue" not in builders.build_pod_group(experiment(scheduling={"gang": "volcano"}), OWNER)["spec"]


def test_store_settings_and_credentials_by_reference_only() -> None:
    exp = experiment(
        store={"uri": "s3://b/p", "endpoint": "http://minio:9000", "region": "us-east-1", "credentialsSecret": "creds"}
    )
    variables = env(builders.build_pod(exp, "qwen-bpe", "rollout", OWNER, CONFIG))
    assert variables["HACRL_S3_ENDPOINT"] == {"name": "HACRL_S3_ENDPOINT", "value": "http://minio:9000"}
    assert variables["AWS_REGION"]["value"] == "us-east-1"
    for key in builders.CREDENTIAL_KEYS:
        assert variables[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "creds", "key": key}}}


# -- model plumbing (issue 15 item 4) -------------------------------------------------------------


def test_every_variable_the_operator_sets_is_one_the_spec_refuses_in_spec_env() -> None:
    """hacrl_core.spec.OPERATOR_ENV (what spec.env may not set) covers worker_env, whatever the spec."""
    exp = experiment(
        store={"uri": "s3://b/p", "endpoint": "http://minio:9000", "region": "us-east-1", "credentialsSecret": "creds"},
        modelTokenSecret="hf-token",
    )
    exp.spec.agents[1].learner.nodes = 2  # a learner over several nodes: its pods get the rendezvous too
    names = {e["name"] for e in builders.worker_env(exp, "qwen-bpe", "learner", uid="u-1")}
    assert {n for n in names if not n.startswith(OPERATOR_ENV_PREFIX)} == set(OPERATOR_ENV)


@pytest.mark.parametrize("role", builders.ROLES)
def test_experiment_env_and_env_from_reach_every_pod_after_the_operators(role: str) -> None:
    exp = experiment(
        env=[
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "RUN", "value": "$(HACRL_AGENT)-x"},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
            {"name": "PROXY", "valueFrom": {"configMapKeyRef": {"name": "net", "key": "proxy", "optional": True}}},
        ],
        envFrom=[{"configMapRef": {"name": "tuning"}}, {"secretRef": {"name": "extra"}, "prefix": "X_"}],
    )
    for agent in ("qwen-bpe", "llama-char"):
        c = container(builders.build_pod(exp, agent, role, OWNER, CONFIG))
        names = [e["name"] for e in c["env"]]
        assert names[-4:] == ["HF_HUB_OFFLINE", "RUN", "WANDB_API_KEY", "PROXY"] and len(names) == len(set(names))
        assert names.index("HACRL_AGENT") < names.index("RUN")  # $(HACRL_AGENT) expands
        assert c["env"][-2] == {
            "name": "WANDB_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key", "optional": False}},
        }
        assert c["env"][-1]["valueFrom"]["configMapKeyRef"] == {"name": "net", "key": "proxy", "optional": True}
        assert c["envFrom"] == [
            {"configMapRef": {"name": "tuning", "optional": False}},
            {"secretRef": {"name": "extra", "optional": False}, "prefix": "X_"},
        ]
    assert "envFrom" not in container(builders.build_pod(experiment(), "qwen-bpe", role, OWNER, CONFIG))


def test_a_secret_of_env_or_env_from_waits_for_the_admins_approval() -> None:
    """The operator's SecretNotAllowed check reads spec.secret_references(): the new fields are in it."""
    from hacrl_operator.handlers.reconcile import Reconciler

    exp = experiment(
        env=[{"name": "W", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}}],
        envFrom=[{"secretRef": {"name": "extra"}}, {"configMapRef": {"name": "tuning"}}],
    )
    refused = Reconciler.refused_secrets(
        SimpleNamespace(config=OperatorConfig(experiment_secrets=("ns/wandb",))), exp, "ns"
    )
    assert refused == [
        (
            "spec.envFrom[0].secretRef: Secret 'extra' is not approved for experiments; ask the cluster admin to add "
            "'extra' or 'ns/extra' to the chart value experimentSecrets (HACRL_EXPERIMENT_SECRETS)"
        )
    ]


@pytest.mark.parametrize("role", builders.ROLES)
def test_model_cache_claim_is_mounted_where_models_and_hf_home_live(role: str) -> None:
    def cache(pod: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        c = container(pod)
        return (
            [m for m in c["volumeMounts"] if m["name"] == builders.MODEL_CACHE_VOLUME],
            [v for v in pod["spec"]["volumes"] if v["name"] == builders.MODEL_CACHE_VOLUME],
        )

    assert cache(builders.build_pod(experiment(), "qwen-bpe", role, OWNER, CONFIG)) == ([], [])
    exp = experiment(modelCache={"claimName": "models"})
    exp.spec.agents[0].model_cache = ModelCacheSpec(claim_name="llama-models")
    for agent, claim in (("qwen-bpe", "models"), ("llama-char", "llama-models")):
        pod = builders.build_pod(exp, agent, role, OWNER, CONFIG)
        mounts, volumes = cache(pod)
        assert mounts == [{"name": "model-cache", "mountPath": "/var/cache/hacrl/models"}]
        assert volumes == [{"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}}]
        variables = env(pod)
        # hacrl_core.context.cache_root() / "models" and HF_HOME are both on the claim; scratch is not.
        assert variables["HACRL_CACHE"]["value"] + "/models" == builders.MODEL_CACHE_DIR
        assert variables["HF_HOME"]["value"].startswith(builders.MODEL_CACHE_DIR + "/")


@pytest.mark.parametrize(
    "example", ["paper-qwen3-4b-llama3.2-3b.yaml", "paper-qwen3-1.7b-4b.yaml", "gpu-qwen3-llama.yaml"]
)
def test_pods_of_the_gpu_examples_with_env_and_model_cache_are_valid_kubernetes(example: str) -> None:
    """The pods as the API server's schema (kubernetes-validate, strict) reads them: the dumped
    env/envFrom references, the claim, the podTemplate affinity and ephemeral-storage."""
    import kubernetes_validate

    document = yaml.safe_load((REPO / "examples" / example).read_text())
    document["spec"]["env"] = [
        {"name": "A", "value": "1"},
        {"name": "W", "valueFrom": {"secretKeyRef": {"name": "w", "key": "k"}}},
    ]
    document["spec"]["envFrom"] = [
        {"configMapRef": {"name": "c"}},
        {"secretRef": {"name": "s", "optional": True}, "prefix": "X_"},
    ]
    document["spec"]["modelCache"] = {"claimName": "models"}
    exp = parse_experiment(document)
    for agent in exp.spec.agents:
        for role in builders.ROLES:
            kubernetes_validate.validate(builders.build_pod(exp, agent.name, role, OWNER, CONFIG), "1.33", strict=True)


@pytest.mark.parametrize("role", builders.ROLES)
def test_containers_without_a_gpu_limit_see_no_gpu_and_those_with_one_get_the_device_plugins(role: str) -> None:
    """The CUDA and vLLM bases set NVIDIA_VISIBLE_DEVICES=all: a container with no GPU of its own
    would see every GPU of its node, so it gets `void`; one with a GPU limit keeps what the device
    plugin gives it."""
    exp = experiment()
    exp.spec.agents[0].resources.rollout = {"limits": {"nvidia.com/gpu": 1}}
    exp.spec.agents[0].resources.learner = {"limits": {"nvidia.com/gpu": "2"}}
    exp.spec.agents[0].pod_template.rollout = exp.spec.agents[0].pod_template.learner = {
        "containers": [{"name": "sidecar", "image": "s"}],
        "initContainers": [{"name": "fetch", "image": "f"}],
    }
    exp.spec.agents[1].resources.rollout = {"requests": {"cpu": "1"}}
    exp.spec.agents[1].resources.learner = {"limits": {"nvidia.com/gpu": 0}}

    def visible(pod: dict[str, Any]) -> dict[str, str | None]:
        return {
            c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])}.get("NVIDIA_VISIBLE_DEVICES")
            for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
        }

    with_gpu = builders.build_pod(exp, "llama-char", role, OWNER, CONFIG)
    assert visible(with_gpu) == {role: None, "sidecar": "void", "fetch": "void"}
    assert visible(builders.build_pod(exp, "qwen-bpe", role, OWNER, CONFIG)) == {role: "void"}
    assert visible(builders.build_pod(experiment(), "qwen-bpe", role, OWNER, CONFIG)) == {role: "void"}
    mine = experiment(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])
    assert visible(builders.build_pod(mine, "qwen-bpe", role, OWNER, CONFIG)) == {role: "none"}


def test_ephemeral_storage_requests_pass_through_resources() -> None:
    exp = experiment()
    exp.spec.agents[0].resources.learner = {
        "requests": {"ephemeral-storage": "100Gi"},
        "limits": {"ephemeral-storage": "150Gi"},
    }
    c = container(builders.build_pod(exp, "llama-char", "learner", OWNER, CONFIG))
    assert c["resources"] == {"requests": {"ephemeral-storage": "100Gi"}, "limits": {"ephemeral-storage": "150Gi"}}


def test_resources_scheduling_images_and_pod_template_override() -> None:
    exp = experiment(
        images={"rollout": "mine/rollout:2", "pullPolicy": "Always"},
        scheduling={
            "nodeSelector": {"a": "b"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {}},
            "priorityClassName": "high",
            "schedulerName": "volcano",
        },
    )
    exp.spec.agents[0].resources.rollout = {"limits": {"nvidia.com/gpu": 2}}
    exp.spec.agents[0].pod_template.rollout = {
        "containers": [
            {"name": "rollout", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}], "securityContext": None},
            {"name": "sidecar", "image": "s"},
        ],
        "initContainers": [{"name": "fetch", "image": "f", "securityContext": {"runAsUser": 2000}}],
        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
        "enableServiceLinks": None,
        "securityContext": None,
        "metadata": {
            "labels": {"kueue.x-k8s.io/queue-name": "gpu", "hacrl.io/role": "spoofed"},
            "annotations": {"team": "a"},
        },
    }
    pod = builders.build_pod(exp, "llama-char", "rollout", OWNER, CONFIG)
    spec = pod["spec"]
    assert container(pod)["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert container(pod)["image"] == "mine/rollout:2" and container(pod)["imagePullPolicy"] == "Always"
    assert (spec["nodeSelector"], spec["priorityClassName"], spec["schedulerName"]) == ({"a": "b"}, "high", "volcano")
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}] and spec["affinity"] == {"podAntiAffinity": {}}
    assert [c["name"] for c in spec["containers"]] == ["rollout", "sidecar"]
    assert env(pod)["VLLM_LOGGING_LEVEL"]["value"] == "DEBUG" and "HACRL_AGENT" in env(pod)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    assert "enableServiceLinks" not in spec and "metadata" not in spec
    labels = pod["metadata"]["labels"]
    assert (
        labels["kueue.x-k8s.io/queue-name"] == "gpu" and labels["hacrl.io/role"] == "rollout"
    )  # the operator's labels win
    assert pod["metadata"]["annotations"]["team"] == "a"
    # Every container, sidecars and init containers included, runs locked down whatever the
    # override said (a null securityContext, none at all, or only a user id).
    locked = {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for c in spec["containers"] + spec["initContainers"]:
        assert {k: c["securityContext"].get(k) for k in locked} == locked, c["name"]
    assert spec["initContainers"][0]["securityContext"]["runAsUser"] == 2000
    assert spec["securityContext"] == {
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    learner = builders.build_pod(exp, "llama-char", "learner", OWNER, CONFIG)
    assert container(learner)["image"] == "img/learner:1" and "resources" not in container(learner)


@pytest.mark.parametrize(
    ("base", "override", "expected"),
    [
        ({"a": 1, "b": {"c": 1}}, {"b": {"d": 2}}, {"a": 1, "b": {"c": 1, "d": 2}}),
        ({"a": 1}, {"a": None}, {}),
        ({"tolerations": [1, 2]}, {"tolerations": [3]}, {"tolerations": [3]}),
        (
            {"env": [{"name": "A", "value": "1"}]},
            {"env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]},
            {"env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]},
        ),
    ],
)
def test_merge_pod_spec(base: dict, override: dict, expected: dict) -> None:
    assert builders.merge_pod_spec(base, override) == expected


def test_build_pod_rejects_unknown_role_and_agent() -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        builders.build_pod(experiment(), "qwen-bpe", "critic", OWNER, CONFIG)
    with pytest.raises(KeyError, match="no agent 'nobody'"):
        builders.build_pod(experiment(), "nobody", "learner", OWNER, CONFIG)
    # A pod of the other placement is refused: colocated and split pods never mix in one experiment.
    with pytest.raises(ValueError, match=r"one of \('colocated',\)"):
        builders.build_pod(experiment(colocate=True), "qwen-bpe", "rollout", OWNER, CONFIG)
    with pytest.raises(ValueError, match="one of \\('rollout', 'learner'\\)"):
        builders.build_pod(experiment(), "qwen-bpe", "colocated", OWNER, CONFIG)


@pytest.mark.parametrize(
    "colocate, roles, pods",
    [(None, ("rollout", "learner"), 4), (False, ("rollout", "learner"), 4), (True, ("colocated",), 2)],
)
def test_the_operator_splits_pods_unless_the_spec_asks_for_colocation(colocate, roles, pods) -> None:
    exp = experiment(**({} if colocate is None else {"colocate": colocate}))
    assert builders.roles_of(exp) == roles and builders.pod_count(exp) == pods


# -- learners over several nodes (issue 15 item 1) -----------------------------------------------


def two_node_learner(**spec_changes: Any):
    """The quickstart with qwen-bpe's learner over 2 nodes of 2 ranks each."""
    exp = experiment(**spec_changes)
    exp.spec.agents[1].learner.nodes = 2
    exp.spec.agents[1].learner.processes_per_node = 2
    return exp


def test_a_learner_over_two_nodes_is_two_pods_with_dns_names_under_a_headless_service() -> None:
    import kubernetes_validate

    exp = two_node_learner()
    service_name = builders.rendezvous_service_name("quickstart", "qwen-bpe")
    names = builders.pod_names(exp, "qwen-bpe", "learner")
    assert names == [builders.pod_name("quickstart", "qwen-bpe", f"learner-{node}") for node in (0, 1)]
    assert names[0].startswith("quickstart-qwen-bpe-learner-0-") and names[1].startswith(
        "quickstart-qwen-bpe-learner-1-"
    )
    # One node keeps today's names: nothing changes for the other agent, nor for its rollout pod.
    assert builders.pod_names(exp, "llama-char", "learner") == [
        builders.pod_name("quickstart", "llama-char", "learner")
    ]
    assert builders.pod_names(exp, "qwen-bpe", "rollout") == [builders.pod_name("quickstart", "qwen-bpe", "rollout")]
    address = f"learner-0.{service_name}.ns.svc"
    for node, name in enumerate(names):
        pod = builders.build_pod(exp, "qwen-bpe", "learner", OWNER, CONFIG, node=node)
        assert pod["metadata"]["name"] == name and pod["metadata"]["labels"]["hacrl.io/node"] == str(node)
        assert (
            pod["metadata"]["labels"]["hacrl.io/role"] == "learner"
            and pod["metadata"]["labels"]["hacrl.io/agent"] == "qwen-bpe"
        )
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"learner-{node}", service_name)
        variables = {k: v.get("value") for k, v in env(pod).items()}
        assert (variables["HACRL_NODE_RANK"], variables["MASTER_ADDR"], variables["MASTER_PORT"]) == (
            str(node),
            address,
            "29500",
        )
        assert container(pod)["command"] == [
            "hacrl",
            "worker",
            "learner",
            "--spec",
            "/etc/hacrl/spec.yaml",
            "--agent",
            "qwen-bpe",
        ]
        kubernetes_validate.validate(pod, "1.33", strict=True)
    for agent, role in (("llama-char", "learner"), ("qwen-bpe", "rollout")):
        pod = builders.build_pod(exp, agent, role, OWNER, CONFIG)
        assert (
            "hacrl.io/node" not in pod["metadata"]["labels"]
            and "hostname" not in pod["spec"]
            and "subdomain" not in pod["spec"]
        )
        assert not {"HACRL_NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env(pod))
    with pytest.raises(ValueError, match="node must be 0 to 1"):
        builders.build_pod(exp, "qwen-bpe", "learner", OWNER, CONFIG, node=2)

    service = builders.build_rendezvous_service(exp, "qwen-bpe", OWNER)
    assert (
        service["kind"] == "Service"
        and service["metadata"]["name"] == service_name
        and service["metadata"]["namespace"] == "ns"
    )
    assert service["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        "hacrl.io/experiment": "quickstart",
        "hacrl.io/agent": "qwen-bpe",
        "hacrl.io/role": "learner",
    }
    assert service["spec"]["ports"] == [{"name": "rendezvous", "port": 29500, "targetPort": 29500, "protocol": "TCP"}]
    kubernetes_validate.validate(service, "1.33", strict=True)
    assert builders.build_rendezvous_service(exp, "llama-char", OWNER) is None  # one node: no Service


def test_the_gang_counts_every_node_of_a_learner_and_colocated_learners_span_nodes_too() -> None:
    assert builders.pod_count(two_node_learner()) == 5
    kueue = two_node_learner(scheduling={"gang": "kueue", "queueName": "team-a"})
    for node in (0, 1):
        pod = builders.build_pod(kueue, "qwen-bpe", "learner", OWNER, CONFIG, node=node)
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "5"
    assert builders.build_pod_group(two_node_learner(scheduling={"gang": "volcano"}), OWNER)["spec"]["minMember"] == 5
    # Colocated: the pod that trains is the one per node (its rank 0 samples).
    colocated = two_node_learner(colocate=True)
    assert builders.pod_count(colocated) == 3
    pod = builders.build_pod(colocated, "qwen-bpe", "colocated", OWNER, CONFIG, node=1)
    assert pod["spec"]["hostname"] == "colocated-1" and env(pod)["MASTER_ADDR"]["value"].startswith("colocated-0.")
    assert (
        builders.build_rendezvous_service(colocated, "qwen-bpe", OWNER)["spec"]["selector"]["hacrl.io/role"]
        == "colocated"
    )


@pytest.mark.parametrize("experiment_name, agent", [("quickstart", "qwen-bpe"), ("e" * 40, "a" * 40), ("1st", "b")])
def test_rendezvous_service_names_are_dns_1035_labels_unique_per_experiment_and_agent(
    experiment_name: str, agent: str
) -> None:
    name = builders.rendezvous_service_name(experiment_name, agent)
    assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
    assert name != builders.rendezvous_service_name(experiment_name, agent + "x")


def test_spec_env_may_not_set_the_rendezvous() -> None:
    with pytest.raises(Exception, match="'MASTER_ADDR' is set by the operator.*learner over several nodes"):
        experiment(env=[{"name": "MASTER_ADDR", "value": "x"}])


# -- rollouts with several replicas (issue 15 item 2) --------------------------------------------


def two_replica_rollout(**spec_changes: Any):
    """The quickstart with llama-char's rollout in 2 replicas, with rollout resources and a pod template."""
    exp = experiment(**spec_changes)
    agent = exp.spec.agents[0]
    agent.rollout.replicas = 2
    agent.resources.rollout = {"limits": {"cpu": "3", "memory": "8Gi"}}
    agent.pod_template.rollout = {"metadata": {"labels": {"team": "a"}}, "nodeSelector": {"pool": "rollout"}}
    return exp


def test_a_rollout_with_two_replicas_is_two_pods_each_with_its_replica_index() -> None:
    import kubernetes_validate

    exp = two_replica_rollout()
    names = builders.pod_names(exp, "llama-char", "rollout")
    assert names == [builders.pod_name("quickstart", "llama-char", f"rollout-{replica}") for replica in (0, 1)]
    assert names[0].startswith("quickstart-llama-char-rollout-0-") and names[1].startswith(
        "quickstart-llama-char-rollout-1-"
    )
    # One replica keeps today's names: nothing changes for the other agent, nor for the learner.
    assert builders.pod_names(exp, "qwen-bpe", "rollout") == [builders.pod_name("quickstart", "qwen-bpe", "rollout")]
    assert builders.pod_names(exp, "llama-char", "learner") == [
        builders.pod_name("quickstart", "llama-char", "learner")
    ]
    for replica, name in enumerate(names):
        pod = builders.build_pod(exp, "llama-char", "rollout", OWNER, CONFIG, replica=replica)
        labels = pod["metadata"]["labels"]
        assert pod["metadata"]["name"] == name and labels["hacrl.io/replica"] == str(replica) and labels["team"] == "a"
        assert (labels["hacrl.io/role"], labels["hacrl.io/agent"]) == (
            "rollout",
            "llama-char",
        ) and "hacrl.io/node" not in labels
        assert env(pod)["HACRL_ROLLOUT_REPLICA"] == {"name": "HACRL_ROLLOUT_REPLICA", "value": str(replica)}
        assert container(pod)["command"] == [
            "hacrl",
            "worker",
            "rollout",
            "--spec",
            "/etc/hacrl/spec.yaml",
            "--agent",
            "llama-char",
        ]
        assert container(pod)["resources"] == {"limits": {"cpu": "3", "memory": "8Gi"}} and pod["spec"][
            "nodeSelector"
        ] == {"pool": "rollout"}
        assert "hostname" not in pod["spec"] and "subdomain" not in pod["spec"]  # independent: no rendezvous
        assert not {"HACRL_NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env(pod))
        kubernetes_validate.validate(pod, "1.33", strict=True)
    for agent, role in (("qwen-bpe", "rollout"), ("llama-char", "learner")):
        pod = builders.build_pod(exp, agent, role, OWNER, CONFIG)
        assert "hacrl.io/replica" not in pod["metadata"]["labels"] and "HACRL_ROLLOUT_REPLICA" not in env(pod)
    assert builders.build_rendezvous_service(exp, "llama-char", OWNER) is None
    with pytest.raises(
        ValueError, match=r"replica must be 0 to 1 for agent 'llama-char'.s rollout pods \(rollout.replicas 2\), got 2"
    ):
        builders.build_pod(exp, "llama-char", "rollout", OWNER, CONFIG, replica=2)
    with pytest.raises(ValueError, match="replica must be 0 to 0 for agent 'llama-char'.s learner pods"):
        builders.build_pod(exp, "llama-char", "learner", OWNER, CONFIG, replica=1)


def test_the_gang_counts_every_replica_of_a_rollout_and_every_node_of_a_learner() -> None:
    assert builders.pod_count(two_replica_rollout()) == 5
    kueue = two_replica_rollout(scheduling={"gang": "kueue", "queueName": "team-a"})
    kueue.spec.agents[1].learner.nodes = 2
    assert builders.pod_count(kueue) == 6
    pods = [builders.build_pod(kueue, "llama-char", "rollout", OWNER, CONFIG, replica=replica) for replica in (0, 1)]
    pods += [builders.build_pod(kueue, "qwen-bpe", "learner", OWNER, CONFIG, node=node) for node in (0, 1)]
    assert {pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for pod in pods} == {"6"}
    assert (
        builders.build_pod_group(two_replica_rollout(scheduling={"gang": "volcano"}), OWNER)["spec"]["minMember"] == 5
    )


# -- configuration ------------------------------------------------------------------------------


def test_config_defaults_and_values() -> None:
    assert OperatorConfig.from_env({}).clusterwide
    config = OperatorConfig.from_env(
        {
            "HACRL_WATCH_NAMESPACES": "team-a, team-b",
            "HACRL_ROLLOUT_IMAGE": "r:1",
            "HACRL_RECONCILE_INTERVAL": "2.5",
            "HACRL_WATCH_SERVER_TIMEOUT": "60",
        }
    )
    assert config.namespaces == ("team-a", "team-b") and not config.clusterwide
    assert config.watches("team-a") and not config.watches("other")
    assert (config.rollout_image, config.reconcile_interval) == ("r:1", 2.5)
    assert (config.watch_server_timeout, config.watch_client_timeout) == (60, 90)
    assert OperatorConfig.from_env({"HACRL_WATCH_NAMESPACES": "*"}).clusterwide


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HACRL_RECONCILE_INTERVAL", "soon", "HACRL_RECONCILE_INTERVAL='soon' is not a number"),
        ("HACRL_RECONCILE_INTERVAL", "-1", "must be a positive number"),
        ("HACRL_OPERATOR_METRICS_PORT", "70000", "HACRL_OPERATOR_METRICS_PORT='70000' is out of range"),
        ("HACRL_WATCH_NAMESPACES", "Team_A", "HACRL_WATCH_NAMESPACES='Team_A': 'Team_A' is not a namespace name"),
        ("HACRL_LEARNER_IMAGE", "a b", "HACRL_LEARNER_IMAGE='a b' is not a container image"),
        ("HACRL_WATCH_CLIENT_TIMEOUT", "10", "HACRL_WATCH_CLIENT_TIMEOUT='10' is out of range"),
    ],
)
def test_config_errors_name_the_variable_and_value(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OperatorConfig.from_env({variable: value})


def test_default_store_settings() -> None:
    assert OperatorConfig.from_env({}).default_store is None
    store = OperatorConfig.from_env(MINIO).default_store
    assert (store.uri, store.endpoint, store.region, store.credentials_secret) == (
        "s3://hacrl",
        "http://hacrl-minio.hacrl-system.svc:9000",
        "us-east-1",
        "hacrl-minio",
    )
    assert (
        OperatorConfig.from_env({"HACRL_DEFAULT_STORE_URI": "s3://runs/team"}).default_store.endpoint is None
    )  # AWS S3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"HACRL_DEFAULT_STORE_ENDPOINT": "http://minio:9000"},
            "HACRL_DEFAULT_STORE_ENDPOINT set but HACRL_DEFAULT_STORE_URI is empty",
        ),
        ({"HACRL_DEFAULT_STORE_URI": "file://./runs"}, "HACRL_DEFAULT_STORE_URI='file://./runs' is not an S3 store"),
        ({"HACRL_DEFAULT_STORE_URI": "s3://"}, "HACRL_DEFAULT_STORE_URI='s3://': s3 store needs a bucket"),
        (
            {**MINIO, "HACRL_DEFAULT_STORE_ENDPOINT": "minio:9000"},
            "HACRL_DEFAULT_STORE_ENDPOINT='minio:9000': 'minio:9000' is not an S3 endpoint URL",
        ),
        (
            {**MINIO, "HACRL_DEFAULT_STORE_CREDENTIALS_SECRET": "S3_Keys"},
            "HACRL_DEFAULT_STORE_CREDENTIALS_SECRET='S3_Keys': 'S3_Keys' is not a Secret name",
        ),
    ],
)
def test_default_store_errors_name_the_variable(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        OperatorConfig.from_env(settings)


def test_python_m_hacrl_operator_reports_config_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hacrl_operator.__main__ import main

    monkeypatch.setenv("HACRL_OPERATOR_HEALTH_PORT", "http")
    assert main() == 2
    assert "HACRL_OPERATOR_HEALTH_PORT='http' is not an integer" in capsys.readouterr().err


# -- RBAC ---------------------------------------------------------------------------------------


def test_rbac_lists_what_the_operator_uses_and_no_secrets() -> None:
    permissions = {(group, resource): set(verbs) for group, resource, verbs in rbac.PERMISSIONS}
    assert {"create", "delete", "list", "watch", "get"} <= permissions[("", "pods")]
    assert {"get", "create", "patch"} <= permissions[("", "configmaps")]
    assert {"patch"} <= permissions[("hacrl.io", "hacrlexperiments/status")]
    assert {"list", "watch", "patch", "delete"} <= permissions[("hacrl.io", "hacrlexperiments")]
    assert "create" in permissions[("", "events")]
    assert {"get", "create"} <= permissions[("", "services")]  # the headless Service of a learner over several nodes
    assert ("", "secrets") not in permissions
    assert permissions[("coordination.k8s.io", "leases")] == {"get", "create", "patch"}  # leader election (leader.py)
    assert all(r.scope in ("namespace", "cluster", "lease") for r in rbac.RULES)
    assert rbac.as_policy_rules("cluster") and all(rule["verbs"] for rule in rbac.as_policy_rules())


class StubKube:
    """The few calls ``Reconciler.ensure_pod_group`` makes, on a dict; ``missing`` plays a cluster
    without Volcano's CRDs (404 on the podgroups collection)."""

    def __init__(self, missing: bool = False) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.missing = missing
        self.calls: list[str] = []

    def _check(self) -> None:
        from hacrl_operator.kube import KubeError

        if self.missing:
            raise KubeError(
                404,
                "POST /apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups: 404 Not Found: the server could not find the requested resource",
            )

    def get_object(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("get")
        return self.objects.get(manifest["metadata"]["name"])

    def create(self, manifest: dict[str, Any]) -> bool:
        self.calls.append("create")
        self._check()
        self.objects[manifest["metadata"]["name"]] = manifest
        return True

    def patch_spec(self, manifest: dict[str, Any]) -> None:
        self.calls.append("patch")
        self.objects[manifest["metadata"]["name"]]["spec"] = dict(manifest["spec"])


def test_the_volcano_pod_group_is_created_kept_equal_and_its_absence_said_once() -> None:
    from hacrl_operator.handlers.reconcile import Reconciler
    from hacrl_operator.metrics import OperatorMetrics
    from hacrl_operator.status import Observed, fold_outcome, plan_reconcile

    reconciler = Reconciler(OperatorConfig(), OperatorMetrics())
    exp = experiment(scheduling={"gang": "volcano"})
    reconciler.kube = kube = StubKube()
    created = reconciler.ensure_pod_group(exp, OWNER, None)
    assert kube.objects["quickstart-u1"]["spec"] == {"minMember": 4} and [e.reason for e in created.events] == [
        "PodGroupCreated"
    ]
    assert reconciler.ensure_pod_group(exp, OWNER, None).events == ()
    assert kube.calls == ["get", "create", "get"]  # equal: nothing written
    queued = experiment(scheduling={"gang": "volcano", "queueName": "research"})
    reconciler.ensure_pod_group(queued, OWNER, None)
    assert kube.calls[-1] == "patch" and kube.objects["quickstart-u1"]["spec"] == {"minMember": 4, "queue": "research"}

    reconciler.kube = StubKube(missing=True)  # Volcano not installed
    first = plan_reconcile(Observed(experiment=exp))
    first = fold_outcome(first, reconciler.ensure_pod_group(exp, OWNER, first.conditions.previous("Ready")))
    ready = next(c for c in first.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == (
        "False",
        "PodGroupCreateFailed",
    ) and "is Volcano installed?" in ready.message
    assert [(e.type, e.reason) for e in first.events if e.reason == "PodGroupCreateFailed"] == [
        ("Warning", "PodGroupCreateFailed")
    ]
    again = plan_reconcile(Observed(experiment=exp, status=first.status))
    again = fold_outcome(again, reconciler.ensure_pod_group(exp, OWNER, again.conditions.previous("Ready")))
    assert not [e for e in again.events if e.reason == "PodGroupCreateFailed"]  # said once
    ready = next(c for c in again.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "PodGroupCreateFailed")  # and still the condition
