"""Pure builders of the objects the operator creates: manifest dicts, no I/O.

Per experiment: one ConfigMap with the rendered spec; per agent: a rollout Pod and a learner Pod
(or, with ``spec.colocate``, one colocated Pod) running the same worker entry points as
`hacrl run` (docs/architecture.md, "On a cluster"), with the
experiment's env and envFrom and the agent's model cache claim; with ``spec.scheduling.gang`` the
pods' gang labels and annotations (Kueue) or a PodGroup (Volcano).

A learner over several nodes (``agents[].learner.nodes`` N > 1) is N pods of the training role
(learner, or colocated), one per node, ``<experiment>-<agent>-<role>-<node>-<hash>`` with the label
``hacrl.io/node``, behind a headless Service of the agent (``rendezvous_service_name``) that gives
each pod a DNS name (``hostname`` <role>-<node>, ``subdomain`` the Service): every pod gets
HACRL_NODE_RANK, and MASTER_ADDR/MASTER_PORT pointing at node 0, which its launcher reads
(hacrl_core.learner.distributed.node_placement). With N == 1 it is one pod,
``<experiment>-<agent>-<role>-<hash>``, without the node label, the Service or those variables.

A rollout with several replicas (``agents[].rollout.replicas`` R > 1) is R rollout pods,
``<experiment>-<agent>-rollout-<replica>-<hash>`` with the label ``hacrl.io/replica`` and
HACRL_ROLLOUT_REPLICA (the slice of each step's prompts the replica samples). Unlike a learner's
nodes they run independently (no Service, no rendezvous). With R == 1 it is one pod,
``<experiment>-<agent>-rollout-<hash>``, without the replica label and variable.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from typing import Any

import yaml

from hacrl_core.pod_policy import lock_down
from hacrl_core.spec import (
    API_GROUP,
    API_VERSION,
    KIND,
    NODE_RANK_ENV,
    RENDEZVOUS_PORT,
    ROLLOUT_REPLICA_ENV,
    Experiment,
    StoreSpec,
    dump_experiment,
    gpu_count,
)
from hacrl_operator.config import OperatorConfig

ROLES = ("rollout", "learner")  # the split placement: a rollout and a learner pod per agent
COLOCATED = "colocated"  # spec.colocate: one pod per agent samples and trains
ALL_ROLES = (*ROLES, COLOCATED)
# The role whose image, resources and podTemplate a pod is built from: a colocated pod runs the
# learner's image (transformers samples there) on the learner's GPUs, as one container named learner.
TEMPLATE_ROLE = {"rollout": "rollout", "learner": "learner", COLOCATED: "learner"}

LABEL_EXPERIMENT = f"{API_GROUP}/experiment"
LABEL_AGENT = f"{API_GROUP}/agent"
LABEL_ROLE = f"{API_GROUP}/role"
LABEL_NODE = f"{API_GROUP}/node"  # the node rank of a pod of a learner over several nodes (absent otherwise)
LABEL_REPLICA = f"{API_GROUP}/replica"  # the replica index of a pod of a rollout with several replicas (absent otherwise)

# A learner over several nodes: the roles that train (one pod per node).
TRAINING_ROLES = ("learner", COLOCATED)

SPEC_MOUNT = "/etc/hacrl"
SPEC_FILE = "spec.yaml"
SPEC_PATH = f"{SPEC_MOUNT}/{SPEC_FILE}"
WORK_DIR = "/var/lib/hacrl"  # working directory: relative file:// stores land here
CACHE_DIR = "/var/cache/hacrl"  # HF, torch and triton caches (root filesystem is read-only)
# $HACRL_CACHE/models: hub downloads, tiny builds, s3:// models (hacrl_core/models/uri.py), and
# HF_HOME beneath it: the one directory spec.modelCache's claim is mounted at (else the emptyDir).
MODEL_CACHE_DIR = f"{CACHE_DIR}/models"
MODEL_CACHE_VOLUME = "model-cache"

# The only keys ever read from `spec.store.credentialsSecret` (by reference, never copied).
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

# Gang scheduling with the cluster's own schedulers (spec.scheduling.gang).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"

# What cluster autoscalers read before evicting a pod to remove its node: Cluster Autoscaler and
# Karpenter. On both roles by default: an evicted learner loses the steps since its checkpoint,
# and an evicted rollout pod stalls every learner of the experiment (they wait for each agent's
# rollouts of the step) for a model load. podTemplate.<role>.metadata.annotations may override them.
NO_AUTOSCALER_EVICTION = {
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
    "karpenter.sh/do-not-disrupt": "true",
}


def configmap_name(experiment: str) -> str:
    return f"{experiment}-spec"


def pod_name(experiment: str, agent: str, role: str) -> str:
    """``<experiment>-<agent>-<role>-<hash>``: readable, and injective thanks to the hash of the
    (experiment, agent) pair. Without it experiment `a-b` with agent `c` and experiment `a` with
    agent `b-c` would both need pod `a-b-c-learner`."""
    digest = base64.b32encode(hashlib.sha256(f"{experiment}/{agent}".encode()).digest()).decode().lower()
    return f"{experiment}-{agent}-{role}-{digest[:5]}"


def node_count(experiment: Experiment, agent: str, role: str) -> int:
    """Pods of ``agent``'s ``role``: ``learner.nodes`` for the role that trains, else 1."""
    return experiment.spec.agent(agent).learner.nodes if role in TRAINING_ROLES else 1


def replica_count(experiment: Experiment, agent: str, role: str) -> int:
    """Independent pods of ``agent``'s ``role``: ``rollout.replicas`` for the rollout role, else 1
    (the spec keeps a colocated agent at one replica)."""
    return experiment.spec.agent(agent).rollout.replicas if role == "rollout" else 1


def role_pod_count(experiment: Experiment, agent: str, role: str) -> int:
    """Pods of ``agent``'s ``role``: one per node of a learner over several nodes, one per replica
    of a rollout with several replicas, else one."""
    return node_count(experiment, agent, role) * replica_count(experiment, agent, role)


def pod_names(experiment: Experiment, agent: str, role: str) -> list[str]:
    """The usual names of ``agent``'s ``role`` pods, node (or replica) 0 first: ``pod_name`` for one
    pod, ``<experiment>-<agent>-<role>-<index>-<hash>`` for each of several."""
    count = role_pod_count(experiment, agent, role)
    if count == 1:
        return [pod_name(experiment.name, agent, role)]
    return [pod_name(experiment.name, agent, f"{role}-{index}") for index in range(count)]


def rendezvous_service_name(experiment: str, agent: str) -> str:
    """The headless Service of ``agent``'s learner over several nodes: a DNS-1035 label (at most 63
    characters, starting with a letter) that ends with the (experiment, agent) hash of
    ``pod_name``, so two experiments never share one."""
    digest = pod_name(experiment, agent, "x").rsplit("-", 1)[1]
    stem = f"{experiment}-{agent}"
    if not stem[0].isalpha():
        stem = f"hx-{stem}"
    return f"{stem[: 63 - len(digest) - 1].rstrip('-')}-{digest}"


def rendezvous_address(experiment: str, agent: str, role: str, namespace: str) -> str:
    """MASTER_ADDR of a learner over several nodes: node 0's DNS name under the agent's headless
    Service, namespace-qualified (any cluster domain: the pods' resolver appends it)."""
    return f"{role}-0.{rendezvous_service_name(experiment, agent)}.{namespace}.svc"


def build_rendezvous_service(experiment: Experiment, agent: str, owner: dict[str, Any]) -> dict[str, Any] | None:
    """The headless Service of ``agent``'s learner pods when they span several nodes, else None.

    It gives each pod (``hostname`` + ``subdomain``) a DNS name, and node 0's is the rendezvous
    (``MASTER_ADDR``). ``publishNotReadyAddresses``: the names resolve as soon as the pods have
    addresses, before any readiness. Owned by the experiment (garbage-collected with it)."""
    roles = [role for role in roles_of(experiment) if node_count(experiment, agent, role) > 1]
    if not roles:
        return None
    (role,) = roles
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": rendezvous_service_name(experiment.name, agent),
            "namespace": owner["metadata"]["namespace"],
            "labels": {**experiment_labels(experiment.name), LABEL_AGENT: agent},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_EXPERIMENT: experiment.name, LABEL_AGENT: agent, LABEL_ROLE: role},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
        },
    }


def replacement_pod_name(name: str) -> str:
    """The other name of a pod: used while a pod being deleted still holds the usual one (e.g. a
    Kueue finalizer, which stays until the replacement exists); the two names alternate."""
    return name.removesuffix("-r") if name.endswith("-r") else f"{name}-r"


def roles_of(experiment: Experiment) -> tuple[str, ...]:
    """The pod roles of each agent: rollout and learner, or one colocated pod (``spec.colocate``)."""
    return (COLOCATED,) if experiment.spec.runs_colocated(by_default=False) else ROLES


def pod_count(experiment: Experiment) -> int:
    """The experiment's pods (the gang's size): one per role per agent, one per node of a learner
    over several nodes, and one per replica of a rollout with several replicas."""
    return sum(role_pod_count(experiment, agent.name, role) for agent in experiment.spec.agents for role in roles_of(experiment))


def gang_name(experiment: str, uid: str | None) -> str:
    """The Kueue pod group (and so Workload) or Volcano PodGroup of the experiment: its name and
    the start of its uid, so that an experiment deleted and created again under the same name
    never joins the old gang while that is still being garbage-collected."""
    return f"{experiment}-{uid.replace('-', '')[:8]}" if uid else experiment


def gang_metadata(experiment: Experiment, uid: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """The (labels, annotations) that put a pod into the experiment's gang; none without one."""
    scheduling = experiment.spec.scheduling
    group = gang_name(experiment.name, uid)
    if scheduling.gang == "kueue":
        labels = {KUEUE_QUEUE_LABEL: str(scheduling.queue_name), KUEUE_GROUP_LABEL: group}
        return labels, {KUEUE_GROUP_COUNT_ANNOTATION: str(pod_count(experiment))}
    if scheduling.gang == "volcano":
        return {}, {VOLCANO_GROUP_ANNOTATION: group}
    return {}, {}


def build_pod_group(experiment: Experiment, owner: dict[str, Any]) -> dict[str, Any] | None:
    """The Volcano PodGroup of the experiment (gang volcano), else None: every pod or none.

    minMember is the pod count; the queue is ``scheduling.queueName`` (Volcano's ``default``
    queue when absent); owned by the experiment, so it goes when the experiment goes."""
    scheduling = experiment.spec.scheduling
    if scheduling.gang != "volcano":
        return None
    spec: dict[str, Any] = {"minMember": pod_count(experiment)}
    if scheduling.queue_name:
        spec["queue"] = scheduling.queue_name
    if scheduling.priority_class_name:
        spec["priorityClassName"] = scheduling.priority_class_name
    return {
        "apiVersion": VOLCANO_API,
        "kind": "PodGroup",
        "metadata": {
            "name": gang_name(experiment.name, owner["metadata"].get("uid")),
            "namespace": owner["metadata"]["namespace"],
            "labels": experiment_labels(experiment.name),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": spec,
    }


def experiment_labels(experiment: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "hacrl",
        "app.kubernetes.io/managed-by": "hacrl-operator",
        "app.kubernetes.io/instance": experiment,
        LABEL_EXPERIMENT: experiment,
    }


def pod_labels(experiment: str, agent: str, role: str) -> dict[str, str]:
    return {**experiment_labels(experiment), "app.kubernetes.io/component": role, LABEL_AGENT: agent, LABEL_ROLE: role}


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """The owner reference of a child of experiment ``body`` (garbage-collected with it)."""
    metadata = body["metadata"]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


# Why an experiment without `spec.store` is refused when the install has no default store.
NO_STORE = (
    "spec.store: no store given, and this operator has no default store; name one in the experiment "
    "(spec.store: {uri: s3://bucket/prefix, endpoint: http(s)://host:port, credentialsSecret: <Secret>}) "
    "or ask the cluster admin to give the chart a default store (value defaultStore.uri, or minio.enabled=true for development)"
)


def omits_store(body: dict[str, Any]) -> bool:
    """True when the experiment names no store (``spec.store`` absent or null)."""
    spec = body.get("spec")
    return isinstance(spec, dict) and spec.get("store") is None


def rendered_store(configmap: dict[str, Any] | None, uid: str | None) -> StoreSpec | None:
    """The store in the rendered spec of ``configmap`` when experiment ``uid`` owns it, else None.

    For an experiment without ``spec.store`` this is the default store it got when its ConfigMap
    was first written: the operator keeps it, so a later change of the install's default moves no
    experiment away from its checkpoints."""
    if not configmap or not uid:
        return None
    owners = (configmap.get("metadata") or {}).get("ownerReferences") or []
    if not any(owner.get("uid") == uid for owner in owners):
        return None
    try:
        store = ((yaml.safe_load((configmap.get("data") or {}).get(SPEC_FILE) or "") or {}).get("spec") or {}).get("store")
        return StoreSpec.model_validate(store) if isinstance(store, dict) else None
    except (yaml.YAMLError, ValueError, AttributeError):
        return None


def experiment_from_body(body: dict[str, Any], default_store: StoreSpec | None = None) -> dict[str, Any]:
    """The document `parse_experiment` reads, from a custom resource's body.

    Only name and namespace of the metadata are kept: uid, resourceVersion, annotations and
    managed fields change all the time and are no part of the experiment. An experiment without
    ``spec.store`` gets ``default_store`` (the install's, ``OperatorConfig.default_store``); the
    rendered ConfigMap and the pods' env then carry it. The custom resource itself is left as
    the user wrote it.
    """
    metadata = body.get("metadata") or {}
    spec = body.get("spec")
    if omits_store(body):  # absent or null (as the API server would drop it)
        spec = {k: v for k, v in spec.items() if k != "store"}
        if default_store is not None:
            spec["store"] = default_store.model_dump(by_alias=True, exclude_none=True)
    return {
        "apiVersion": body.get("apiVersion", f"{API_GROUP}/{API_VERSION}"),
        "kind": body.get("kind", KIND),
        "metadata": {k: metadata[k] for k in ("name", "namespace") if metadata.get(k) is not None},
        "spec": spec,
    }


def build_configmap(experiment: Experiment, owner: dict[str, Any]) -> dict[str, Any]:
    name = experiment.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(name),
            "namespace": owner["metadata"]["namespace"],
            "labels": experiment_labels(name),
            "ownerReferences": [owner_reference(owner)],
        },
        "data": {SPEC_FILE: dump_experiment(experiment)},
    }


def worker_env(experiment: Experiment, agent: str, role: str, uid: str | None = None, node: int = 0,
               namespace: str | None = None, replica: int = 0) -> list[dict[str, Any]]:
    spec = experiment.spec
    env: list[dict[str, Any]] = [
        {"name": "HACRL_EXPERIMENT", "value": experiment.name},
        {"name": "HACRL_AGENT", "value": agent},
        {"name": "HACRL_ROLE", "value": role},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "HACRL_METRICS_BIND", "value": "0.0.0.0"},
        {"name": "HACRL_METRICS_PORT", "value": str(spec.metrics.port)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "HACRL_CACHE", "value": CACHE_DIR},  # models in MODEL_CACHE_DIR, scratch in work/
        {"name": "HF_HOME", "value": f"{MODEL_CACHE_DIR}/huggingface"},
        {"name": "TORCH_EXTENSIONS_DIR", "value": f"{CACHE_DIR}/torch_extensions"},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
    ]
    if spec.store.endpoint:
        env.append({"name": "HACRL_S3_ENDPOINT", "value": spec.store.endpoint})
    if spec.store.region:
        env.append({"name": "AWS_REGION", "value": spec.store.region})
    if spec.store.credentials_secret:
        for key in CREDENTIAL_KEYS:
            env.append({
                "name": key,
                "valueFrom": {"secretKeyRef": {"name": spec.store.credentials_secret, "key": key}},
            })
    if uid:  # the workers claim the store prefix for this experiment object (store/ownership.py)
        env.append({"name": "HACRL_EXPERIMENT_UID", "value": uid})
    if spec.model_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": spec.model_token_secret, "key": "HF_TOKEN"}}})
    if node_count(experiment, agent, role) > 1:  # one node of several: where it sits, where node 0 serves the rendezvous
        env += [{"name": NODE_RANK_ENV, "value": str(node)},
                {"name": "MASTER_ADDR", "value": rendezvous_address(experiment.name, agent, role, namespace or "default")},
                {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)}]
    if replica_count(experiment, agent, role) > 1:  # one replica of several: the slice of each step's prompts it samples
        env.append({"name": ROLLOUT_REPLICA_ENV, "value": str(replica)})
    # The user's, after the operator's (so `$(HACRL_AGENT)` expands in them); the spec refuses the
    # names above (hacrl_core.spec.OPERATOR_ENV), so none is set twice.
    env += [var.model_dump(by_alias=True, exclude_none=True) for var in spec.env]
    return env


def model_cache_mount(experiment: Experiment, agent: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (volume, volumeMount) of ``agent``'s model cache claim (``agents[].modelCache``, else
    ``spec.modelCache``) at MODEL_CACHE_DIR, inside the ``cache`` emptyDir; None without one."""
    cache = experiment.spec.model_cache_of(agent)
    if cache is None:
        return None
    return ({"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}},
            {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR})


# The NVIDIA container runtime exposes the GPUs named in this variable; the CUDA and vLLM base
# images set it to `all`, so a container without a GPU of its own would see every GPU of its node.
# `void` exposes none (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html).
# A container with an nvidia.com/gpu limit gets its devices' ids from the device plugin instead.
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


def hide_gpus(pod_spec: dict[str, Any]) -> None:
    """``NVIDIA_VISIBLE_DEVICES=void`` on every container without a GPU limit (sidecars and init
    containers too), unless its env names the variable itself."""
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        if gpu_count(container.get("resources") or {}):
            continue
        env = container.setdefault("env", [])
        if not any(item.get("name") == VISIBLE_DEVICES_ENV for item in env):
            env.insert(0, {"name": VISIBLE_DEVICES_ENV, "value": "void"})  # first: the env the user gives follows


def build_pod(
    experiment: Experiment, agent: str, role: str, owner: dict[str, Any], config: OperatorConfig, name: str | None = None,
    node: int = 0, replica: int = 0,
) -> dict[str, Any]:
    """The Pod of ``role`` (one of ``roles_of(experiment)``) of ``agent`` (of its node ``node`` when
    the learner spans several, of its replica ``replica`` when the rollout has several), named as
    in ``pod_names`` unless ``name`` says otherwise (``replacement_pod_name``). A colocated pod is
    built from the learner's image, resources and podTemplate (``TEMPLATE_ROLE``).

    Restarts are the operator's (``restartPolicy: Never``): a failed worker shows up as a Failed
    pod, which the operator replaces and counts against ``spec.restartLimit``.
    """
    if role not in roles_of(experiment):
        raise ValueError(f"role must be one of {roles_of(experiment)} for this experiment, got {role!r}")
    nodes = node_count(experiment, agent, role)
    if not 0 <= node < nodes:
        raise ValueError(f"node must be 0 to {nodes - 1} for agent {agent!r}'s {role} pods, got {node}")
    replicas = replica_count(experiment, agent, role)
    if not 0 <= replica < replicas:
        raise ValueError(f"replica must be 0 to {replicas - 1} for agent {agent!r}'s {role} pods (rollout.replicas {replicas}), got {replica}")
    spec = experiment.spec
    agent_spec = spec.agent(agent)
    pod_name_override, name = name, experiment.name
    port = spec.metrics.port
    template = TEMPLATE_ROLE[role]
    image = getattr(spec.images, template) or getattr(config, f"{template}_image")

    container: dict[str, Any] = {
        "name": template,
        "image": image,
        "imagePullPolicy": spec.images.pull_policy,
        "command": ["hacrl", "worker", role, "--spec", SPEC_PATH, "--agent", agent],
        "workingDir": WORK_DIR,
        "env": worker_env(experiment, agent, role, owner["metadata"].get("uid"), node, owner["metadata"]["namespace"], replica),
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "work", "mountPath": WORK_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    if spec.env_from:  # Kubernetes: env (the operator's, spec.env) wins over envFrom
        container["envFrom"] = [source.model_dump(by_alias=True, exclude_none=True) for source in spec.env_from]
    resources = getattr(agent_spec.resources, template)
    if resources:  # requests/limits, e.g. {limits: {nvidia.com/gpu: 1}}
        container["resources"] = copy.deepcopy(resources)
    annotations: dict[str, str] = {}
    if port:
        container["ports"] = [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            **({} if config.run_as_user is None else
               {"runAsUser": config.run_as_user, "runAsGroup": config.run_as_user, "fsGroup": config.run_as_user}),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "spec", "configMap": {"name": configmap_name(name), "items": [{"key": SPEC_FILE, "path": SPEC_FILE}]}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "cache", "emptyDir": {}},
            {"name": "work", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    model_cache = model_cache_mount(experiment, agent)
    if model_cache:
        volume, mount = model_cache
        pod_spec["volumes"].append(volume)
        container["volumeMounts"].append(mount)
    if config.worker_image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in config.worker_image_pull_secrets]
    scheduling = spec.scheduling
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(scheduling.tolerations)
    if scheduling.affinity:
        pod_spec["affinity"] = copy.deepcopy(scheduling.affinity)
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    if scheduling.scheduler_name:
        pod_spec["schedulerName"] = scheduling.scheduler_name

    override = dict(getattr(agent_spec.pod_template, template))
    extra = override.pop("metadata", None) or {}
    if override:
        pod_spec = merge_pod_spec(pod_spec, override)
    lock_down(pod_spec, config.run_as_user)  # whatever the override said, sidecars included
    hide_gpus(pod_spec)
    gang_labels, gang_annotations = gang_metadata(experiment, owner["metadata"].get("uid"))
    if scheduling.gang == "volcano":  # every pod of the gang, whatever a podTemplate said
        pod_spec["schedulerName"] = VOLCANO_SCHEDULER
    index_labels: dict[str, str] = {}
    if nodes > 1:  # its DNS name under the agent's headless Service: node 0's is MASTER_ADDR
        pod_spec["hostname"] = f"{role}-{node}"
        pod_spec["subdomain"] = rendezvous_service_name(name, agent)
        index_labels = {LABEL_NODE: str(node)}
    if replicas > 1:
        index_labels = {LABEL_REPLICA: str(replica)}

    # The user's labels and annotations (e.g. a priority class of their scheduler) over the
    # defaults (autoscaler eviction), under the operator's own: the labels the operator, its
    # NetworkPolicy and the PodMonitor select by, and the gang's, cannot be changed.
    metadata: dict[str, Any] = {
        "name": pod_name_override or pod_names(experiment, agent, role)[node if nodes > 1 else replica],
        "namespace": owner["metadata"]["namespace"],
        "labels": {**(extra.get("labels") or {}), **gang_labels, **pod_labels(name, agent, role), **index_labels},
        "ownerReferences": [owner_reference(owner)],
    }
    metadata["annotations"] = {**NO_AUTOSCALER_EVICTION, **(extra.get("annotations") or {}), **gang_annotations, **annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


# Lists of named items are merged item by item (by "name"), as a strategic merge patch does;
# other lists are replaced; a None value removes the key.
_MERGE_BY_NAME = {"containers", "initContainers", "volumes", "volumeMounts", "env", "ports", "imagePullSecrets"}


def merge_pod_spec(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` (a partial pod spec from ``spec.agents[].podTemplate.<role>``) merged into ``base``.

    Dicts merge recursively; lists of named items (containers, volumes, env, volumeMounts, ports)
    merge by ``name`` so an override can add a sidecar, a volume or one env var, or change one
    field of the worker container (named after its role); a volume of the same name is replaced
    (e.g. ``cache`` by a PersistentVolumeClaim); other lists replace; ``null`` deletes.
    """
    return _merge(copy.deepcopy(base), copy.deepcopy(override))


def _merge(base: Any, override: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        for k, v in override.items():
            if v is None:
                base.pop(k, None)
            elif k in base:
                base[k] = _merge(base[k], v, k)
            else:
                base[k] = v
        return base
    if key in _MERGE_BY_NAME and isinstance(base, list) and isinstance(override, list):
        merged = list(base)
        index = {item.get("name"): i for i, item in enumerate(merged) if isinstance(item, dict)}
        for item in override:
            name = item.get("name") if isinstance(item, dict) else None
            if name is not None and name in index:
                # A volume's source is one-of (Kubernetes' retainKeys): the override replaces it.
                merged[index[name]] = item if key == "volumes" else _merge(merged[index[name]], item)
            else:
                merged.append(item)
        return merged
    return override
