"""Worker pods as the planner sees them: a ``PodView`` of each pod manifest."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from hacrl_operator.builders import LABEL_AGENT, LABEL_ROLE, ROLES

# Why a pod is not running, as condition reasons, most actionable first.
_WAITING_REASONS = {
    "ImagePullBackOff": "ImagePullBackOff",
    "ErrImagePull": "ImagePullBackOff",
    "InvalidImageName": "ImagePullBackOff",
    "ErrImageNeverPull": "ImagePullBackOff",
    "CrashLoopBackOff": "CrashLoop",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerConfigError",
    "RunContainerError": "CreateContainerConfigError",
}


@dataclasses.dataclass(frozen=True)
class PodView:
    """What the operator needs to know about one worker pod."""

    name: str
    agent: str
    role: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    reason: str | None = None  # why it is not running (a condition reason), None when it runs
    message: str = ""
    terminating: bool = False

    @property
    def state(self) -> str:
        """The pod's state in ``agentProgress[].<role>Pod``: its reason when it has one, else its phase."""
        return self.reason or self.phase


def summarize_pod(pod: Mapping[str, Any]) -> PodView | None:
    """A ``PodView`` of a pod manifest, or None when it is not one of our worker pods."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    agent, role = labels.get(LABEL_AGENT), labels.get(LABEL_ROLE)
    if not agent or role not in ROLES:
        return None
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    reason: str | None = None
    message = status.get("message") or ""
    if phase in ("Pending", "Running"):
        reason, message = _not_running(status, phase, message)
    elif phase == "Failed":
        message = _failure(status) or message or "pod failed"
    return PodView(
        name=metadata.get("name", ""),
        agent=agent,
        role=role,
        phase=phase,
        reason=reason,
        message=message,
        terminating=bool(metadata.get("deletionTimestamp")),
    )


def _not_running(status: Mapping[str, Any], phase: str, message: str) -> tuple[str | None, str]:
    """Why a Pending or Running pod does not run, and the detail: a waiting container's reason
    first, else an unschedulable pod, else (Pending) just pending; ``(None, message)`` when it runs."""
    reason: str | None = None
    if phase == "Pending":
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = "Unschedulable" if condition.get("reason") == "Unschedulable" else "PodsPending"
                message = condition.get("message") or message
    for container in list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        mapped = _WAITING_REASONS.get(waiting.get("reason", ""))
        if mapped:
            return mapped, f"{container.get('name')}: {waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(": ")
    if phase == "Pending" and reason is None:
        reason = "PodsPending"
    return reason, message


def _failure(status: Mapping[str, Any]) -> str | None:
    """Why a Failed pod failed: the pod's reason (e.g. Evicted) and the first terminated
    container's exit code and reason."""
    reason_text = status.get("reason")
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            detail = f"{container.get('name')} exited with code {terminated.get('exitCode')}"
            if terminated.get("reason"):
                detail += f" ({terminated['reason']})"
            return f"{reason_text}: {detail}" if reason_text else detail
    return reason_text


def index_pods(pods: Iterable[Mapping[str, Any]], agents: Iterable[str]) -> tuple[dict[tuple[str, str], PodView], list[str]]:
    """Our worker pods by (agent, role), the first of each, and the names of the live pods of
    agents that are no longer in the spec (to delete)."""
    wanted = set(agents)
    views: dict[tuple[str, str], PodView] = {}
    orphans: list[str] = []
    for pod in pods:
        view = summarize_pod(pod)
        if view is None:
            continue
        if view.agent in wanted:
            views.setdefault((view.agent, view.role), view)
        elif not view.terminating:
            orphans.append(view.name)
    return views, orphans
