"""The data: training prompts, eval sets and when they run, the prompt template, the reward."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from hacrl_core.rewards import reward_names
from hacrl_core.spec.base import SpecModel

REWARD_NAMES = tuple(reward_names())  # the rewards registry (standard library only)


class DataSource(SpecModel):
    source: str = Field(
        max_length=4096, description="`builtin://arithmetic?difficulty=1-3&seed=0`, a .jsonl/.parquet path or URI."
    )
    prompt_key: str = Field(
        "prompt", max_length=256, description="Key of the prompt in each row (dotted for nested keys)."
    )
    answer_key: str = Field(
        "answer", max_length=256, description="Key of the gold answer (dotted, e.g. `reward_model.ground_truth`)."
    )


class EvalSet(DataSource):
    name: str = Field(max_length=63, description="Name of the eval set in metrics and reports.")
    max_prompts: int = Field(256, ge=1, description="Prompts evaluated at most.")


# A built-in reward's name, or the URL of a reward server (no spaces or control characters).
REWARD_PATTERN = "^(" + "|".join(REWARD_NAMES) + r"|https?://[^\s]+)$"


class RewardServerSpec(SpecModel):
    timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="Seconds one request may take before it is retried."
    )
    retries: int = Field(
        5,
        ge=0,
        le=20,
        description="Retries of a batch that timed out, could not connect or got HTTP 429/5xx (exponential backoff "
        "from 0.5 s); then the worker stops resumably.",
    )
    concurrency: int = Field(4, ge=1, le=256, description="Batches in flight at once.")
    batch_size: int = Field(256, ge=1, le=65536, description="Responses per request.")


class DataSpec(SpecModel):
    train: DataSource = Field(description="Training prompts.")
    eval: list[EvalSet] = Field(
        default_factory=list, max_length=32, description="Held-out sets evaluated every `evaluation.everySteps`."
    )
    template: str = Field(
        "{question}",
        max_length=16384,
        description="Prompt template; `{question}` is replaced by the row's prompt. Each agent then applies its own "
        "chat template.",
    )
    reward: str = Field(
        "math",
        max_length=2048,
        description="Verifier: `exact`, `numeric` or `math` (Math-Verify), or the http(s):// URL of a reward server "
        "(docs/rewards.md; its knobs: rewardServer).",
        json_schema_extra={"pattern": REWARD_PATTERN},
    )
    reward_server: RewardServerSpec = Field(
        default_factory=lambda: RewardServerSpec(),
        description="Timeout, retries, concurrency and batch size of the reward server that `reward` names (unused for "
        "a built-in reward).",
    )

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, value: str) -> str:
        if not re.fullmatch(REWARD_PATTERN, value):
            raise ValueError(
                f"{value!r} is neither a reward ({', '.join(REWARD_NAMES)}) nor an http(s):// URL of a reward server"
            )
        return value

    @model_validator(mode="after")
    def _unique_eval_names(self) -> DataSpec:
        names = [e.name for e in self.eval]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(
                    f"eval[{index}].name: {name!r} names an earlier eval set too; eval set names must be unique "
                    "(they key the metrics and the report)"
                )
        return self

    @field_validator("template")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError("template must contain '{question}' where the prompt goes")
        return value


class EvaluationSpec(SpecModel):
    every_steps: int = Field(0, ge=0, description="Evaluate every N steps during training; 0 only at the end.")
    samples: int = Field(1, ge=1, le=1024, description="k samples per prompt: avg@k, pass@k (greedy when 1).")
