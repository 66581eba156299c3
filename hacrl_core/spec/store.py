"""The trajectory store the workers share, and the checkpoints kept in it."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from hacrl_core.spec.base import SpecModel
from hacrl_core.spec.cluster import secret_name
from hacrl_core.store_uri import parse_store_uri

_ENDPOINT = re.compile(r"^https?://[^\s/?#@]+(:\d{1,5})?/?$")


class StoreSpec(SpecModel):
    uri: str = Field("file://./runs", description="Trajectory store: `file://path` (default) or `s3://bucket/prefix`.")
    endpoint: str | None = Field(None, description="S3 endpoint URL (MinIO, SeaweedFS); empty for AWS.")
    region: str | None = Field(None, description="S3 region.")
    credentials_secret: str | None = Field(
        None,
        description="Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (operator; referenced, never copied).",
    )
    adopt_existing: bool = Field(
        False,
        description="Operator: let this experiment take over the store prefix of a deleted experiment of the same "
        "namespace and name and resume from its checkpoints; false refuses such a prefix (condition "
        "StoreOwnedByAnother).",
    )

    @field_validator("uri")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if "://" in value and not value.startswith(("file://", "s3://")):
            raise ValueError(f"unsupported store {value!r}: use file://path or s3://bucket/prefix")
        if value.startswith("s3://") and not value[len("s3://") :].strip("/"):
            raise ValueError("s3 store needs a bucket: s3://bucket/prefix")
        parse_store_uri(value)  # what `hacrl run` and the workers open: refused here, not there
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value and not _ENDPOINT.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an S3 endpoint URL: use http(s)://host[:port], e.g. http://minio.minio:9000 (no path, no credentials)"
            )
        return value or None

    @field_validator("credentials_secret")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        return secret_name(value)


class CheckpointSpec(SpecModel):
    every_steps: int = Field(1, ge=1, description="Checkpoint every N steps (and always at the last step).")
    keep_last: int = Field(2, ge=1, description="Checkpoints kept per agent.")
    grace_period_seconds: int = Field(
        120,
        ge=1,
        le=86400,
        description="Seconds a stopped worker (SIGTERM: pod deleted, evicted, preempted, node drained; Ctrl-C of "
        "`hacrl run`) has to end its step in flight (a step waiting for data is abandoned) and checkpoint the "
        "last finished one before it is killed; the pods' terminationGracePeriodSeconds.",
    )
