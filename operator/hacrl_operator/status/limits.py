"""The API's length limits on the texts the operator writes, and cutting a text to one.

- ``conditions[].message``: at most 32768 (the CRD's maxLength, from ``hacrl_core.status.Condition``,
  which is metav1.Condition's limit). A longer one makes the API server refuse the whole status
  PATCH with 422, so the status would never change again. ``status.message`` gets the same cap.
- an Event's message: at most 1024 bytes (``NoteLengthLimit``, checked with Go's ``len``, i.e. in
  bytes, by kubernetes/kubernetes pkg/apis/core/validation/events.go for events.k8s.io/v1 Events;
  core/v1 Events are not checked there, but the events API and its readers assume the limit).

Limits are cut in UTF-8 bytes, which is never more than the characters the CRD's maxLength
counts, at a character boundary, and the cut text ends in an ellipsis so that nobody reads it as
the whole message.
"""

from __future__ import annotations

CONDITION_MESSAGE_BYTES = 32768
EVENT_MESSAGE_BYTES = 1024
ELLIPSIS = "…"


def cut(text: str, limit: int) -> str:
    """``text`` if its UTF-8 encoding fits in ``limit`` bytes, else its longest prefix that fits
    together with a trailing ellipsis (never half a character)."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    room = limit - len(ELLIPSIS.encode("utf-8"))
    return encoded[:room].decode("utf-8", errors="ignore") + ELLIPSIS
