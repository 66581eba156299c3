"""The whole experiment: the `HACRLExperiment` object and its spec, which joins the parts and
checks the rules that span them."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from hacrl_core.algorithm_plugins import SHARED_ROW_ALGORITHMS
from hacrl_core.spec.agents import AgentSpec
from hacrl_core.spec.algorithm import AlgorithmSpec
from hacrl_core.spec.base import DNS_LABEL, SpecModel
from hacrl_core.spec.cluster import (
    CleanupSpec,
    EnvFromSource,
    EnvVar,
    ImageSpec,
    ModelCacheSpec,
    SchedulingSpec,
    secret_name,
)
from hacrl_core.spec.data import DataSpec, EvaluationSpec
from hacrl_core.spec.kueue import pod_set_problem
from hacrl_core.spec.monitoring import MetricsSpec, TrackingSpec
from hacrl_core.spec.store import CheckpointSpec, StoreSpec

API_GROUP = "hacrl.io"
API_VERSION = "v1alpha1"
KIND: Final = "HACRLExperiment"
PLURAL = "hacrlexperiments"
SHORT_NAME = "hx"


class ExperimentSpec(SpecModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.algorithm) && has(self.algorithm.name) && !(self.algorithm.name in "
                    + str(list(SHARED_ROW_ALGORITHMS)).replace("'", '"')
                    + ")) || self.agents.size() >= 2",
                    "message": "hacpo and naive share rollouts between agents and need at least 2 agents; add an agent or use gspo/grpo",
                },
                {
                    "rule": "!has(self.colocate) || !self.colocate || ((!has(self.algorithm) || !has(self.algorithm.maxStaleness) || "
                    'self.algorithm.maxStaleness == 0) && self.agents.all(a, !has(a.rollout) || ((!has(a.rollout.engine) || a.rollout.engine == "hf") '
                    "&& (!has(a.rollout.replicas) || a.rollout.replicas == 1))))",
                    "message": "colocate: true needs algorithm.maxStaleness 0 and every agent's rollout.engine hf and rollout.replicas 1; or set colocate: false",
                },
                {
                    "rule": "self.agents.all(a, !has(a.rollout) || !has(a.rollout.replicas) || a.rollout.replicas <= "
                    "(has(self.algorithm) && has(self.algorithm.promptsPerStep) ? self.algorithm.promptsPerStep : "
                    f"{AlgorithmSpec.model_fields['prompts_per_step'].default}))",
                    "message": "every agent's rollout.replicas must be at most algorithm.promptsPerStep (each replica samples a slice of "
                    "the step's prompts); lower the replicas or raise promptsPerStep",
                },
            ]
        }
    )

    # Bounded (as are the strings the CRD's CEL rules compare) so that the API server's cost
    # estimate of those rules stays far below its limit.
    agents: list[AgentSpec] = Field(
        min_length=1,
        max_length=32,
        description="The agents trained together; at least 2 for hacpo and naive.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="Algorithm and its hyper-parameters.")
    data: DataSpec = Field(description="Training data, eval sets, template and reward.")
    store: StoreSpec = Field(
        default_factory=StoreSpec,
        description="Where trajectories, weights and checkpoints live. Omitted: `hacrl run` uses file://./runs; the "
        "operator fills in its install's default store (chart values defaultStore or minio.enabled) and refuses "
        "the experiment when it has none.",
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    evaluation: EvaluationSpec = Field(
        default_factory=EvaluationSpec, description="Evaluation during and after training."
    )
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus endpoints of the workers.")
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec,
        description="Experiment trackers (MLflow, W&B, TensorBoard) each learner logs its step metrics to "
        "(docs/tracking.md; needs the `tracking` extra).",
    )
    images: ImageSpec = Field(default_factory=ImageSpec, description="Container images (operator only).")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Pod placement (operator only).")
    colocate: bool | None = Field(
        None,
        description=(
            "True: one worker (pod) per agent samples with its live model and trains, instead of a rollout and a "
            "learner "
            "worker: no weights published and loaded every step, rollout and learner share the machine's CPUs or GPUs. "
            "Needs algorithm.maxStaleness 0 and every agent's rollout.engine hf and rollout.replicas 1. Omitted: "
            "`hacrl run` colocates whenever "
            "both hold (it measured faster on one machine), the operator runs separate rollout and learner pods."
        ),
    )
    suspend: bool = Field(
        False, description="True deletes the pods and keeps everything else; false resumes from checkpoints."
    )
    restart_limit: int = Field(
        3, ge=0, le=1000, description="Pod restarts allowed per agent before the experiment fails."
    )
    cleanup: CleanupSpec = Field(default_factory=CleanupSpec, description="Cleanup when finished.")
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Environment variables of every rollout and learner pod (operator only), e.g. HF_HUB_OFFLINE or NCCL "
            "settings. "
            "Variables the operator sets are refused, naming the field; values from Secrets need the admin's approval."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "ConfigMaps and approved Secrets whose every key becomes a variable of every rollout and learner pod "
            "(operator only). "
            "Variables set by the operator or by spec.env take precedence over these (Kubernetes: env wins over "
            "envFrom)."
        ),
    )
    model_cache: ModelCacheSpec | None = Field(
        None,
        description="A PersistentVolumeClaim shared as model cache by the pods of every agent without its own "
        "agents[].modelCache (operator only); without either, each pod downloads into an emptyDir.",
    )
    model_token_secret: str | None = Field(
        None,
        description="Secret with the key HF_TOKEN, given to every rollout and learner pod as HF_TOKEN (gated Hugging "
        "Face models; operator; referenced, never copied). The cluster admin must have marked it usable by "
        "experiments.",
    )

    @field_validator("model_token_secret")
    @classmethod
    def _token_secret_name(cls, value: str | None) -> str | None:
        return secret_name(value)

    def secret_references(self) -> list[tuple[str, str]]:
        """``(field, Secret name)`` of every Secret the experiment's pods read."""
        named = [
            ("spec.store.credentialsSecret", self.store.credentials_secret),
            ("spec.modelTokenSecret", self.model_token_secret),
        ]
        named += [
            (f"spec.env[{i}].valueFrom.secretKeyRef", var.value_from.secret_key_ref.name)
            for i, var in enumerate(self.env)
            if var.value_from and var.value_from.secret_key_ref
        ]
        named += [
            (f"spec.envFrom[{i}].secretRef", source.secret_ref.name)
            for i, source in enumerate(self.env_from)
            if source.secret_ref
        ]
        return [(field, name) for field, name in named if name]

    def model_cache_of(self, agent: str) -> ModelCacheSpec | None:
        """The model cache of ``agent``'s pods: its own, else the experiment's, else None."""
        return self.agent(agent).model_cache or self.model_cache

    @model_validator(mode="after")
    def _agents(self) -> ExperimentSpec:
        seen: set[str] = set()
        for index, agent in enumerate(self.agents):
            if agent.name in seen:
                raise ValueError(
                    f"agents[{index}].name: duplicate agent name {agent.name!r}; agent names must be unique"
                )
            seen.add(agent.name)
        names: set[str] = set()
        for index, var in enumerate(self.env):
            if var.name in names:
                raise ValueError(f"env[{index}].name: duplicate variable {var.name!r}; each name once")
            names.add(var.name)
        if self.colocate:
            self._check_colocatable()
        for index, agent in enumerate(self.agents):  # each replica samples a slice of every step's prompts
            if agent.rollout.replicas > self.algorithm.prompts_per_step:
                raise ValueError(
                    f"agents[{index}].rollout.replicas: {agent.rollout.replicas} replicas for {self.algorithm.prompts_per_step} "
                    "prompts per step (algorithm.promptsPerStep) would leave a replica without a prompt; use at most "
                    f"{self.algorithm.prompts_per_step} replicas or more prompts per step"
                )
        if all(agent.suspend for agent in self.agents):
            raise ValueError(
                "agents: every agent has suspend: true; keep at least one agent active, or set spec.suspend to pause "
                "the "
                "whole experiment"
            )
        if self.algorithm.name in SHARED_ROW_ALGORITHMS and len(self.agents) < 2:
            raise ValueError(
                f"algorithm {self.algorithm.name!r} shares rollouts between agents and needs at least 2 agents, "
                f"got {len(self.agents)}; add an agent or use gspo/grpo"
            )
        return self

    @model_validator(mode="after")
    def _kueue_pod_sets(self) -> ExperimentSpec:
        problem = pod_set_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    def colocation_blockers(self) -> list[str]:
        """Why this experiment cannot run colocated (empty: it can), each naming its field."""
        blockers = []
        if self.algorithm.max_staleness:
            blockers.append(
                f"algorithm.maxStaleness: {self.algorithm.max_staleness} (one process samples with the weights it "
                "trains, so every step is on-policy; set it to 0)"
            )
        blockers += [
            f"agents[{i}].rollout.engine: {a.rollout.engine} (a colocated worker samples with transformers; set it to hf)"
            for i, a in enumerate(self.agents)
            if a.rollout.engine != "hf"
        ]
        blockers += [
            f"agents[{i}].rollout.replicas: {a.rollout.replicas} (a colocated worker is one sampler per agent; set it to 1)"
            for i, a in enumerate(self.agents)
            if a.rollout.replicas != 1
        ]
        return blockers

    def _check_colocatable(self) -> None:
        blockers = self.colocation_blockers()
        if blockers:
            raise ValueError("colocate: cannot be true with " + "; ".join(blockers) + "; or set colocate: false")

    def warnings(self) -> list[str]:
        """Settings that are valid but probably not what the user wants, each naming its field."""
        return [
            f"agents[{i}].learner: backend torch with dtype bfloat16 keeps no fp32 master weights, so AdamW steps smaller "
            f"than about |w|/256 round away (at lr {a.learner.lr:g} most do); use backend: deepspeed (fp32 master "
            "weights) or dtype: float32"
            # peft keeps a LoRA adapter's own parameters in float32 over a bfloat16 base
            for i, a in enumerate(self.agents)
            if a.learner.backend == "torch" and a.learner.dtype == "bfloat16" and a.learner.lora is None
        ]

    def runs_colocated(self, *, by_default: bool) -> bool:
        """Whether the agents run as one colocated worker each: ``colocate`` when set, else
        ``by_default`` where the experiment allows it (`hacrl run` passes True, the operator False)."""
        if self.colocate is not None:
            return self.colocate
        return by_default and not self.colocation_blockers()

    def agent(self, name: str) -> AgentSpec:
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise KeyError(f"no agent {name!r} in this experiment; agents: {', '.join(a.name for a in self.agents)}")

    def agent_index(self, name: str) -> int:
        return [a.name for a in self.agents].index(self.agent(name).name)

    def team(self) -> list[str]:
        """The agents that take part in the steps to come: every agent but the suspended ones
        (``agents[].suspend``), in spec order. Each step's members are fixed from it
        (``store.membership``)."""
        return [a.name for a in self.agents if not a.suspend]


class Metadata(SpecModel):
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)
    name: str = Field(description="Experiment name: a DNS label; the store prefix and pod name prefix.")
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _dns(cls, value: str) -> str:
        if len(value) > 40 or not DNS_LABEL.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid experiment name: at most 40 lower-case letters, digits and '-'")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        # A Kubernetes namespace is a DNS label; `hacrl run` also makes it a folder of the store.
        if value is not None and (len(value) > 63 or not DNS_LABEL.fullmatch(value)):
            raise ValueError(
                f"{value!r} is not a namespace: at most 63 lower-case letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return value


class Experiment(SpecModel):
    api_version: Literal["hacrl.io/v1alpha1"] = Field("hacrl.io/v1alpha1", alias="apiVersion")
    kind: Literal["HACRLExperiment"] = KIND
    metadata: Metadata
    spec: ExperimentSpec
    # The operator writes status; a manifest read back from the cluster may carry it.
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
