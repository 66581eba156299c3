"""The experiment spec: one typed document for `hacrl run` and for the `HACRLExperiment` CRD.

Every field is documented once, here; the CRD's openAPIV3Schema, `hacrl validate` and the docs
are generated from these models. Unknown fields are rejected (``extra="forbid"``): a setting that
is accepted must be used. YAML keys are camelCase as in Kubernetes; Python attributes snake_case.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from hacrl_core.pod_policy import override_problems
from hacrl_core.rewards import reward_names
from hacrl_core.store_uri import parse_store_uri

API_GROUP = "hacrl.io"
API_VERSION = "v1alpha1"
KIND = "HACRLExperiment"
PLURAL = "hacrlexperiments"
SHORT_NAME = "hx"

MAX_TTL_SECONDS = 10 * 365 * 86400
# Name patterns are written as the CRD's (ECMA/RE2) `pattern` strings, where `$` ends the text;
# in Python `$` also matches before a final newline, so every check here uses ``fullmatch``
# (tests/unit/test_spec_patterns.py holds the two readings equal on hostile strings).
# An RFC 1123 subdomain: what Kubernetes accepts as a Secret name.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENDPOINT = re.compile(r"^https?://[^\s/?#@]+(:\d{1,5})?/?$")
_NESTED_FIELD = re.compile(r"^([A-Za-z][\w\[\]\.]*): (.*)$", re.S)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The algorithms registry imports torch, which the operator (it validates specs) must not load:
# these two lists stay here, and tests/unit/test_registry.py pins them to the registry.
ALGORITHM_NAMES = ("hacpo", "gspo", "grpo", "naive")
REWARD_NAMES = tuple(reward_names())  # the rewards registry (standard library only, like this module)
SHARED_ROW_ALGORITHMS = ("hacpo", "naive")


class SpecModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, validate_default=True,
        # YAML gives real types; strict keeps `steps: true` or `lr: "1e-4"` from being coerced
        # (the one tuple field opts out: YAML and JSON only have lists).
        strict=True,
    )


# Free-form Kubernetes objects (resources, affinity, pod overrides) are passed through as dicts:
# the API server validates them, and copying their schemas here would drift.
KubeObject = dict[str, Any]


class RolloutSettings(SpecModel):
    engine: Literal["hf", "vllm"] = Field("hf", description="Sampling engine: `hf` (transformers generate, CPU or GPU) or `vllm` (GPU).")
    max_new_tokens: int = Field(512, ge=1, le=65536, description="Longest response sampled, in the agent's own tokens.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature (the paper uses 1.0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (the paper uses 1.0).")
    batch_size: int = Field(64, ge=1, description="Prompts per generate call (hf engine).")
    tensor_parallel_size: int | None = Field(None, ge=1, description="vLLM tensor parallelism (vllm engine only; default 1).")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Fraction of GPU memory vLLM may take (vllm engine only; default 0.85).")
    replicas: int = Field(1, ge=1, le=64, description=(
        "Rollout workers of this agent (pods on Kubernetes, processes under `hacrl run`), each with the agent's rollout "
        "resources: replica r samples its contiguous slice of every step's prompts and writes its own part of the step's "
        "rollouts, and the learners read all parts in replica order. Separate rollout and learner workers only (a colocated "
        "worker samples with the model it trains). Fixed once the experiment started (the parts already written are "
        "sliced by it). Default 1."))

    @model_validator(mode="after")
    def _engine_specific(self) -> RolloutSettings:
        if self.engine != "vllm":
            for name, value in (("tensorParallelSize", self.tensor_parallel_size), ("gpuMemoryUtilization", self.gpu_memory_utilization)):
                if value is not None:
                    raise ValueError(f"{name}: applies to engine 'vllm' only; remove it or set engine: vllm")
        return self


class LearnerSettings(SpecModel):
    backend: Literal["torch", "deepspeed"] = Field("torch", description="Training backend: plain `torch` or `deepspeed`.")
    lr: float = Field(1e-6, gt=0, le=1, description="AdamW learning rate (paper: 1e-6).")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay (paper: 0.01).")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip (paper: 1.0).")
    micro_batch_size: int | None = Field(None, ge=1, description=(
        "Most rows per micro-batch (one forward/backward pass; gradients accumulate up to the mini-batch). Unset: no row "
        "cap, micro-batches are sized by microBatchTokens alone."))
    micro_batch_tokens: int | None = Field(None, ge=1, description=(
        "Padded tokens (rows x the longest row) per micro-batch: rows are packed in order up to it. Unset: derived from "
        "the device (CPU: a quarter of the machine's memory; GPU: half the free memory less the gradients and optimizer "
        "state), see docs/runtime.md."))
    zero_stage: Literal[0, 1, 2, 3] | None = Field(None, description="DeepSpeed ZeRO stage (deepspeed backend only; default 0).")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype for training.")
    full_publish_every: int = Field(10, ge=1, le=1000, description=(
        "Weights versions per full publish. Between two full publishes the learner publishes only the elements that "
        "changed since its previous publish (a delta, bit-identical once applied, checked against a sha256 of the whole "
        "state), and sooner than this it publishes in full once the deltas since the last full one add up to its size. "
        "A rollout replica that holds the previous version reads one delta per step; a new or restarted one reads the "
        "last full publish and at most fullPublishEvery - 1 deltas. Deltas pay off for bf16 publishes (dtype bfloat16, "
        "or deepspeed): at lr 1e-6 a few percent of bf16 elements change per step, while an fp32 copy changes almost "
        "everywhere and is published in full. 1: every publish in full. Default 10: a new replica reads at most a full "
        "publish and 9 deltas, and the full publishes add a tenth of a model per step to the writes "
        "(docs/benchmarks.md, weights)."))
    processes_per_node: int = Field(1, ge=1, le=64, description=(
        "Data-parallel learner ranks per node (one per GPU; torchrun's --nproc-per-node). Each rank trains on its slice of "
        "every mini-batch and the gradients are summed, so the update is the one-rank update; the optimizer state is "
        "sharded over the ranks (torch: ZeroRedundancyOptimizer; deepspeed: ZeRO stage zeroStage). Rank 0 alone writes "
        "to the store. 1 (default): one learner process."))
    nodes: int = Field(1, ge=1, le=1024, description=(
        "Nodes the learner spans (torchrun's --nnodes): the learner has nodes x processesPerNode ranks. `hacrl run` runs "
        "one node and refuses more; the operator runs one learner pod per node (colocated: one colocated pod per node) "
        "behind a headless Service, node 0's pod the rendezvous, and restarts them together. Default 1."))

    @property
    def world_size(self) -> int:
        """Learner ranks in all: ``nodes`` x ``processes_per_node``."""
        return self.nodes * self.processes_per_node

    @model_validator(mode="after")
    def _backend_specific(self) -> LearnerSettings:
        if self.backend != "deepspeed" and self.zero_stage is not None:
            raise ValueError("zeroStage: applies to backend 'deepspeed' only; remove it or set backend: deepspeed")
        return self


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
    rollout: KubeObject = Field(default_factory=dict, description="Kubernetes ResourceRequirements of the rollout pod, e.g. `{limits: {nvidia.com/gpu: 1}}`.")
    learner: KubeObject = Field(default_factory=dict, description="Kubernetes ResourceRequirements of the learner pod.")


class RolePodTemplates(SpecModel):
    rollout: KubeObject = Field(default_factory=dict, description="Pod spec fields merged into the rollout pod (strategic override of the generated pod spec). An allow-list (docs/security.md): scheduling fields, resources, env from values or ConfigMaps, emptyDir/PVC/configMap/ephemeral volumes and their mounts, sidecars and init containers; no Secrets, service accounts, host settings or weaker securityContext.")
    learner: KubeObject = Field(default_factory=dict, description="Pod spec fields merged into the learner pod; same allow-list as `rollout`.")

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
    claim_name: str = Field(max_length=253, description=(
        "PersistentVolumeClaim (in the experiment's namespace) mounted at the workers' model cache: hub downloads, tiny builds "
        "and s3:// models ($HACRL_CACHE/models) and HF_HOME (datasets, hub files) live there, so a restarted or later pod "
        "reuses them. The pods of every agent that uses it mount it at once: ReadWriteMany (NFS, CephFS, EFS, Filestore) "
        "for pods on several nodes; a ReadWriteOnce claim holds them all to one node (the others stay Pending). "
        "It must be writable by the workers' user and group (fsGroup; the chart value workerRunAsUser)."),
        json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern})

    @field_validator("claim_name")
    @classmethod
    def _claim(cls, value: str) -> str:
        if len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(f"{value!r} is not a PersistentVolumeClaim name: lower-case letters, digits, '-' and '.', at most 253 characters")
        return value


class AgentSpec(SpecModel):
    name: str = Field(description="Agent name: a DNS label (lower-case letters, digits, '-'), unique in the experiment; used in pod names and store keys.",
                      json_schema_extra={"pattern": DNS_LABEL.pattern, "maxLength": 40})
    model: str = Field(max_length=1024, description="Model: a local path, a hub id (`org/name`), an `s3://bucket/prefix`, or `tiny://<preset>?seed=N` (offline tiny model).")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="Rollout worker settings.")
    learner: LearnerSettings = Field(default_factory=LearnerSettings, description="Learner worker settings.")
    resources: RoleResources = Field(default_factory=RoleResources, description="Per-role Kubernetes resources (operator only).")
    pod_template: RolePodTemplates = Field(default_factory=RolePodTemplates, description="Per-role pod spec overrides (operator only).")
    model_cache: ModelCacheSpec | None = Field(None, description="This agent's model cache (operator only); overrides spec.modelCache for its rollout and learner pods.")

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if len(value) > 40 or not DNS_LABEL.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid agent name: use at most 40 lower-case letters, digits and '-', "
                "starting and ending with a letter or digit (e.g. 'qwen-small')"
            )
        return value

    @field_validator("model")
    @classmethod
    def _model_uri(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model must not be empty: give a local path, hub id, s3:// prefix or tiny://preset")
        return value

    @model_validator(mode="after")
    def _gpus_fit(self) -> AgentSpec:
        # vLLM starts one worker per tensor-parallel rank, each on its own GPU: with fewer GPUs
        # in the pod it fails at start-up on the cluster, long after admission could have said so.
        if self.rollout.engine == "vllm":
            gpus = gpu_count(self.resources.rollout)
            wanted = self.rollout.tensor_parallel_size or 1
            if gpus is not None and gpus < wanted:
                raise ValueError(
                    f"rollout.tensorParallelSize: {wanted} needs {wanted} GPUs per rollout replica, but resources.rollout gives "
                    f"{gpus} ({GPU_RESOURCE}); request {wanted} GPUs or lower tensorParallelSize")
        # A learner pod with GPUs runs one rank per GPU: more ranks than GPUs would put two on a
        # device (NCCL refuses it). No GPU count, or 0, is a CPU learner, whose ranks share cores.
        gpus = gpu_count(self.resources.learner)
        ranks = self.learner.processes_per_node
        if gpus and gpus < ranks:
            raise ValueError(
                f"learner.processesPerNode: {ranks} ranks need {ranks} GPUs per learner pod (one each), but resources.learner "
                f"gives {gpus} ({GPU_RESOURCE}); request {ranks} GPUs or lower processesPerNode")
        return self


class Ablations(SpecModel):
    capability_advantage: bool = Field(True, description="Mechanism 1: capability-weighted baseline in the advantage; off = plain mixed-group mean.")
    discrepancy_coefficient: bool = Field(True, description="Mechanism 2: weight cross rows by omega(src, learner) = P_src / P_learner; off = 1.")
    exponential_importance: bool = Field(True, description="Mechanism 3: s~ = c * stopgrad(c)^alpha; off = alpha 0.")
    stepwise_clipping: bool = Field(True, description="Mechanism 4: the cross-ratio floor rises by deltaStep per update; off = fixed floor 1 - delta.")


DEFAULT_MINI_BATCH_PROMPTS = 64  # the paper's; smaller steps default to one update of the whole step


class AlgorithmSpec(SpecModel):
    # The cross-field rules of the validators below, as CEL the API server checks at admission.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.promptsPerStep) || !has(self.miniBatchPrompts) || "
                 "(self.miniBatchPrompts <= self.promptsPerStep && self.promptsPerStep % self.miniBatchPrompts == 0)",
         "message": "miniBatchPrompts must divide promptsPerStep (e.g. promptsPerStep 128 with miniBatchPrompts 64)"},
        # miniBatchPrompts has no schema default (it is min(64, promptsPerStep), which OpenAPI
        # cannot say), so without it the rule above does not run: this one checks the default.
        {"rule": "!has(self.promptsPerStep) || has(self.miniBatchPrompts) || self.promptsPerStep <= 64 || self.promptsPerStep % 64 == 0",
         "message": "without miniBatchPrompts an update takes 64 prompts, which must divide promptsPerStep; "
                    "set miniBatchPrompts to a divisor of promptsPerStep (e.g. promptsPerStep 100 with miniBatchPrompts 50)"},
        {"rule": "!has(self.ratioBounds) || (self.ratioBounds[0] > 0.0 && self.ratioBounds[0] <= 1.0 && self.ratioBounds[1] >= 1.0)",
         "message": "ratioBounds must be [low, high] with 0 < low <= 1 <= high"},
    ]})
    name: Literal[ALGORITHM_NAMES] = Field("hacpo", description="`hacpo`; `gspo` and `grpo` (isolated agents); `naive` (shared rows, no mechanisms). GSPOx2 is `gspo` with groupSize doubled.")
    group_size: int = Field(8, ge=2, le=1024, description="G: responses sampled per prompt per agent (paper: 8).")
    prompts_per_step: int = Field(128, ge=1, le=1_000_000, description="B: prompts per training step, shared by all agents (paper: 128).")
    # The default depends on promptsPerStep (a fixed 64 would refuse every smaller step); the
    # factory sees the fields validated before it. No schema default, hence the CEL rule above.
    mini_batch_prompts: int = Field(
        default_factory=lambda validated: min(DEFAULT_MINI_BATCH_PROMPTS, validated.get("prompts_per_step", DEFAULT_MINI_BATCH_PROMPTS)),
        ge=1, description="Prompts per optimizer update; must divide promptsPerStep. Default min(64, promptsPerStep) (paper: 64).")
    epochs: int = Field(1, ge=1, le=100, description="Passes over a step's rows (paper: 1).")
    steps: int = Field(100, ge=1, le=10_000_000, description="Training steps to run.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of data order, sampling and initialisation (0 to 2^31-1).")
    alpha: float = Field(1.0, ge=0, le=10, description="Exponent of the exponential importance weight (paper: 1.0).")
    delta: float = Field(0.2, ge=0, lt=1, description="Initial cross-ratio floor is 1 - delta (paper: 0.2).")
    delta_step: float = Field(0.025, ge=0, le=1, description="Floor increase per optimizer update within a step (paper: 0.025).")
    capability_window: int = Field(5, ge=1, le=1000, description="K: steps in the capability moving average (paper: 5).")
    capability_floor: float = Field(1e-8, gt=0, le=1, description="Lower bound of a capability estimate.")
    ratio_bounds: tuple[float, float] = Field((0.1, 10.0), strict=False, description="Clamp [low, high] of capability ratios omega (paper: [0.1, 10]).")
    warmup_steps: int = Field(0, ge=0, description="Steps during which every capability ratio is 1.")
    kl_coef: float = Field(0.0, ge=0, le=10, description="k3 KL penalty to the frozen reference on own rows (paper: 0.001); 0 disables it and skips loading the reference model.")
    own_clip_low: float = Field(3e-4, ge=0, lt=1, description="GSPO clip below 1 of own rows' sequence ratio (paper: 3e-4).")
    own_clip_high: float = Field(4e-4, ge=0, description="GSPO clip above 1 of own rows' sequence ratio (paper: 4e-4).")
    grpo_clip_low: float = Field(0.2, ge=0, lt=1, description="GRPO token-ratio clip below 1 (grpo only).")
    grpo_clip_high: float = Field(0.28, ge=0, description="GRPO token-ratio clip above 1, clip-higher (grpo only).")
    ablations: Ablations = Field(default_factory=Ablations, description="Switch single HACPO mechanisms off (hacpo only).")
    max_staleness: int = Field(0, ge=0, le=4, description=(
        "Weights versions a rollout may lag its step: step t is sampled with weights version max(0, t - maxStaleness). "
        "0: strictly on-policy (the paper's), rollout and learner take turns; 1: sampling of step t+1 overlaps the update of "
        "step t (one-step off-policy, as verl's recipe; pi_old stays the learner's own scoring pass)."))

    @field_validator("ratio_bounds")
    @classmethod
    def _bounds(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not 0 < low <= 1 <= high:
            raise ValueError(f"must be [low, high] with 0 < low <= 1 <= high, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _batches(self) -> AlgorithmSpec:
        if self.mini_batch_prompts > self.prompts_per_step or self.prompts_per_step % self.mini_batch_prompts:
            given = "" if "mini_batch_prompts" in self.model_fields_set else ", the default"
            raise ValueError(
                f"miniBatchPrompts ({self.mini_batch_prompts}{given}) must divide promptsPerStep ({self.prompts_per_step}); "
                "e.g. promptsPerStep 128 with miniBatchPrompts 64"
            )
        if self.name != "hacpo" and self.ablations != Ablations():
            raise ValueError(f"ablations apply to hacpo only; remove them for algorithm {self.name!r}")
        return self

    @property
    def updates_per_step(self) -> int:
        return self.epochs * (self.prompts_per_step // self.mini_batch_prompts)

    # The loss settings the algorithm registry reads, with the ablation switches applied once here.
    @property
    def effective_alpha(self) -> float:
        return self.alpha if self.ablations.exponential_importance else 0.0

    @property
    def effective_delta_step(self) -> float:
        return self.delta_step if self.ablations.stepwise_clipping else 0.0


class DataSource(SpecModel):
    source: str = Field(max_length=4096, description="`builtin://arithmetic?difficulty=1-3&seed=0`, a .jsonl/.parquet path or URI.")
    prompt_key: str = Field("prompt", max_length=256, description="Key of the prompt in each row (dotted for nested keys).")
    answer_key: str = Field("answer", max_length=256, description="Key of the gold answer (dotted, e.g. `reward_model.ground_truth`).")


class EvalSet(DataSource):
    name: str = Field(max_length=63, description="Name of the eval set in metrics and reports.")
    max_prompts: int = Field(256, ge=1, description="Prompts evaluated at most.")


# A built-in reward's name, or the URL of a reward server (no spaces or control characters).
REWARD_PATTERN = "^(" + "|".join(REWARD_NAMES) + r"|https?://[^\s]+)$"


class RewardServerSpec(SpecModel):
    timeout_seconds: float = Field(30.0, gt=0, le=3600, description="Seconds one request may take before it is retried.")
    retries: int = Field(5, ge=0, le=20, description="Retries of a batch that timed out, could not connect or got HTTP 429/5xx (exponential backoff from 0.5 s); then the worker stops resumably.")
    concurrency: int = Field(4, ge=1, le=256, description="Batches in flight at once.")
    batch_size: int = Field(256, ge=1, le=65536, description="Responses per request.")


class DataSpec(SpecModel):
    train: DataSource = Field(description="Training prompts.")
    eval: list[EvalSet] = Field(default_factory=list, max_length=32, description="Held-out sets evaluated every `evaluation.everySteps`.")
    template: str = Field("{question}", max_length=16384, description="Prompt template; `{question}` is replaced by the row's prompt. Each agent then applies its own chat template.")
    reward: str = Field("math", max_length=2048, description="Verifier: `exact`, `numeric` or `math` (Math-Verify), or the http(s):// URL of a reward server (docs/rewards.md; its knobs: rewardServer).",
                        json_schema_extra={"pattern": REWARD_PATTERN})
    reward_server: RewardServerSpec = Field(default_factory=lambda: RewardServerSpec(), description="Timeout, retries, concurrency and batch size of the reward server that `reward` names (unused for a built-in reward).")

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, value: str) -> str:
        if not re.fullmatch(REWARD_PATTERN, value):
            raise ValueError(f"{value!r} is neither a reward ({', '.join(REWARD_NAMES)}) nor an http(s):// URL of a reward server")
        return value

    @model_validator(mode="after")
    def _unique_eval_names(self) -> DataSpec:
        names = [e.name for e in self.eval]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"eval[{index}].name: {name!r} names an earlier eval set too; eval set names must be unique "
                                 "(they key the metrics and the report)")
        return self

    @field_validator("template")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError("template must contain '{question}' where the prompt goes")
        return value


def secret_name(value: str | None) -> str | None:
    if value is not None and (len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value)):
        raise ValueError(f"{value!r} is not a Secret name: lower-case letters, digits, '-' and '.', at most 253 characters (e.g. hacrl-store)")
    return value


# -- model plumbing: experiment-wide env and envFrom, the model cache ----------------------------
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
KEY_NAME = re.compile(r"^[-._a-zA-Z0-9]+$")
# What the operator sets on every worker container (operator/hacrl_operator/builders.py
# worker_env; tests/operator/test_builders.py keeps the two equal). `spec.env` may not set them:
# refused with the field named, rather than one side silently winning.
OPERATOR_ENV_PREFIX = "HACRL_"
OPERATOR_ENV = (
    "POD_NAME", "HOME", "XDG_CACHE_HOME", "HF_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR",
    "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
    "MASTER_ADDR", "MASTER_PORT",  # the rendezvous of a learner over several nodes
)
#: A rollout with several replicas (rollout.replicas): the replica index the operator gives each
#: replica's pod and `hacrl run` each replica's process; the rollout worker samples that slice.
ROLLOUT_REPLICA_ENV = "HACRL_ROLLOUT_REPLICA"
#: A learner over several nodes: the node rank the operator gives each node's pod (beside
#: MASTER_ADDR/MASTER_PORT) and its launcher reads (hacrl_core.learner.distributed.node_placement),
#: and the rendezvous port (torchrun's default). Here so that the operator need not import torch.
NODE_RANK_ENV = "HACRL_NODE_RANK"
RENDEZVOUS_PORT = 29500
_OPERATOR_ENV_CEL = "[" + ", ".join(f'"{n}"' for n in OPERATOR_ENV) + "]"


def operator_env_problem(name: str) -> str | None:
    """Why ``name`` may not be set through ``spec.env`` (the operator sets it), else None."""
    if name.startswith(OPERATOR_ENV_PREFIX) or name in OPERATOR_ENV:
        fix = "use spec.modelTokenSecret" if name == "HF_TOKEN" else (
            "use spec.store" if name.startswith("AWS_") else
            "the operator sets it on the pods of a learner over several nodes (learner.nodes)" if name.startswith("MASTER_") else
            "the operator sets it on every worker pod")
        return f"{name!r} is set by the operator ({OPERATOR_ENV_PREFIX}* and {', '.join(OPERATOR_ENV)}): {fix}"
    return None


class KeyReference(SpecModel):
    name: str = Field(max_length=253, description="Name of the ConfigMap or Secret (in the experiment's namespace).",
                      json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern})
    key: str = Field(max_length=253, description="Key in it.", json_schema_extra={"pattern": KEY_NAME.pattern})
    optional: bool = Field(False, description="True starts the pod when the object or key is missing (the variable is then unset).")

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
    name: str = Field(max_length=253, description="Name of the ConfigMap or Secret (in the experiment's namespace).",
                      json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern})
    optional: bool = Field(False, description="True starts the pod when it is missing.")

    @field_validator("name")
    @classmethod
    def _object_name(cls, value: str) -> str:
        return secret_name(value)


class EnvVarSource(SpecModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.configMapKeyRef) != has(self.secretKeyRef)", "message": "valueFrom takes exactly one of configMapKeyRef and secretKeyRef"},
    ]})
    config_map_key_ref: KeyReference | None = Field(None, description="A key of a ConfigMap.")
    secret_key_ref: KeyReference | None = Field(None, description="A key of a Secret the cluster admin approved for experiments (chart value experimentSecrets); otherwise the experiment waits with Ready=False, reason SecretNotAllowed.")

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        if (self.config_map_key_ref is None) == (self.secret_key_ref is None):
            raise ValueError("valueFrom takes exactly one of configMapKeyRef and secretKeyRef")
        return self


class EnvVar(SpecModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!(has(self.value) && has(self.valueFrom))", "message": "env: give value or valueFrom, not both"},
        {"rule": f"!self.name.startsWith('{OPERATOR_ENV_PREFIX}') && !(self.name in {_OPERATOR_ENV_CEL})",
         "message": f"env: {OPERATOR_ENV_PREFIX}* and {', '.join(OPERATOR_ENV)} are set by the operator (HF_TOKEN: spec.modelTokenSecret; AWS_*: spec.store)"},
    ]})
    name: str = Field(max_length=128, description="Variable name. Not one the operator sets (HACRL_*, POD_NAME, HOME, the cache directories, the store's AWS_* and HF_TOKEN): those are refused.",
                      json_schema_extra={"pattern": ENV_NAME.pattern})
    value: str | None = Field(None, max_length=32768, description="The value (`$(VAR)` expands an earlier variable, as in Kubernetes).")
    value_from: EnvVarSource | None = Field(None, description="The value from a ConfigMap or an approved Secret.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ENV_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name: letters, digits, '_', '-' and '.', not starting with a digit")
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
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.configMapRef) != has(self.secretRef)", "message": "envFrom: each entry takes exactly one of configMapRef and secretRef"},
    ]})
    config_map_ref: ObjectReference | None = Field(None, description="Every key of a ConfigMap as a variable.")
    secret_ref: ObjectReference | None = Field(None, description="Every key of a Secret the cluster admin approved for experiments (chart value experimentSecrets).")
    prefix: str | None = Field(None, max_length=128, description="Prepended to every key.", json_schema_extra={"pattern": ENV_NAME.pattern})

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("each envFrom entry takes exactly one of configMapRef and secretRef")
        if self.prefix is not None and not ENV_NAME.fullmatch(self.prefix):
            raise ValueError(f"prefix: {self.prefix!r} does not start a valid variable name")
        return self


class StoreSpec(SpecModel):
    uri: str = Field("file://./runs", description="Trajectory store: `file://path` (default) or `s3://bucket/prefix`.")
    endpoint: str | None = Field(None, description="S3 endpoint URL (MinIO, SeaweedFS); empty for AWS.")
    region: str | None = Field(None, description="S3 region.")
    credentials_secret: str | None = Field(None, description="Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (operator; referenced, never copied).")
    adopt_existing: bool = Field(False, description="Operator: let this experiment take over the store prefix of a deleted experiment of the same namespace and name and resume from its checkpoints; false refuses such a prefix (condition StoreOwnedByAnother).")

    @field_validator("uri")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if "://" in value and not value.startswith(("file://", "s3://")):
            raise ValueError(f"unsupported store {value!r}: use file://path or s3://bucket/prefix")
        if value.startswith("s3://") and not value[len("s3://"):].strip("/"):
            raise ValueError("s3 store needs a bucket: s3://bucket/prefix")
        parse_store_uri(value)  # what `hacrl run` and the workers open: refused here, not there
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value and not _ENDPOINT.fullmatch(value):
            raise ValueError(f"{value!r} is not an S3 endpoint URL: use http(s)://host[:port], e.g. http://minio.minio:9000 (no path, no credentials)")
        return value or None

    @field_validator("credentials_secret")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        return secret_name(value)


class CheckpointSpec(SpecModel):
    every_steps: int = Field(1, ge=1, description="Checkpoint every N steps (and always at the last step).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept per agent.")


class EvaluationSpec(SpecModel):
    every_steps: int = Field(0, ge=0, description="Evaluate every N steps during training; 0 only at the end.")
    samples: int = Field(1, ge=1, le=1024, description="k samples per prompt: avg@k, pass@k (greedy when 1).")


class MlflowTracking(SpecModel):
    tracking_uri: str = Field(max_length=2048, description="MLflow tracking server (`http(s)://...`, `databricks`) or a local file store (`file:///path`). Credentials (MLFLOW_TRACKING_TOKEN, or _USERNAME and _PASSWORD) through spec.env from an approved Secret.",
                              json_schema_extra={"pattern": r"^(https?://|file:/|databricks)\S*$"})
    experiment_name: str | None = Field(None, max_length=256, description="MLflow experiment the runs go into; default: the HACRL experiment's name.")

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_uri(cls, value: str) -> str:
        if not re.fullmatch(r"(https?://|file:/|databricks)\S*", value):
            raise ValueError(f"{value!r} is not an MLflow tracking URI: http(s)://host[:port], file:///path or databricks")
        return value


# A W&B project name: no path or URL characters, no whitespace.
WANDB_PROJECT = r"[^/\\#?%:\s]+"


class WandbTracking(SpecModel):
    project: str = Field(max_length=128, description="W&B project.", json_schema_extra={"pattern": f"^{WANDB_PROJECT}$"})
    entity: str | None = Field(None, max_length=128, description="W&B entity (team or user); default: the API key's.")
    mode: Literal["online", "offline", "disabled"] = Field("online", description="`offline` writes the runs locally (`wandb sync` uploads them later). Credentials (WANDB_API_KEY) through spec.env from an approved Secret.")
    dir: str | None = Field(None, max_length=4096, description="Folder of W&B's local files; default: the worker's work folder.")

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not re.fullmatch(WANDB_PROJECT, value):
            raise ValueError(f"{value!r} is not a W&B project name: no '/', '\\', '#', '?', '%', ':' or whitespace")
        return value


class TensorBoardTracking(SpecModel):
    log_dir: str = Field(max_length=4096, description="Folder of the event files, one subfolder per agent: a local path, or a PVC mounted in the learner pods (podTemplate).")


class TrackingSpec(SpecModel):
    mlflow: MlflowTracking | None = Field(None, description="Log to MLflow: one run per agent.")
    wandb: WandbTracking | None = Field(None, description="Log to Weights & Biases: one run per agent, grouped by experiment.")
    tensorboard: TensorBoardTracking | None = Field(None, description="Write TensorBoard event files.")
    buffer_steps: int = Field(1000, ge=1, le=100000, description="Steps of metrics kept for a tracker while it is unreachable; past that the oldest are dropped and counted (hacrl_tracker_drops_total).")

    def enabled(self) -> list[str]:
        return [name for name in ("mlflow", "wandb", "tensorboard") if getattr(self, name) is not None]


class MetricsSpec(SpecModel):
    port: int = Field(9400, ge=0, le=65535, description="First Prometheus metrics port; each local worker takes the next free one (0 disables).")
    bind_address: str = Field("127.0.0.1", description="Address the metrics endpoint binds: an IP address (`0.0.0.0` in pods) or `localhost`.")

    @field_validator("bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        if value != "localhost":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an address to bind: give an IP address such as 127.0.0.1, 0.0.0.0 or ::1, or localhost") from None
        return value


CleanupAction = Literal["keep", "delete-pods", "delete-store"]


class CleanupSpec(SpecModel):
    on_success: CleanupAction = Field("delete-pods", description="What to remove when the experiment succeeds.")
    on_failure: CleanupAction = Field("keep", description="What to remove when it fails.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=MAX_TTL_SECONDS, description="Delete the experiment this long after it finished (at most 10 years).")


class ImageSpec(SpecModel):
    rollout: str | None = Field(None, description="Rollout image; the operator's default when empty.")
    learner: str | None = Field(None, description="Learner image; the operator's default when empty.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Image pull policy.")


GangScheduler = Literal["none", "kueue", "volcano"]
MAX_PENDING_TIMEOUT_SECONDS = 7 * 86400


class SchedulingSpec(SpecModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.queueName) || (has(self.gang) && self.gang != 'none')",
         "message": "scheduling.queueName names a Kueue LocalQueue or a Volcano Queue: set scheduling.gang to kueue or volcano, or remove queueName"},
        {"rule": "!has(self.gang) || self.gang != 'kueue' || has(self.queueName)",
         "message": "scheduling.gang kueue needs scheduling.queueName: the LocalQueue of the experiment's namespace that admits the pods"},
        {"rule": "!has(self.gang) || self.gang != 'volcano' || !has(self.schedulerName) || self.schedulerName == 'volcano'",
         "message": "scheduling.gang volcano schedules the pods with schedulerName volcano: remove scheduling.schedulerName"},
    ]})

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector for every pod.")
    tolerations: list[KubeObject] = Field(default_factory=list, description="Tolerations for every pod.")
    affinity: KubeObject = Field(default_factory=dict, description="Affinity for every pod.")
    priority_class_name: str | None = Field(None, description="PriorityClass of the pods (and of the Volcano PodGroup with gang volcano).")
    scheduler_name: str | None = Field(None, description="Scheduler of the pods. With gang volcano it is volcano and may be left out.")
    gang: GangScheduler = Field("none", description=(
        "Put all the experiment's pods (every agent's rollout and learner) into one gang, admitted or scheduled all together "
        "by the cluster's own scheduler, so that some pods never hold GPUs while the others wait. "
        "`none`: each pod is scheduled on its own. "
        "`kueue`: Kueue plain-pod group (pod integration enabled): labels kueue.x-k8s.io/queue-name (queueName, required) and "
        "kueue.x-k8s.io/pod-group-name, annotation kueue.x-k8s.io/pod-group-total-count. "
        "`volcano`: a scheduling.volcano.sh/v1beta1 PodGroup with minMember = the pod count (queue: queueName, else Volcano's default), "
        "pods annotated scheduling.k8s.io/group-name and scheduled by schedulerName volcano. "
        "Change it with the experiment suspended: pods created before and after would be in different gangs."))
    queue_name: str | None = Field(None, max_length=63, description="The Kueue LocalQueue (gang kueue, required) or Volcano Queue (gang volcano, optional) of the pods.",
                                   json_schema_extra={"pattern": DNS_SUBDOMAIN.pattern})
    pending_timeout_seconds: int = Field(600, ge=0, le=MAX_PENDING_TIMEOUT_SECONDS, description=(
        "A pod not scheduled (Pending, PodScheduled not True: no node fits, a quota or gang not admitted, no such scheduler) for "
        "this long turns the experiment's Ready condition to False, reason Unschedulable, with the scheduler's message, and posts "
        "one Warning event; until then Ready says PodsPending. The experiment keeps waiting. 0 reports at once (at most 7 days)."))

    @field_validator("queue_name")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not DNS_SUBDOMAIN.fullmatch(value)):
            raise ValueError(f"{value!r} is not a queue name: use at most 63 lower-case letters, digits, '-' and '.' (a Kueue LocalQueue or Volcano Queue name)")
        return value

    @model_validator(mode="after")
    def _gang(self) -> SchedulingSpec:
        if self.queue_name is not None and self.gang == "none":
            raise ValueError("queueName: scheduling.queueName names a Kueue LocalQueue or a Volcano Queue: set scheduling.gang to kueue or volcano, or remove queueName")
        if self.gang == "kueue" and self.queue_name is None:
            raise ValueError("queueName: scheduling.gang kueue needs scheduling.queueName: the LocalQueue of the experiment's namespace that admits the pods")
        if self.gang == "volcano" and self.scheduler_name not in (None, "volcano"):
            raise ValueError(f"schedulerName: scheduling.gang volcano schedules the pods with schedulerName volcano, got {self.scheduler_name!r}: remove scheduling.schedulerName")
        return self


class ExperimentSpec(SpecModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(has(self.algorithm) && has(self.algorithm.name) && !(self.algorithm.name in " + str(list(SHARED_ROW_ALGORITHMS)).replace("'", '"')
                 + ")) || self.agents.size() >= 2",
         "message": "hacpo and naive share rollouts between agents and need at least 2 agents; add an agent or use gspo/grpo"},
        {"rule": "!has(self.colocate) || !self.colocate || ((!has(self.algorithm) || !has(self.algorithm.maxStaleness) || "
                 "self.algorithm.maxStaleness == 0) && self.agents.all(a, !has(a.rollout) || ((!has(a.rollout.engine) || a.rollout.engine == \"hf\") "
                 "&& (!has(a.rollout.replicas) || a.rollout.replicas == 1))))",
         "message": "colocate: true needs algorithm.maxStaleness 0 and every agent's rollout.engine hf and rollout.replicas 1; or set colocate: false"},
        {"rule": "self.agents.all(a, !has(a.rollout) || !has(a.rollout.replicas) || a.rollout.replicas <= "
                 "(has(self.algorithm) && has(self.algorithm.promptsPerStep) ? self.algorithm.promptsPerStep : "
                 f"{AlgorithmSpec.model_fields['prompts_per_step'].default}))",
         "message": "every agent's rollout.replicas must be at most algorithm.promptsPerStep (each replica samples a slice of "
                    "the step's prompts); lower the replicas or raise promptsPerStep"},
    ]})

    # Bounded (as are the strings the CRD's CEL rules compare) so that the API server's cost
    # estimate of those rules stays far below its limit.
    agents: list[AgentSpec] = Field(min_length=1, max_length=32, description="The agents trained together; at least 2 for hacpo and naive.",
                                    json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="Algorithm and its hyper-parameters.")
    data: DataSpec = Field(description="Training data, eval sets, template and reward.")
    store: StoreSpec = Field(default_factory=StoreSpec, description="Where trajectories, weights and checkpoints live. Omitted: `hacrl run` uses file://./runs; the operator fills in its install's default store (chart values defaultStore or minio.enabled) and refuses the experiment when it has none.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec, description="Evaluation during and after training.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus endpoints of the workers.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Experiment trackers (MLflow, W&B, TensorBoard) each learner logs its step metrics to (docs/tracking.md; needs the `tracking` extra).")
    images: ImageSpec = Field(default_factory=ImageSpec, description="Container images (operator only).")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Pod placement (operator only).")
    colocate: bool | None = Field(None, description=(
        "True: one worker (pod) per agent samples with its live model and trains, instead of a rollout and a learner "
        "worker: no weights published and loaded every step, rollout and learner share the machine's CPUs or GPUs. "
        "Needs algorithm.maxStaleness 0 and every agent's rollout.engine hf and rollout.replicas 1. Omitted: `hacrl run` colocates whenever "
        "both hold (it measured faster on one machine), the operator runs separate rollout and learner pods."))
    suspend: bool = Field(False, description="True deletes the pods and keeps everything else; false resumes from checkpoints.")
    restart_limit: int = Field(3, ge=0, le=1000, description="Pod restarts allowed per agent before the experiment fails.")
    cleanup: CleanupSpec = Field(default_factory=CleanupSpec, description="Cleanup when finished.")
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description=(
        "Environment variables of every rollout and learner pod (operator only), e.g. HF_HUB_OFFLINE or NCCL settings. "
        "Variables the operator sets are refused, naming the field; values from Secrets need the admin's approval."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=16, description=(
        "ConfigMaps and approved Secrets whose every key becomes a variable of every rollout and learner pod (operator only). "
        "Variables set by the operator or by spec.env take precedence over these (Kubernetes: env wins over envFrom)."))
    model_cache: ModelCacheSpec | None = Field(None, description="A PersistentVolumeClaim shared as model cache by the pods of every agent without its own agents[].modelCache (operator only); without either, each pod downloads into an emptyDir.")
    model_token_secret: str | None = Field(None, description="Secret with the key HF_TOKEN, given to every rollout and learner pod as HF_TOKEN (gated Hugging Face models; operator; referenced, never copied). The cluster admin must have marked it usable by experiments.")

    @field_validator("model_token_secret")
    @classmethod
    def _token_secret_name(cls, value: str | None) -> str | None:
        return secret_name(value)

    def secret_references(self) -> list[tuple[str, str]]:
        """``(field, Secret name)`` of every Secret the experiment's pods read."""
        named = [("spec.store.credentialsSecret", self.store.credentials_secret), ("spec.modelTokenSecret", self.model_token_secret)]
        named += [(f"spec.env[{i}].valueFrom.secretKeyRef", var.value_from.secret_key_ref.name)
                  for i, var in enumerate(self.env) if var.value_from and var.value_from.secret_key_ref]
        named += [(f"spec.envFrom[{i}].secretRef", source.secret_ref.name) for i, source in enumerate(self.env_from) if source.secret_ref]
        return [(field, name) for field, name in named if name]

    def model_cache_of(self, agent: str) -> ModelCacheSpec | None:
        """The model cache of ``agent``'s pods: its own, else the experiment's, else None."""
        return self.agent(agent).model_cache or self.model_cache

    @model_validator(mode="after")
    def _agents(self) -> ExperimentSpec:
        seen: set[str] = set()
        for index, agent in enumerate(self.agents):
            if agent.name in seen:
                raise ValueError(f"agents[{index}].name: duplicate agent name {agent.name!r}; agent names must be unique")
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
        if self.algorithm.name in SHARED_ROW_ALGORITHMS and len(self.agents) < 2:
            raise ValueError(
                f"algorithm {self.algorithm.name!r} shares rollouts between agents and needs at least 2 agents, "
                f"got {len(self.agents)}; add an agent or use gspo/grpo"
            )
        return self

    def colocation_blockers(self) -> list[str]:
        """Why this experiment cannot run colocated (empty: it can), each naming its field."""
        blockers = []
        if self.algorithm.max_staleness:
            blockers.append(f"algorithm.maxStaleness: {self.algorithm.max_staleness} (one process samples with the weights it "
                            "trains, so every step is on-policy; set it to 0)")
        blockers += [f"agents[{i}].rollout.engine: {a.rollout.engine} (a colocated worker samples with transformers; set it to hf)"
                     for i, a in enumerate(self.agents) if a.rollout.engine != "hf"]
        blockers += [f"agents[{i}].rollout.replicas: {a.rollout.replicas} (a colocated worker is one sampler per agent; set it to 1)"
                     for i, a in enumerate(self.agents) if a.rollout.replicas != 1]
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
            for i, a in enumerate(self.agents) if a.learner.backend == "torch" and a.learner.dtype == "bfloat16"
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
            raise ValueError(f"{value!r} is not a namespace: at most 63 lower-case letters, digits and '-', "
                             "starting and ending with a letter or digit")
        return value


class Experiment(SpecModel):
    api_version: Literal["hacrl.io/v1alpha1"] = Field(f"{API_GROUP}/{API_VERSION}", alias="apiVersion")
    kind: Literal["HACRLExperiment"] = KIND
    metadata: Metadata
    spec: ExperimentSpec
    # The operator writes status; a manifest read back from the cluster may carry it.
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name


class SpecError(ValueError):
    """A spec that does not validate; ``errors`` holds one line per problem, each naming its field."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: invalid experiment spec\n" + "\n".join(f"  - {e}" for e in errors))


def format_validation_error(error: ValidationError) -> list[str]:
    """Pydantic errors as `field.path[0].sub: message` lines, paths in the YAML's own (camelCase) keys."""
    lines = []
    for item in error.errors():
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = item["msg"].removeprefix("Value error, ")
        # Model-level validators name the nested field themselves ("agents[1].name: ..."): join it on.
        nested = _NESTED_FIELD.match(message) if item["type"] == "value_error" else None
        if nested:
            path = f"{path}.{nested.group(1)}" if path else nested.group(1)
            message = nested.group(2)
        if item["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see `hacrl crd` or docs/spec.md for the allowed fields)"
        lines.append(f"{path or '<document>'}: {message}")
    return lines


def parse_experiment(document: Any, source: str = "<spec>") -> Experiment:
    if not isinstance(document, dict):
        raise SpecError(source, [f"<document>: expected a mapping with apiVersion, kind, metadata and spec, got {type(document).__name__}"])
    try:
        return Experiment.model_validate(document)
    except ValidationError as error:
        raise SpecError(source, format_validation_error(error)) from None


# A spec is a few KB; Kubernetes stores objects up to ~1.5 MB. The node limit stops a "billion
# laughs" document (aliases of aliases) that is small on disk but explodes when expanded.
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_NODES = 100_000


def _expanded_nodes(root: yaml.Node) -> int:
    """Nodes of the document with every alias expanded, counted without expanding (memoised)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [item for pair in node.value for item in pair]
        if children_done or not children:
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 0) for child in children)
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _duplicate_keys(root: yaml.Node) -> list[str]:
    """``path: key`` of every key that a mapping of the document holds twice (YAML would keep the
    last silently); the merge key ``<<`` excepted."""
    found, seen_nodes = [], set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key != "<<":
                    if key in keys:
                        found.append(f"{path}.{key}" if path else key)
                    keys.add(key)
                stack.append((value_node, f"{path}.{key}" if path else str(key)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(node.value))
    return sorted(set(found))


def load_spec_document(text: str, source: str) -> Any:
    """The YAML document of a spec, refusing what would exhaust memory or the stack."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, [f"<document>: {len(text)} characters; an experiment spec is at most {MAX_SPEC_BYTES} (is this the right file?)"])
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        nodes = _expanded_nodes(node)
        if nodes > MAX_SPEC_NODES:
            raise SpecError(source, [f"<document>: {nodes} values once YAML aliases are expanded (at most {MAX_SPEC_NODES}); write the spec without nested aliases"])
        duplicates = _duplicate_keys(node)
        if duplicates:
            raise SpecError(source, [f"{path}: the key is given twice (YAML keeps only the last); keep one" for path in duplicates])
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise SpecError(source, [f"<document>: not valid YAML: {error}"]) from None
    except RecursionError:
        raise SpecError(source, ["<document>: nested too deeply to be an experiment spec"]) from None
    finally:
        loader.dispose()


#: `hacrl run` sets it on each worker: the sha256 of the rendered spec file the run started the
#: worker with. The worker refuses a file with other contents: the spec it trains is the run's.
SPEC_DIGEST_ENV = "HACRL_SPEC_SHA256"


def read_spec_bytes(path: str | Path) -> bytes:
    """The bytes of a spec file, reading at most ``MAX_SPEC_BYTES`` + 1 (a huge file or
    /dev/zero is refused without being read); ``OSError`` when it cannot be read."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(str(path), [f"<document>: larger than {MAX_SPEC_BYTES} bytes; an experiment spec is at most {MAX_SPEC_BYTES} bytes (is this the right file?)"])
    return data


def spec_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_experiment(path: str | Path, *, sha256: str | None = None) -> Experiment:
    """The experiment in the spec file ``path``; with ``sha256``, only if the file's bytes have that
    digest (``SPEC_DIGEST_ENV``: a worker's pinned spec)."""
    data = read_spec_bytes(path)
    if sha256 is not None and spec_digest(data) != sha256:
        raise SpecError(str(path), [
            f"<document>: this is not the spec this worker was started with (sha256 {spec_digest(data)[:12]}..., expected "
            f"{sha256[:12]}...): something replaced the file since its run started; the worker stops rather than train "
            "another experiment. Resume the run with `hacrl run --resume <spec>`"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(str(path), [f"<document>: not UTF-8 text (byte {error.start}): save the spec as UTF-8 YAML"]) from None
    return parse_experiment(load_spec_document(text, str(path)), str(path))


def dump_experiment(experiment: Experiment) -> str:
    """The experiment as YAML with camelCase keys, defaults filled in (the rendered spec)."""
    data = experiment.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("status", None)
    return yaml.safe_dump(data, sort_keys=False)
