"""What every part of the spec shares: the model base (camelCase keys, unknown fields refused,
no coercion) and the Kubernetes name patterns."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# Name patterns are written as the CRD's (ECMA/RE2) `pattern` strings, where `$` ends the text;
# in Python `$` also matches before a final newline, so every check here uses ``fullmatch``
# (tests/spec/test_spec_patterns.py holds the two readings equal on hostile strings).
# An RFC 1123 subdomain: what Kubernetes accepts as a Secret name.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SpecModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        # YAML gives real types; strict keeps `steps: true` or `lr: "1e-4"` from being coerced
        # (the one tuple field opts out: YAML and JSON only have lists).
        strict=True,
        # NaN passed or failed a field's bounds by accident (`lr: .nan` was "should be less than
        # or equal to 1"): every float of a spec is refused as not finite first.
        allow_inf_nan=False,
    )


# Free-form Kubernetes objects (resources, affinity, pod overrides) are passed through as dicts:
# the API server validates them, and copying their schemas here would drift.
KubeObject = dict[str, Any]
