"""The algorithm and its hyper-parameters (HACPO's and its baselines'): docs/algorithm.md."""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator, model_validator

from hacrl_core.algorithm_plugins import AlgorithmName
from hacrl_core.spec.base import SpecModel


class Ablations(SpecModel):
    capability_advantage: bool = Field(
        True, description="Mechanism 1: capability-weighted baseline in the advantage; off = plain mixed-group mean."
    )
    discrepancy_coefficient: bool = Field(
        True, description="Mechanism 2: weight cross rows by omega(src, learner) = P_src / P_learner; off = 1."
    )
    exponential_importance: bool = Field(True, description="Mechanism 3: s~ = c * stopgrad(c)^alpha; off = alpha 0.")
    stepwise_clipping: bool = Field(
        True,
        description="Mechanism 4: the cross-ratio floor rises by deltaStep per update; off = fixed floor 1 - delta.",
    )


DEFAULT_MINI_BATCH_PROMPTS = 64  # the paper's; smaller steps default to one update of the whole step


class AlgorithmSpec(SpecModel):
    # The cross-field rules of the validators below, as CEL the API server checks at admission.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.promptsPerStep) || !has(self.miniBatchPrompts) || "
                    "(self.miniBatchPrompts <= self.promptsPerStep && self.promptsPerStep % self.miniBatchPrompts == "
                    "0)",
                    "message": "miniBatchPrompts must divide promptsPerStep (e.g. promptsPerStep 128 with miniBatchPrompts 64)",
                },
                # miniBatchPrompts has no schema default (it is min(64, promptsPerStep), which OpenAPI
                # cannot say), so without it the rule above does not run: this one checks the default.
                {
                    "rule": "!has(self.promptsPerStep) || has(self.miniBatchPrompts) || self.promptsPerStep <= 64 || self.promptsPerStep % 64 == 0",
                    "message": "without miniBatchPrompts an update takes 64 prompts, which must divide promptsPerStep; "
                    "set miniBatchPrompts to a divisor of promptsPerStep (e.g. promptsPerStep 100 with "
                    "miniBatchPrompts 50)",
                },
                {
                    "rule": "!has(self.ratioBounds) || (self.ratioBounds[0] > 0.0 && self.ratioBounds[0] <= 1.0 && self.ratioBounds[1] >= 1.0)",
                    "message": "ratioBounds must be [low, high] with 0 < low <= 1 <= high",
                },
            ]
        }
    )
    name: AlgorithmName = Field(
        "hacpo",
        description="`hacpo`; `gspo` and `grpo` (isolated agents); `naive` (shared rows, no mechanisms). GSPOx2 is "
        "`gspo` with groupSize doubled.",
    )
    group_size: int = Field(8, ge=2, le=1024, description="G: responses sampled per prompt per agent (paper: 8).")
    prompts_per_step: int = Field(
        128, ge=1, le=1_000_000, description="B: prompts per training step, shared by all agents (paper: 128)."
    )
    # The default depends on promptsPerStep (a fixed 64 would refuse every smaller step); the
    # factory sees the fields validated before it. No schema default, hence the CEL rule above.
    mini_batch_prompts: int = Field(
        default_factory=lambda validated: min(
            DEFAULT_MINI_BATCH_PROMPTS, validated.get("prompts_per_step", DEFAULT_MINI_BATCH_PROMPTS)
        ),
        ge=1,
        description="Prompts per optimizer update; must divide promptsPerStep. Default min(64, promptsPerStep) (paper: "
        "64).",
    )
    epochs: int = Field(1, ge=1, le=100, description="Passes over a step's rows (paper: 1).")
    steps: int = Field(100, ge=1, le=10_000_000, description="Training steps to run.")
    seed: int = Field(
        0, ge=0, le=2**31 - 1, description="Seed of data order, sampling and initialisation (0 to 2^31-1)."
    )
    alpha: float = Field(1.0, ge=0, le=10, description="Exponent of the exponential importance weight (paper: 1.0).")
    delta: float = Field(0.2, ge=0, lt=1, description="Initial cross-ratio floor is 1 - delta (paper: 0.2).")
    delta_step: float = Field(
        0.025, ge=0, le=1, description="Floor increase per optimizer update within a step (paper: 0.025)."
    )
    capability_window: int = Field(
        5, ge=1, le=1000, description="K: steps in the capability moving average (paper: 5)."
    )
    capability_floor: float = Field(1e-8, gt=0, le=1, description="Lower bound of a capability estimate.")
    ratio_bounds: tuple[float, float] = Field(
        (0.1, 10.0), strict=False, description="Clamp [low, high] of capability ratios omega (paper: [0.1, 10])."
    )
    warmup_steps: int = Field(0, ge=0, description="Steps during which every capability ratio is 1.")
    kl_coef: float = Field(
        0.0,
        ge=0,
        le=10,
        description="k3 KL penalty to the frozen reference on own rows (paper: 0.001); 0 disables it and skips loading "
        "the reference model.",
    )
    own_clip_low: float = Field(
        3e-4, ge=0, lt=1, description="GSPO clip below 1 of own rows' sequence ratio (paper: 3e-4)."
    )
    own_clip_high: float = Field(4e-4, ge=0, description="GSPO clip above 1 of own rows' sequence ratio (paper: 4e-4).")
    grpo_clip_low: float = Field(0.2, ge=0, lt=1, description="GRPO token-ratio clip below 1 (grpo only).")
    grpo_clip_high: float = Field(0.28, ge=0, description="GRPO token-ratio clip above 1, clip-higher (grpo only).")
    ablations: Ablations = Field(
        default_factory=Ablations, description="Switch single HACPO mechanisms off (hacpo only)."
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=4,
        description=(
            "Weights versions a rollout may lag its step: step t is sampled with weights version max(0, t - "
            "maxStaleness). "
            "0: strictly on-policy (the paper's), rollout and learner take turns; 1: sampling of step t+1 overlaps the "
            "update of "
            "step t (one-step off-policy, as verl's recipe; pi_old stays the learner's own scoring pass)."
        ),
    )

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
