"""What the workers report to: their Prometheus endpoints and the experiment trackers."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator

from hacrl_core.spec.base import SpecModel


class MlflowTracking(SpecModel):
    tracking_uri: str = Field(
        max_length=2048,
        description="MLflow tracking server (`http(s)://...`, `databricks`) or a local file store (`file:///path`). "
        "Credentials (MLFLOW_TRACKING_TOKEN, or _USERNAME and _PASSWORD) through spec.env from an approved Secret.",
        json_schema_extra={"pattern": r"^(https?://|file:/|databricks)\S*$"},
    )
    experiment_name: str | None = Field(
        None, max_length=256, description="MLflow experiment the runs go into; default: the HACRL experiment's name."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_uri(cls, value: str) -> str:
        if not re.fullmatch(r"(https?://|file:/|databricks)\S*", value):
            raise ValueError(
                f"{value!r} is not an MLflow tracking URI: http(s)://host[:port], file:///path or databricks"
            )
        return value


# A W&B project name: no path or URL characters, no whitespace.
WANDB_PROJECT = r"[^/\\#?%:\s]+"


class WandbTracking(SpecModel):
    project: str = Field(
        max_length=128, description="W&B project.", json_schema_extra={"pattern": f"^{WANDB_PROJECT}$"}
    )
    entity: str | None = Field(None, max_length=128, description="W&B entity (team or user); default: the API key's.")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online",
        description="`offline` writes the runs locally (`wandb sync` uploads them later). Credentials (WANDB_API_KEY) "
        "through spec.env from an approved Secret.",
    )
    dir: str | None = Field(
        None, max_length=4096, description="Folder of W&B's local files; default: the worker's work folder."
    )

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not re.fullmatch(WANDB_PROJECT, value):
            raise ValueError(f"{value!r} is not a W&B project name: no '/', '\\', '#', '?', '%', ':' or whitespace")
        return value


class TensorBoardTracking(SpecModel):
    log_dir: str = Field(
        max_length=4096,
        description="Folder of the event files, one subfolder per agent: a local path, or a PVC mounted in the learner "
        "pods (podTemplate).",
    )


class TrackingSpec(SpecModel):
    mlflow: MlflowTracking | None = Field(None, description="Log to MLflow: one run per agent.")
    wandb: WandbTracking | None = Field(
        None, description="Log to Weights & Biases: one run per agent, grouped by experiment."
    )
    tensorboard: TensorBoardTracking | None = Field(None, description="Write TensorBoard event files.")
    buffer_steps: int = Field(
        1000,
        ge=1,
        le=100000,
        description="Steps of metrics kept for a tracker while it is unreachable; past that the oldest are dropped and "
        "counted (hacrl_tracker_drops_total).",
    )

    def enabled(self) -> list[str]:
        return [name for name in ("mlflow", "wandb", "tensorboard") if getattr(self, name) is not None]


class MetricsSpec(SpecModel):
    port: int = Field(
        9400,
        ge=0,
        le=65535,
        description="First Prometheus metrics port; each local worker takes the next free one (0 disables).",
    )
    bind_address: str = Field(
        "127.0.0.1", description="Address the metrics endpoint binds: an IP address (`0.0.0.0` in pods) or `localhost`."
    )

    @field_validator("bind_address")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        if value != "localhost":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(
                    f"{value!r} is not an address to bind: give an IP address such as 127.0.0.1, 0.0.0.0 or ::1, or localhost"
                ) from None
        return value
