"""The fields only the operator reads: resources and podTemplate, the model cache volume, env and
envFrom (and the Secrets they may name), images, scheduling and cleanup. `hacrl run` validates
them and ignores them."""

from __future__ import annotations

import re
from typing import Literal, overload

from pydantic import ConfigDict, Field, field_validator, model_validator

from hacrl_core.pod_policy import override_problems
from hacrl_core.spec.base import DNS_SUBDOMAIN, KubeObject, SpecModel

GPU_RESOURCE = "nvidia.com/gpu"


def gpu_count(resources: KubeObject) -> int | None:
    """GPUs a container with these ResourceRequirements gets (limits, else requests); None when unset or not a count."""
    for section in ("limits", "requests"):
        amounts = resources.get(section)
        value = amounts.get(GPU_RESOURCE) if isinstance(amounts, dict) else None
        if value is not None:
            return int(value) if str(value).isdigit() else None
    return None


class RoleResources(SpecModel):
    rollout: KubeObject = Field(
        default_factory=dict,
        description="Kubernetes ResourceRequirements of the rollout pod, e.g. `{limits: {nvidia.com/gpu: 1}}`.",
    )
    learner: KubeObject = Field(default_factory=dict, description="Kubernetes ResourceRequirements of the learner pod.")


class RolePodTemplates(SpecModel):
    rollout: KubeObject = Field(
        default_factory=dict,
        description="Pod spec fields merged into the rollout pod (strategic override of the generated pod spec). An "
        "allow-list (docs/security.md): scheduling fields, resources, env from values or ConfigMaps, "
        "emptyDir/PVC/configMap/ephemeral volumes and their mounts, sidecars and init containers; no Secrets, "
        "service accounts, host settings or weaker securityContext.",
    )
    learner: KubeObject = Field(
        default_factory=dict, description="Pod spec fields merged into the learner pod; same allow-list as `rollout`."
    )

    @field_validator("rollout", "learner")
    @classmethod
    def _within_allow_list(cls, value: KubeObject) -> KubeObject:
        problems = override_problems(value)
        if problems:
            (path, problem), *others = problems
            also = f" (also: {'; '.join(f'{p}: {q}' for p, q in others)})" if others else ""
            raise ValueError(f"{path}: {problem}; see docs/security.md for what podTemplate may set{also}")
        return value


class ModelCacheSpec(SpecModel):
    claim_name: str = Field(
        max_length=253,
        description=(
            "PersistentVolumeClaim (in the experiment's namespace) mounted at the workers' model cache: hub downloads, "
            "tiny builds "
            "and s3:// models ($HACRL_CACHE/models) and HF_HOME (datasets, hub files) live there, so a restarted or "
            "later pod "
            "reuses them. The pods of every agent that uses it mount it at once: ReadWriteMany (NFS, CephFS, EFS, "
            "Filestore) "
            "for pods on several nodes; a ReadWriteOnce claim holds them all to one node (the others stay Pending). "
            "It must be writable by the workers' user and group (fsGroup; the chart value workerRunAsUser)."
        ),
        json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern},
    )

    @field_validator("claim_name")
    @classmethod
    def _claim(cls, value: str) -> str:
        if len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a PersistentVolumeClaim name: lower-case letters, digits, '-' and '.', at most 253 characters"
            )
        return value


@overload
def secret_name(value: str) -> str: ...
@overload
def secret_name(value: None) -> None: ...
def secret_name(value: str | None) -> str | None:
    if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value)):
        raise ValueError(
            f"{value!r} is not a Secret name: lower-case letters, digits, '-' and '.', at most 253 characters (e.g. hacrl-store)"
        )
    return value


# -- experiment-wide env and envFrom ---------------------------------------------------------------
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
KEY_NAME = re.compile(r"^[-._a-zA-Z0-9]+$")
# What the operator sets on every worker container (operator/hacrl_operator/builders/container.py
# worker_env; tests/operator/test_operator_builders.py keeps the two equal). `spec.env` may not set them:
# refused with the field named, rather than one side silently winning.
OPERATOR_ENV_PREFIX = "HACRL_"
OPERATOR_ENV = (
    "POD_NAME",
    "HOME",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "TORCH_EXTENSIONS_DIR",
    "TRITON_CACHE_DIR",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "HF_TOKEN",
    "MASTER_ADDR",
    "MASTER_PORT",  # the rendezvous of a learner over several nodes
)
#: A rollout with several replicas (rollout.replicas): the replica index the operator gives each
#: replica's pod and `hacrl run` each replica's process; the rollout worker samples that slice.
ROLLOUT_REPLICA_ENV = "HACRL_ROLLOUT_REPLICA"
#: A learner over several nodes: the node rank the operator gives each node's pod (beside
#: MASTER_ADDR/MASTER_PORT) and its launcher reads (hacrl_core.learner.launcher.node_placement),
#: and the rendezvous port (torchrun's default). Here so that the operator need not import torch.
NODE_RANK_ENV = "HACRL_NODE_RANK"
RENDEZVOUS_PORT = 29500
_OPERATOR_ENV_CEL = "[" + ", ".join(f'"{n}"' for n in OPERATOR_ENV) + "]"


def operator_env_problem(name: str) -> str | None:
    """Why ``name`` may not be set through ``spec.env`` (the operator sets it), else None."""
    if name.startswith(OPERATOR_ENV_PREFIX) or name in OPERATOR_ENV:
        fix = (
            "use spec.modelTokenSecret"
            if name == "HF_TOKEN"
            else (
                "use spec.store"
                if name.startswith("AWS_")
                else "the operator sets it on the pods of a learner over several nodes (learner.nodes)"
                if name.startswith("MASTER_")
                else "the operator sets it on every worker pod"
            )
        )
        return f"{name!r} is set by the operator ({OPERATOR_ENV_PREFIX}* and {', '.join(OPERATOR_ENV)}): {fix}"
    return None


class KeyReference(SpecModel):
    name: str = Field(
        max_length=253,
        description="Name of the ConfigMap or Secret (in the experiment's namespace).",
        json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern},
    )
    key: str = Field(max_length=253, description="Key in it.", json_schema_extra={"pattern": KEY_NAME.pattern})
    optional: bool = Field(
        False, description="True starts the pod when the object or key is missing (the variable is then unset)."
    )

    @field_validator("name")
    @classmethod
    def _object_name(cls, value: str) -> str:
        return secret_name(value)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not KEY_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a ConfigMap or Secret key: letters, digits, '-', '_' and '.'")
        return value


class ObjectReference(SpecModel):
    name: str = Field(
        max_length=253,
        description="Name of the ConfigMap or Secret (in the experiment's namespace).",
        json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern},
    )
    optional: bool = Field(False, description="True starts the pod when it is missing.")

    @field_validator("name")
    @classmethod
    def _object_name(cls, value: str) -> str:
        return secret_name(value)


class EnvVarSource(SpecModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.configMapKeyRef) != has(self.secretKeyRef)",
                    "message": "valueFrom takes exactly one of configMapKeyRef and secretKeyRef",
                },
            ]
        }
    )
    config_map_key_ref: KeyReference | None = Field(None, description="A key of a ConfigMap.")
    secret_key_ref: KeyReference | None = Field(
        None,
        description="A key of a Secret the cluster admin approved for experiments (chart value experimentSecrets); "
        "otherwise the experiment waits with Ready=False, reason SecretNotAllowed.",
    )

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        if (self.config_map_key_ref is None) == (self.secret_key_ref is None):
            raise ValueError("valueFrom takes exactly one of configMapKeyRef and secretKeyRef")
        return self


class EnvVar(SpecModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "env: give value or valueFrom, not both",
                },
                {
                    "rule": f"!self.name.startsWith('{OPERATOR_ENV_PREFIX}') && !(self.name in {_OPERATOR_ENV_CEL})",
                    "message": f"env: {OPERATOR_ENV_PREFIX}* and {', '.join(OPERATOR_ENV)} are set by the operator (HF_TOKEN: spec.modelTokenSecret; AWS_*: spec.store)",
                },
            ]
        }
    )
    name: str = Field(
        max_length=128,
        description="Variable name. Not one the operator sets (HACRL_*, POD_NAME, HOME, the cache directories, the "
        "store's AWS_* and HF_TOKEN): those are refused.",
        json_schema_extra={"pattern": ENV_NAME.pattern},
    )
    value: str | None = Field(
        None, max_length=32768, description="The value (`$(VAR)` expands an earlier variable, as in Kubernetes)."
    )
    value_from: EnvVarSource | None = Field(None, description="The value from a ConfigMap or an approved Secret.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ENV_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an environment variable name: letters, digits, '_', '-' and '.', not starting with a digit"
            )
        problem = operator_env_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name!r}: give value or valueFrom, not both")
        return self


class EnvFromSource(SpecModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.configMapRef) != has(self.secretRef)",
                    "message": "envFrom: each entry takes exactly one of configMapRef and secretRef",
                },
            ]
        }
    )
    config_map_ref: ObjectReference | None = Field(None, description="Every key of a ConfigMap as a variable.")
    secret_ref: ObjectReference | None = Field(
        None,
        description="Every key of a Secret the cluster admin approved for experiments (chart value experimentSecrets).",
    )
    prefix: str | None = Field(
        None, max_length=128, description="Prepended to every key.", json_schema_extra={"pattern": ENV_NAME.pattern}
    )

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("each envFrom entry takes exactly one of configMapRef and secretRef")
        if self.prefix is not None and not ENV_NAME.fullmatch(self.prefix):
            raise ValueError(f"prefix: {self.prefix!r} does not start a valid variable name")
        return self


MAX_TTL_SECONDS = 10 * 365 * 86400
CleanupAction = Literal["keep", "delete-pods", "delete-store"]


class CleanupSpec(SpecModel):
    on_success: CleanupAction = Field("delete-pods", description="What to remove when the experiment succeeds.")
    on_failure: CleanupAction = Field("keep", description="What to remove when it fails.")
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        le=MAX_TTL_SECONDS,
        description="Delete the experiment this long after it finished (at most 10 years).",
    )


class ImageSpec(SpecModel):
    rollout: str | None = Field(None, description="Rollout image; the operator's default when empty.")
    learner: str | None = Field(None, description="Learner image; the operator's default when empty.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Image pull policy.")


GangScheduler = Literal["none", "kueue", "volcano"]
MAX_PENDING_TIMEOUT_SECONDS = 7 * 86400


class SchedulingSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.queueName) || (has(self.gang) && self.gang != 'none')",
                    "message": "scheduling.queueName names a Kueue LocalQueue or a Volcano Queue: set scheduling.gang to kueue or volcano, or remove queueName",
                },
                {
                    "rule": "!has(self.gang) || self.gang != 'kueue' || has(self.queueName)",
                    "message": "scheduling.gang kueue needs scheduling.queueName: the LocalQueue of the experiment's namespace that admits the pods",
                },
                {
                    "rule": "!has(self.gang) || self.gang != 'volcano' || !has(self.schedulerName) || self.schedulerName == 'volcano'",
                    "message": "scheduling.gang volcano schedules the pods with schedulerName volcano: remove scheduling.schedulerName",
                },
            ]
        }
    )

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector for every pod.")
    tolerations: list[KubeObject] = Field(default_factory=list, description="Tolerations for every pod.")
    affinity: KubeObject = Field(default_factory=dict, description="Affinity for every pod.")
    priority_class_name: str | None = Field(
        None, description="PriorityClass of the pods (and of the Volcano PodGroup with gang volcano)."
    )
    scheduler_name: str | None = Field(
        None, description="Scheduler of the pods. With gang volcano it is volcano and may be left out."
    )
    gang: GangScheduler = Field(
        "none",
        description=(
            "Put all the experiment's pods (every agent's rollout and learner) into one gang, admitted or scheduled "
            "all together "
            "by the cluster's own scheduler, so that some pods never hold GPUs while the others wait. "
            "`none`: each pod is scheduled on its own. "
            "`kueue`: Kueue plain-pod group (pod integration enabled): labels kueue.x-k8s.io/queue-name (queueName, "
            "required) and "
            "kueue.x-k8s.io/pod-group-name, annotation kueue.x-k8s.io/pod-group-total-count. "
            "`volcano`: a scheduling.volcano.sh/v1beta1 PodGroup with minMember = the pod count (queue: queueName, "
            "else Volcano's default), "
            "pods annotated scheduling.k8s.io/group-name and scheduled by schedulerName volcano. "
            "Change it with the experiment suspended: pods created before and after would be in different gangs."
        ),
    )
    queue_name: str | None = Field(
        None,
        max_length=63,
        description="The Kueue LocalQueue (gang kueue, required) or Volcano Queue (gang volcano, optional) of the "
        "pods.",
        json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern},
    )
    pending_timeout_seconds: int = Field(
        600,
        ge=0,
        le=MAX_PENDING_TIMEOUT_SECONDS,
        description=(
            "A pod not scheduled (Pending, PodScheduled not True: no node fits, a quota or gang not admitted, no such "
            "scheduler) for "
            "this long turns the experiment's Ready condition to False, reason Unschedulable, with the scheduler's "
            "message, and posts "
            "one Warning event; until then Ready says PodsPending. The experiment keeps waiting. 0 reports at once (at "
            "most 7 days)."
        ),
    )

    @field_validator("queue_name")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not DNS_SUBDOMAIN.fullmatch(value)):
            raise ValueError(
                f"{value!r} is not a queue name: use at most 63 lower-case letters, digits, '-' and '.' (a Kueue LocalQueue or Volcano Queue name)"
            )
        return value

    @model_validator(mode="after")
    def _gang(self) -> SchedulingSpec:
        if self.queue_name is not None and self.gang == "none":
            raise ValueError(
                "queueName: scheduling.queueName names a Kueue LocalQueue or a Volcano Queue: set scheduling.gang to "
                "kueue or volcano, or remove queueName"
            )
        if self.gang == "kueue" and self.queue_name is None:
            raise ValueError(
                "queueName: scheduling.gang kueue needs scheduling.queueName: the LocalQueue of the experiment's "
                "namespace that admits the pods"
            )
        if self.gang == "volcano" and self.scheduler_name not in (None, "volcano"):
            raise ValueError(
                f"schedulerName: scheduling.gang volcano schedules the pods with schedulerName volcano, got {self.scheduler_name!r}: remove scheduling.schedulerName"
            )
        return self
