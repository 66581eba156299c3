"""The agents: each one's model, and its rollout and learner settings."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from hacrl_core.catalog import BackendName, EngineName
from hacrl_core.spec.base import DNS_LABEL, SpecModel
from hacrl_core.spec.cluster import GPU_RESOURCE, ModelCacheSpec, RolePodTemplates, RoleResources, gpu_count


class RolloutSettings(SpecModel):
    engine: EngineName = Field(
        "hf", description="Sampling engine: `hf` (transformers generate, CPU or GPU) or `vllm` (GPU)."
    )
    max_new_tokens: int = Field(512, ge=1, le=65536, description="Longest response sampled, in the agent's own tokens.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature (the paper uses 1.0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (the paper uses 1.0).")
    batch_size: int = Field(64, ge=1, description="Prompts per generate call (hf engine).")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="vLLM tensor parallelism (vllm engine only; default 1)."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory vLLM may take (vllm engine only; default 0.85)."
    )
    replicas: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Rollout workers of this agent (pods on Kubernetes, processes under `hacrl run`), each with the agent's "
            "rollout "
            "resources: replica r samples its contiguous slice of every step's prompts and writes its own part of the "
            "step's "
            "rollouts, and the learners read all parts in replica order. Separate rollout and learner workers only (a "
            "colocated "
            "worker samples with the model it trains). Fixed once the experiment started (the parts already written "
            "are "
            "sliced by it). Default 1."
        ),
    )

    @model_validator(mode="after")
    def _engine_specific(self) -> RolloutSettings:
        if self.engine != "vllm":
            for name, value in (
                ("tensorParallelSize", self.tensor_parallel_size),
                ("gpuMemoryUtilization", self.gpu_memory_utilization),
            ):
                if value is not None:
                    raise ValueError(f"{name}: applies to engine 'vllm' only; remove it or set engine: vllm")
        return self


#: A module name as peft matches it in ``target_modules``: a name of the model's modules, or a
#: dotted suffix of one (``q_proj``, ``self_attn.q_proj``).
LORA_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def _lora_module(name: str) -> str:
    if len(name) > 128 or not LORA_MODULE.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a module name: letters, digits and '_', dotted for a suffix of a module path (e.g. q_proj, self_attn.q_proj)"
        )
    return name


LoraModule = Annotated[
    str,
    AfterValidator(_lora_module),
    WithJsonSchema({"type": "string", "maxLength": 128, "pattern": LORA_MODULE.pattern}),
]


class LoraSettings(SpecModel):
    # The API server's copy of the uniqueness check below.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.targetModules) || self.targetModules.all(m, self.targetModules.exists_one(n, n == m))",
                    "message": "lora.targetModules lists a module twice; list each once",
                },
            ]
        }
    )
    rank: int = Field(
        16,
        ge=1,
        le=512,
        description=(
            "r: rank of each adapter matrix pair (vLLM serves adapters up to rank 512). The adapter holds rank x (in + "
            "out) "
            "parameters per targeted linear layer. Default 16."
        ),
    )
    alpha: float = Field(
        32.0,
        gt=0,
        le=65536,
        description="LoRA alpha: the adapter's output is scaled by alpha / rank. Default 32 (twice the default rank).",
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter's input while training (0: none, the default; RL updates are small).",
    )
    target_modules: list[LoraModule] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description=(
            "Names of the linear modules that get an adapter, as peft matches them (a module name or a dotted suffix, "
            "e.g. "
            "`[q_proj, k_proj, v_proj, o_proj]`). Unset: every linear layer but the output head (peft's `all-linear`). "
            "A name "
            "that matches no module of the model stops the learner with the model's linear module names."
        ),
    )

    @field_validator("target_modules")
    @classmethod
    def _each_once(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"lists a module twice ({', '.join(map(repr, twice))}); list each once")
        return value


class LearnerSettings(SpecModel):
    backend: BackendName = Field("torch", description="Training backend: plain `torch` or `deepspeed`.")
    lr: float = Field(1e-6, gt=0, le=1, description="AdamW learning rate (paper: 1e-6).")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay (paper: 0.01).")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip (paper: 1.0).")
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description=(
            "Most rows per micro-batch (one forward/backward pass; gradients accumulate up to the mini-batch). Unset: "
            "no row "
            "cap, micro-batches are sized by microBatchTokens alone."
        ),
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Padded tokens (rows x the longest row) per micro-batch: rows are packed in order up to it. Unset: derived "
            "from "
            "the device (CPU: a quarter of the machine's memory; GPU: half the free memory less the gradients and "
            "optimizer "
            "state), see docs/runtime.md."
        ),
    )
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None, description="DeepSpeed ZeRO stage (deepspeed backend only; default 0)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype for training.")
    full_publish_every: int = Field(
        10,
        ge=1,
        le=1000,
        description=(
            "Weights versions per full publish. Between two full publishes the learner publishes only the elements "
            "that "
            "changed since its previous publish (a delta, bit-identical once applied, checked against a sha256 of the "
            "whole "
            "state), and sooner than this it publishes in full once the deltas since the last full one add up to its "
            "size. "
            "A rollout replica that holds the previous version reads one delta per step; a new or restarted one reads "
            "the "
            "last full publish and at most fullPublishEvery - 1 deltas. Deltas pay off for bf16 publishes (dtype "
            "bfloat16, "
            "or deepspeed): at lr 1e-6 a few percent of bf16 elements change per step, while an fp32 copy changes "
            "almost "
            "everywhere and is published in full. 1: every publish in full. Default 10: a new replica reads at most a "
            "full "
            "publish and 9 deltas, and the full publishes add a tenth of a model per step to the writes "
            "(docs/benchmarks.md, weights). A LoRA agent (`lora`) publishes its adapter whole every version."
        ),
    )
    processes_per_node: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Data-parallel learner ranks per node (one per GPU; torchrun's --nproc-per-node). Each rank trains on its "
            "slice of "
            "every mini-batch and the gradients are summed, so the update is the one-rank update; the optimizer state "
            "is "
            "sharded over the ranks (torch: ZeroRedundancyOptimizer; deepspeed: ZeRO stage zeroStage). Rank 0 alone "
            "writes "
            "to the store. 1 (default): one learner process."
        ),
    )
    nodes: int = Field(
        1,
        ge=1,
        le=1024,
        description=(
            "Nodes the learner spans (torchrun's --nnodes): the learner has nodes x processesPerNode ranks. `hacrl "
            "run` runs "
            "one node and refuses more; the operator runs one learner pod per node (colocated: one colocated pod per "
            "node) "
            "behind a headless Service, node 0's pod the rendezvous, and restarts them together. Default 1."
        ),
    )
    lora: LoraSettings | None = Field(
        None,
        description=(
            "Train a LoRA adapter (peft) instead of every weight: the base model stays frozen, the optimizer holds the "
            "adapter's "
            "parameters only, and weights versions and checkpoints carry the adapter alone (adapter_model.safetensors "
            "and "
            "adapter_config.json); every worker reads the base model once, from `model`. Unset: full fine-tuning."
        ),
    )

    @property
    def world_size(self) -> int:
        """Learner ranks in all: ``nodes`` x ``processes_per_node``."""
        return self.nodes * self.processes_per_node

    @model_validator(mode="after")
    def _backend_specific(self) -> LearnerSettings:
        if self.backend != "deepspeed" and self.zero_stage is not None:
            raise ValueError("zeroStage: applies to backend 'deepspeed' only; remove it or set backend: deepspeed")
        return self


class AgentSpec(SpecModel):
    name: str = Field(
        description="Agent name: a DNS label (lower-case letters, digits, '-'), unique in the experiment; used in pod "
        "names and store keys.",
        json_schema_extra={"pattern": DNS_LABEL.pattern, "maxLength": 40},
    )
    model: str = Field(
        max_length=1024,
        description="Model: a local path, a hub id (`org/name`), an `s3://bucket/prefix`, or `tiny://<preset>?seed=N` "
        "(offline tiny model).",
    )
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="Rollout worker settings.")
    learner: LearnerSettings = Field(default_factory=LearnerSettings, description="Learner worker settings.")
    resources: RoleResources = Field(
        default_factory=RoleResources, description="Per-role Kubernetes resources (operator only)."
    )
    pod_template: RolePodTemplates = Field(
        default_factory=RolePodTemplates, description="Per-role pod spec overrides (operator only)."
    )
    model_cache: ModelCacheSpec | None = Field(
        None,
        description="This agent's model cache (operator only); overrides spec.modelCache for its rollout and learner "
        "pods.",
    )
    suspend: bool = Field(
        False,
        description="Pause this agent while the team goes on: its workers leave the team at their next step boundary "
        "and "
        'its pods are released; false again brings it back from its last step (docs/operator.md, "Changing the team").',
    )

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
                    f"{gpus} ({GPU_RESOURCE}); request {wanted} GPUs or lower tensorParallelSize"
                )
        # A learner pod with GPUs runs one rank per GPU: more ranks than GPUs would put two on a
        # device (NCCL refuses it). No GPU count, or 0, is a CPU learner, whose ranks share cores.
        gpus = gpu_count(self.resources.learner)
        ranks = self.learner.processes_per_node
        if gpus and gpus < ranks:
            raise ValueError(
                f"learner.processesPerNode: {ranks} ranks need {ranks} GPUs per learner pod (one each), but resources.learner "
                f"gives {gpus} ({GPU_RESOURCE}); request {ranks} GPUs or lower processesPerNode"
            )
        return self
