"""Unit: pod states and heartbeats -> phase, conditions, actions and events (table-driven)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from hacrl_core.spec import parse_experiment
from hacrl_core.status import Condition
from hacrl_operator.builders import pod_name
from hacrl_operator.status import (
    ActionOutcome,
    Event,
    Observed,
    fold_outcome,
    plan_reconcile,
    status_patch,
    summarize_pod,
)
from hacrl_operator.status.limits import cut
from hacrl_operator.status.outcome import ConditionChange, PodStateChange, failure, said

REPO = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
AGENTS = ("llama-char", "qwen-bpe")


def experiment(**spec_changes: Any):
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["spec"]["algorithm"]["steps"] = 12  # the step counts below; the quickstart's own may change
    document["spec"].update(spec_changes)
    return parse_experiment(document)


def pod(
    agent: str,
    role: str,
    phase: str = "Running",
    *,
    waiting: str | None = None,
    terminated: dict | None = None,
    unschedulable: bool = False,
    terminating: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting or terminated:
        state = {"waiting": {"reason": waiting, "message": "detail"}} if waiting else {"terminated": terminated}
        status["containerStatuses"] = [{"name": role, "state": state}]
    if unschedulable:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes",
                "lastTransitionTime": "2026-01-01T11:00:00Z",
            }
        ]  # an hour before NOW: past the timeout
    metadata: dict[str, Any] = {
        "name": pod_name("quickstart", agent, role),
        "labels": {"hacrl.io/agent": agent, "hacrl.io/role": role, "hacrl.io/experiment": "quickstart"},
    }
    if terminating:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "status": status}


def all_pods(phase: str = "Running") -> list[dict[str, Any]]:
    return [pod(a, r, phase) for a in AGENTS for r in ("rollout", "learner")]


def progress_entry(name: str, *, restarts: int = 0, state: str | None = "Running", step: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "step": step,
        "weightsVersion": 0,
        "restarts": restarts,
        "rolloutPod": state,
        "learnerPod": state,
    }


def running_status(**changes: Any) -> dict[str, Any]:
    status = {
        "phase": "Running",
        "agentProgress": [progress_entry(a) for a in AGENTS],
        "startTime": "2026-01-01T11:00:00Z",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AllPodsRunning",
                "message": "",
                "lastTransitionTime": "2026-01-01T11:00:00Z",
            }
        ],
    }
    status.update(changes)
    return status


def plan(exp=None, status=None, pods=(), progress=None, **kw: Any):
    return plan_reconcile(
        Observed(
            experiment=exp or experiment(), status=status or {}, pods=list(pods), progress=progress or {}, now=NOW, **kw
        )
    )


def cond(p, type_: str) -> Condition | None:
    return next((c for c in p.status.conditions if c.type == type_), None)


# -- pod summaries ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("manifest", "phase", "reason"),
    [
        (pod("a", "learner", "Running"), "Running", None),
        (pod("a", "learner", "Pending"), "Pending", "PodsPending"),
        (pod("a", "learner", "Pending", unschedulable=True), "Pending", "Unschedulable"),
        (pod("a", "learner", "Pending", waiting="ImagePullBackOff"), "Pending", "ImagePullBackOff"),
        (pod("a", "learner", "Pending", waiting="ErrImagePull"), "Pending", "ImagePullBackOff"),
        (pod("a", "learner", "Running", waiting="CrashLoopBackOff"), "Running", "CrashLoop"),
        (pod("a", "learner", "Pending", waiting="CreateContainerConfigError"), "Pending", "CreateContainerConfigError"),
        (pod("a", "learner", "Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}), "Failed", None),
        (pod("a", "learner", "Succeeded"), "Succeeded", None),
    ],
)
def test_summarize_pod(manifest: dict, phase: str, reason: str | None) -> None:
    view = summarize_pod(manifest)
    assert (view.phase, view.reason) == (phase, reason)
    assert view.state == (reason or phase)


def test_summarize_pod_failure_message_and_foreign_pods() -> None:
    view = summarize_pod(pod("a", "learner", "Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}))
    assert view.message == "learner exited with code 137 (OOMKilled)"
    assert summarize_pod({"metadata": {"name": "x", "labels": {}}}) is None


# -- phase and conditions from pod states (table) ------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "old_phase", "phase", "ready", "reason"),
    [
        ([], None, "Pending", "False", "PodsPending"),
        (all_pods("Pending"), "Pending", "Pending", "False", "PodsPending"),
        (all_pods("Running"), "Pending", "Running", "True", "AllPodsRunning"),
        (
            all_pods()[:3] + [pod("qwen-bpe", "learner", "Pending", waiting="ImagePullBackOff")],
            "Pending",
            "Pending",
            "False",
            "ImagePullBackOff",
        ),
        (
            all_pods()[:3] + [pod("qwen-bpe", "learner", "Pending", unschedulable=True)],
            "Pending",
            "Pending",
            "False",
            "Unschedulable",
        ),
        (
            all_pods()[:3] + [pod("qwen-bpe", "learner", "Running", waiting="CrashLoopBackOff")],
            "Running",
            "Running",
            "False",
            "CrashLoop",
        ),
        (all_pods()[:3] + [pod("qwen-bpe", "learner", "Failed")], "Running", "Running", "False", "Restarting"),
        (all_pods()[:3] + [pod("qwen-bpe", "learner", terminating=True)], "Running", "Running", "False", "Restarting"),
    ],
)
def test_phase_and_ready_condition(pods: list, old_phase: str | None, phase: str, ready: str, reason: str) -> None:
    old = running_status(phase=old_phase) if old_phase else {}
    p = plan(status=old, pods=pods)
    assert p.status.phase == phase
    assert (cond(p, "Ready").status, cond(p, "Ready").reason) == (ready, reason)


def test_first_reconcile_creates_every_pod_and_configmap() -> None:
    p = plan()
    assert p.ensure_configmap and sorted(p.create_pods) == sorted(
        (a, r, None) for a in AGENTS for r in ("rollout", "learner")
    )
    assert p.status.start_time == "2026-01-01T12:00:00Z" and p.status.steps == 12 and p.status.agents == 2
    assert [a.restarts for a in p.status.agent_progress] == [0, 0]
    assert {e.reason for e in p.events} >= {"Pending", "FileStore"}


def test_failed_pod_is_replaced_and_counted_for_its_agent_only() -> None:
    pods = (
        [pod("llama-char", "learner", "Failed", terminated={"exitCode": 1, "reason": "Error"})]
        + all_pods()[:1]
        + all_pods()[2:]
    )
    p = plan(status=running_status(), pods=pods)
    assert p.delete_pods == [pod_name("quickstart", "llama-char", "learner")] and p.create_pods == [
        ("llama-char", "learner", None)
    ]
    llama, qwen = p.status.agent_progress
    assert (llama.restarts, llama.learner_pod, qwen.restarts) == (1, "Restarting", 0)
    assert [e.reason for e in p.events if e.type == "Warning"] == ["PodFailed"]


@pytest.mark.parametrize(
    ("previous_state", "restarts"),
    [("Running", 1), ("Pending", 1), ("Restarting", 0), (None, 0), ("CreateFailed", 0)],
)
def test_missing_pod_counts_as_restart_only_if_it_existed(previous_state: str | None, restarts: int) -> None:
    old = running_status()
    old["agentProgress"][0]["learnerPod"] = previous_state
    pods = [p for p in all_pods() if p["metadata"]["name"] != pod_name("quickstart", "llama-char", "learner")]
    p = plan(status=old, pods=pods)
    assert p.create_pods == [("llama-char", "learner", None)]
    assert p.status.agent_progress[0].restarts == restarts


def test_restart_limit_exceeded_fails_without_restarting_anything() -> None:
    old = running_status()
    old["agentProgress"][0]["restarts"] = 3
    old["agentProgress"][1]["restarts"] = 0
    pods = [pod("llama-char", "rollout", "Failed"), pod("qwen-bpe", "learner", "Failed")] + [
        pod("llama-char", "learner"),
        pod("qwen-bpe", "rollout"),
    ]
    p = plan(status=old, pods=pods)
    assert p.status.phase == "Failed" and p.create_pods == [] and p.delete_pods == []
    assert (
        cond(p, "Failed").reason == "RestartLimitExceeded"
        and "agent llama-char rollout pod" in cond(p, "Failed").message
    )
    assert [a.restarts for a in p.status.agent_progress] == [3, 0]  # no restart happened in the failing pass
    assert p.status.completion_time == "2026-01-01T12:00:00Z"
    assert ("Warning", "Failed") in [(e.type, e.reason) for e in p.events]
    assert cond(p, "CleanedUp").reason == "Kept"


def test_restart_limit_zero_fails_on_the_first_failure() -> None:
    p = plan(
        exp=experiment(restartLimit=0),
        status=running_status(),
        pods=all_pods()[1:] + [pod("llama-char", "rollout", "Failed")],
    )
    assert p.status.phase == "Failed"


def test_suspend_deletes_pods_and_resume_recreates_without_counting() -> None:
    p = plan(exp=experiment(suspend=True), status=running_status(), pods=all_pods())
    assert p.status.phase == "Suspended" and len(p.delete_pods) == 4 and not p.create_pods and not p.ensure_configmap
    assert cond(p, "Suspended").status == "True"
    assert all(a.rollout_pod is None and a.learner_pod is None for a in p.status.agent_progress)
    again = plan(exp=experiment(suspend=True), status=p.status, pods=[])
    assert status_patch(p.status, again.status) is None and not again.events and not again.delete_pods
    resumed = plan(status=p.status, pods=[])
    assert len(resumed.create_pods) == 4 and [a.restarts for a in resumed.status.agent_progress] == [0, 0]
    assert cond(resumed, "Suspended").reason == "Resumed" and resumed.status.phase == "Pending"


def test_heartbeats_fill_agent_progress_and_step_is_the_slowest() -> None:
    progress = {
        "llama-char": {
            "agent": "llama-char",
            "step": 7,
            "steps": 12,
            "weights_version": 7,
            "reward": 0.5,
            "accuracy": 0.4,
            "capability": 0.6,
            "last_checkpoint": 4,
            "done": False,
            "time": 1.0,
        },
        "qwen-bpe": {
            "agent": "qwen-bpe",
            "step": 5,
            "steps": 12,
            "weights_version": 5,
            "reward": None,
            "accuracy": None,
            "capability": None,
            "last_checkpoint": None,
            "done": False,
            "time": 1.0,
        },
    }
    p = plan(status=running_status(), pods=all_pods(), progress=progress)
    llama = p.status.agent_progress[0]
    assert (
        llama.step,
        llama.weights_version,
        llama.reward,
        llama.accuracy,
        llama.capability,
        llama.last_checkpoint,
    ) == (7, 7, 0.5, 0.4, 0.6, 4)
    assert p.status.step == 5 and p.status.message == "step 5 of 12"
    # A store that does not answer keeps the last numbers and says why.
    later = plan(status=p.status, pods=all_pods(), store_error="cannot read progress: timeout")
    assert later.status.step == 5 and cond(later, "StoreReachable").reason == "StoreUnreachable"
    assert ("Warning", "StoreUnreachable") in [(e.type, e.reason) for e in later.events]


@pytest.mark.parametrize(
    ("policy", "deletes_pods", "deletes_store", "reason"),
    [
        ("keep", False, False, "Kept"),
        ("delete-pods", True, False, "PodsDeleted"),
        ("delete-store", True, True, "StoreDeleted"),
    ],
)
def test_completion_applies_the_on_success_policy(
    policy: str, deletes_pods: bool, deletes_store: bool, reason: str
) -> None:
    progress = {a: {"step": 12, "done": True} for a in AGENTS}
    p = plan(exp=experiment(cleanup={"onSuccess": policy}), status=running_status(), pods=all_pods(), progress=progress)
    assert p.status.phase == "Succeeded" and p.status.step == 12 and not p.create_pods
    assert bool(p.delete_pods) == deletes_pods and p.delete_store == deletes_store
    assert cond(p, "CleanedUp").reason == reason and cond(p, "Succeeded").status == "True"
    # Once applied, the store is not deleted again.
    again = plan(
        exp=experiment(cleanup={"onSuccess": policy}),
        status=p.status,
        pods=[] if deletes_pods else all_pods(),
        progress={},
    )
    assert not again.delete_store and again.status.phase == "Succeeded"
    assert status_patch(p.status, again.status) is None


def test_learner_pod_succeeded_completes_the_agent() -> None:
    pods = [pod(a, "learner", "Succeeded") for a in AGENTS] + [pod(a, "rollout", "Running") for a in AGENTS]
    p = plan(status=running_status(), pods=pods)
    assert p.status.phase == "Succeeded" and p.status.step == 12


def test_ttl_after_finished() -> None:
    done = running_status(phase="Succeeded", completionTime="2026-01-01T11:59:00Z")
    exp = experiment(cleanup={"ttlSecondsAfterFinished": 120})
    p = plan(exp=exp, status=done)
    assert not p.delete_experiment
    p = plan(exp=experiment(cleanup={"ttlSecondsAfterFinished": 30}), status=done)
    assert p.delete_experiment


def test_invalid_spec_fails_with_field_paths_and_recovers() -> None:
    p = plan_reconcile(
        Observed(
            experiment=None,
            spec_errors=["spec.algorithm.groupSize: Input should be greater than or equal to 2"],
            now=NOW,
        )
    )
    assert p.status.phase == "Failed" and not p.create_pods
    assert cond(p, "Failed").reason == "InvalidSpec" and "spec.algorithm.groupSize" in cond(p, "Failed").message
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "Failed")]
    fixed = plan(status=p.status)
    assert fixed.status.phase == "Pending" and len(fixed.create_pods) == 4 and not cond(fixed, "Failed")


def test_orphan_pods_of_removed_agents_are_deleted_once_they_stopped_running() -> None:
    """Issue 41: a removed agent's running worker leaves the team at its next step boundary (a
    step it is a member of cannot finish without it): kept till then, deleted once ended."""
    p = plan(status=running_status(), pods=all_pods() + [pod("gone", "learner"), pod("gone", "rollout", "Pending")])
    assert p.delete_pods == [pod_name("quickstart", "gone", "rollout")]
    p = plan(status=running_status(), pods=all_pods() + [pod("gone", "learner", "Succeeded")])
    assert p.delete_pods == [pod_name("quickstart", "gone", "learner")]


def test_a_suspended_agent_is_released_and_the_team_goes_on() -> None:
    """agents[].suspend: no pod created for it, its running pods left to leave the team by
    themselves, its ended ones deleted, no restart counted; the others finish the experiment."""
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["spec"]["algorithm"]["steps"] = 12
    document["spec"]["agents"][1]["suspend"] = True
    paused = parse_experiment(document)
    running = [pod("llama-char", "rollout"), pod("llama-char", "learner")]
    p = plan(paused, status=running_status(), pods=running + [pod("qwen-bpe", "rollout"), pod("qwen-bpe", "learner")])
    qwen = next(e for e in p.status.agent_progress if e.name == "qwen-bpe")
    assert qwen.suspended and qwen.learner_pod == "Leaving" and not p.delete_pods and not p.create_pods
    assert p.status.phase == "Running"
    ended = [pod("qwen-bpe", "rollout", "Succeeded"), pod("qwen-bpe", "learner", "Succeeded")]
    p = plan(paused, status=p.status, pods=running + ended)
    assert sorted(p.delete_pods) == sorted(pod_name("quickstart", "qwen-bpe", r) for r in ("rollout", "learner"))
    qwen = next(e for e in p.status.agent_progress if e.name == "qwen-bpe")
    assert qwen.restarts == 0 and qwen.learner_pod is None
    p = plan(paused, status=p.status, pods=running)
    assert not p.create_pods and p.status.phase == "Running"
    back = plan(status=p.status, pods=running)
    assert [(s.agent, s.role) for s in back.create_pods] == [("qwen-bpe", "rollout"), ("qwen-bpe", "learner")]
    assert not next(e for e in back.status.agent_progress if e.name == "qwen-bpe").suspended
    done = {"llama-char": {"step": 12, "steps": 12, "done": True}}
    assert plan(paused, status=p.status, pods=running, progress=done).status.phase == "Succeeded"


def test_last_transition_time_moves_only_with_the_status() -> None:
    old = running_status()
    pods = all_pods()[:3] + [pod("qwen-bpe", "learner", "Pending", waiting="ImagePullBackOff")]
    first = plan(status=old, pods=pods)
    assert cond(first, "Ready").last_transition_time == "2026-01-01T12:00:00Z"
    later = plan_reconcile(
        Observed(
            experiment=experiment(),
            status=first.status,
            pods=pods[:3] + [pod("qwen-bpe", "learner", "Pending", unschedulable=True)],
            now=NOW + dt.timedelta(minutes=5),
        )
    )
    assert cond(later, "Ready").reason == "Unschedulable"
    assert cond(later, "Ready").last_transition_time == "2026-01-01T12:00:00Z"


def test_status_patch_only_when_changed_and_removes_vanished_keys() -> None:
    assert status_patch({"phase": "Running", "kopf": {"x": 1}}, {"phase": "Running"}) is None
    assert status_patch({"phase": "Running", "completionTime": "t"}, {"phase": "Pending", "completionTime": None}) == {
        "phase": "Pending",
        "completionTime": None,
    }
    assert status_patch({}, {"agentProgress": [{"name": "a", "reward": None}]}) == {"agentProgress": [{"name": "a"}]}


def test_a_status_value_edited_by_hand_reads_as_unset() -> None:
    """A stored value that is not what the CRD declares does not fail every reconcile."""
    old = running_status(phase="Bogus", step="many")
    old["agentProgress"][0]["restarts"] = "two"
    p = plan(status=old, pods=all_pods())
    assert p.status.phase == "Running" and p.status.step == 0
    assert [a.restarts for a in p.status.agent_progress] == [0, 0]  # the list as a whole reads as unset
    assert cond(p, "Ready").last_transition_time == "2026-01-01T11:00:00Z"  # the conditions are kept


def data_heartbeat(skipped: int, rows: int = 100) -> dict[str, Any]:
    report = {
        "field": "data.train",
        "name": "train.jsonl",
        "rows": rows,
        "skipped": {"invalid_json": skipped} if skipped else {},
    }
    return {
        "step": 1,
        "data": [report, {"field": "data.eval[arithmetic]", "name": "builtin", "rows": 200, "skipped": {}}],
    }


def test_a_dataset_that_lost_many_rows_raises_a_condition_and_a_warning_event() -> None:
    progress = {"llama-char": data_heartbeat(skipped=25), "qwen-bpe": None}
    first = plan(status=running_status(), pods=all_pods(), progress=progress)
    condition = cond(first, "DataRowsSkipped")
    assert (condition.status, condition.reason) == ("True", "ManyRowsSkipped")
    assert "data.train (train.jsonl): 100 rows, 25 skipped (invalid_json 25): 20% of its rows" in condition.message
    assert "hacrl validate --data" in condition.message
    assert [(e.type, e.reason) for e in first.events if e.reason == "ManyRowsSkipped"] == [
        ("Warning", "ManyRowsSkipped")
    ]
    # Said once: the next reconcile with the same heartbeat posts no second event.
    again = plan(status=first.status, pods=all_pods(), progress=progress)
    assert cond(again, "DataRowsSkipped").reason == "ManyRowsSkipped"
    assert not [e for e in again.events if e.reason == "ManyRowsSkipped"]
    # While no heartbeat reports data (store briefly unreadable), the condition stays as it was.
    quiet = plan(status=first.status, pods=all_pods(), progress={})
    assert cond(quiet, "DataRowsSkipped").status == "True"


@pytest.mark.parametrize("skipped, reason", [(3, "FewRowsSkipped"), (0, "NoRowsSkipped")])
def test_a_few_skipped_rows_are_recorded_without_an_event(skipped: int, reason: str) -> None:
    p = plan(status=running_status(), pods=all_pods(), progress={"llama-char": data_heartbeat(skipped=skipped)})
    assert (cond(p, "DataRowsSkipped").status, cond(p, "DataRowsSkipped").reason) == ("False", reason)
    assert not [e for e in p.events if "Skipped" in e.reason]


# -- evictions and preemptions: recreated, never counted -----------------------------------------


def with_status(manifest: dict[str, Any], **status: Any) -> dict[str, Any]:
    manifest["status"].update(status)
    return manifest


LLAMA_LEARNER = pod_name("quickstart", "llama-char", "learner")


def others() -> list[dict[str, Any]]:
    return [p for p in all_pods() if p["metadata"]["name"] != LLAMA_LEARNER]


@pytest.mark.parametrize(
    "disrupted",
    [
        with_status(
            pod("llama-char", "learner", "Failed"), reason="Evicted", message="The node was low on resource: memory."
        ),
        with_status(
            pod("llama-char", "learner", "Failed"),
            reason="Preempting",
            message="Preempted in order to admit critical pod",
        ),
        with_status(
            pod("llama-char", "learner", "Failed", terminated={"exitCode": 137, "reason": "Error"}),
            conditions=[
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": "node shutdown",
                }
            ],
        ),
    ],
    ids=["evicted", "preempted-by-kubelet", "disruption-target"],
)
def test_an_evicted_or_preempted_pod_is_recreated_without_counting_a_restart(disrupted: dict) -> None:
    old = running_status()
    old["agentProgress"][0]["restarts"] = 3  # the limit is spent: a real failure would fail the experiment
    p = plan(status=old, pods=[disrupted] + others())
    assert (
        p.status.phase == "Running"
        and p.delete_pods == [LLAMA_LEARNER]
        and p.create_pods == [("llama-char", "learner", None)]
    )
    assert [a.restarts for a in p.status.agent_progress] == [3, 0] and p.status.agent_progress[
        0
    ].learner_pod == "Disrupted"
    assert [(e.type, e.reason) for e in p.events] == [("Normal", "PodDisrupted")]
    assert "not counted against restartLimit" in p.events[0].message
    # Gone the next time: created again, still not counted.
    again = plan(status=p.status, pods=others())
    assert again.create_pods == [("llama-char", "learner", None)] and [
        a.restarts for a in again.status.agent_progress
    ] == [3, 0]


@pytest.mark.parametrize(
    ("condition", "status", "reason"),
    [
        ("DisruptionTarget", "True", "PreemptionByScheduler"),  # Kubernetes: scheduler preemption, drains, taints
        ("TerminationTarget", "True", "WorkloadEvictedDueToPreempted"),  # Kueue
        ("Ready", "False", "Evict"),  # Volcano's preempt and reclaim
    ],
)
def test_a_pod_announced_for_disruption_is_recreated_uncounted_once_gone(
    condition: str, status: str, reason: str
) -> None:
    announced = with_status(
        pod("llama-char", "learner", terminating=True),
        conditions=[
            {"type": condition, "status": status, "reason": reason, "message": "preempted by a higher priority pod"}
        ],
    )
    p = plan(status=running_status(), pods=[announced] + others())
    assert not p.create_pods and p.status.agent_progress[0].learner_pod == "Disrupted"
    assert cond(p, "Ready").reason == "Restarting" and "preempted by a higher priority pod" in cond(p, "Ready").message
    gone = plan(status=p.status, pods=others())
    assert gone.create_pods == [("llama-char", "learner", None)] and [
        a.restarts for a in gone.status.agent_progress
    ] == [0, 0]
    assert not [e for e in gone.events if e.reason == "PodLost"]


def test_a_worker_stopped_on_sigterm_counts_a_preemption_not_a_restart() -> None:
    """Exit code 7 (``PREEMPTED_EXIT_CODE``: the worker checkpointed on SIGTERM) is a preemption,
    whatever the cluster said: recreated with the restart limit spent, counted once in
    ``preemptions``; an exit code 1 beside it stays a failure."""
    old = running_status()
    old["agentProgress"][0]["restarts"] = 3  # the limit is spent: a failure would fail the experiment
    stopped = pod("llama-char", "learner", "Failed", terminated={"exitCode": 7, "reason": "Error"})
    p = plan(status=old, pods=[stopped] + others())
    assert p.status.phase == "Running" and p.create_pods == [("llama-char", "learner", None)]
    assert [(a.restarts, a.preemptions) for a in p.status.agent_progress] == [(3, 1), (0, 0)]
    assert p.preemptions == 1 and "stopped on SIGTERM" in p.events[0].message
    again = plan(status=p.status, pods=others())  # gone, then recreated: not counted twice
    assert [(a.restarts, a.preemptions) for a in again.status.agent_progress] == [(3, 1), (0, 0)]
    failed = plan(
        status=running_status(),
        pods=[pod("llama-char", "learner", "Failed", terminated={"exitCode": 1, "reason": "Error"})] + others(),
    )
    assert [(a.restarts, a.preemptions) for a in failed.status.agent_progress] == [(1, 0), (0, 0)]


def test_a_pod_deleted_while_running_whose_worker_checkpointed_is_a_preemption() -> None:
    """`kubectl delete pod` or a drain without the Eviction API: terminating while its worker ends
    its step, then Failed with exit code 7 while a finalizer holds it, then gone."""
    deleting = plan(status=running_status(), pods=[pod("llama-char", "learner", terminating=True)] + others())
    assert deleting.status.agent_progress[0].learner_pod == "Terminating" and not deleting.create_pods
    ended = pod("llama-char", "learner", "Failed", terminated={"exitCode": 7}, terminating=True)
    p = plan(status=deleting.status, pods=[ended] + others())
    assert p.create_pods and [(a.restarts, a.preemptions) for a in p.status.agent_progress] == [(0, 1), (0, 0)]
    assert not [e for e in p.events if e.reason in ("PodLost", "PodFailed")]
    replaced = plan(status=p.status, pods=[pod("llama-char", "learner", "Pending")] + others())
    assert [(a.restarts, a.preemptions) for a in replaced.status.agent_progress] == [(0, 1), (0, 0)]


def test_an_evicted_pod_counts_one_preemption_as_announced_and_gone() -> None:
    announced = with_status(
        pod("llama-char", "learner", terminating=True),
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
    )
    p = plan(status=running_status(), pods=[announced] + others())
    again = plan(status=p.status, pods=[announced] + others())
    gone = plan(status=again.status, pods=others())
    assert [a.preemptions for a in gone.status.agent_progress] == [1, 0] and gone.status.agent_progress[0].restarts == 0


def test_a_pod_that_vanished_unannounced_still_counts() -> None:
    """Without a disruption reason or condition nothing tells an eviction from a deletion by hand."""
    p = plan(status=running_status(), pods=others())
    assert p.status.agent_progress[0].restarts == 1 and [e.reason for e in p.events if e.type == "Warning"] == [
        "PodLost"
    ]


# -- the pending timeout -------------------------------------------------------------------------


def unscheduled(agent: str, role: str, since: str | None, **condition: Any) -> dict[str, Any]:
    manifest = pod(agent, role, "Pending")
    manifest["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
    if since is not None:
        manifest["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastTransitionTime": since,
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                **condition,
            }
        ]
    return manifest


def test_a_pod_unscheduled_beyond_the_timeout_says_unschedulable_once() -> None:
    pods = all_pods()[:3] + [unscheduled("qwen-bpe", "learner", "2026-01-01T11:58:00Z")]
    waiting = plan(status=running_status(), pods=pods)  # 120 s of the default 600
    ready = cond(waiting, "Ready")
    assert (ready.status, ready.reason) == (
        "False",
        "PodsPending",
    ) and "waiting to be scheduled since 2026-01-01T11:58:00Z" in ready.message
    assert not [e for e in waiting.events if e.type == "Warning"]
    later = plan_reconcile(
        Observed(experiment=experiment(), status=waiting.status, pods=pods, now=NOW + dt.timedelta(seconds=481))
    )
    ready = cond(later, "Ready")
    assert (ready.status, ready.reason) == ("False", "Unschedulable")
    assert (
        "not scheduled since 2026-01-01T11:58:00Z, longer than spec.scheduling.pendingTimeoutSeconds 600"
        in ready.message
    )
    assert (
        "3 Insufficient nvidia.com/gpu" in ready.message
        and later.status.agent_progress[1].learner_pod == "Unschedulable"
    )
    assert [(e.type, e.reason) for e in later.events] == [("Warning", "Unschedulable")]
    again = plan_reconcile(
        Observed(experiment=experiment(), status=later.status, pods=pods, now=NOW + dt.timedelta(seconds=900))
    )
    assert cond(again, "Ready").reason == "Unschedulable" and not again.events  # one Warning, not one per reconcile
    assert status_patch(later.status, again.status) is None  # nor a status write per reconcile
    still = plan_reconcile(
        Observed(experiment=experiment(), status=waiting.status, pods=pods, now=NOW + dt.timedelta(seconds=60))
    )
    assert status_patch(waiting.status, still.status) is None  # waiting changes nothing either
    assert later.status.phase == "Running" and not later.create_pods and not later.delete_pods  # it keeps waiting


def test_pending_timeout_zero_reports_at_once_and_gangs_say_where_to_look() -> None:
    exp = experiment(scheduling={"gang": "kueue", "queueName": "team-a", "pendingTimeoutSeconds": 0})
    gated = unscheduled(
        "qwen-bpe",
        "learner",
        "2026-01-01T12:00:00Z",
        reason="SchedulingGated",
        message="Scheduling is blocked due to non-empty scheduling gates",
    )
    p = plan(exp=exp, status=running_status(), pods=all_pods()[:3] + [gated])
    ready = cond(p, "Ready")
    assert ready.reason == "Unschedulable" and "SchedulingGated" not in (ready.reason,)
    assert (
        "scheduling gates" in ready.message
        and "kubectl get workloads" in ready.message
        and "LocalQueue team-a" in ready.message
    )


def test_a_pod_no_scheduler_picks_up_times_out_from_its_creation() -> None:
    """schedulerName volcano without Volcano installed: no PodScheduled condition ever appears."""
    exp = experiment(scheduling={"gang": "volcano"})
    lost = unscheduled("qwen-bpe", "learner", None)
    lost["spec"] = {"schedulerName": "volcano"}
    p = plan(exp=exp, status=running_status(), pods=all_pods()[:3] + [lost])
    ready = cond(p, "Ready")
    assert ready.reason == "Unschedulable" and "not scheduled since 2026-01-01T11:00:00Z" in ready.message
    assert (
        "no scheduler has placed it yet (schedulerName volcano)" in ready.message
        and "kubectl describe podgroups" in ready.message
    )


def test_a_scheduled_pod_waiting_for_its_image_is_not_unschedulable() -> None:
    pulling = pod("qwen-bpe", "learner", "Pending", waiting="ImagePullBackOff")
    pulling["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
    assert cond(plan(status=running_status(), pods=all_pods()[:3] + [pulling]), "Ready").reason == "ImagePullBackOff"


def test_only_gang_volcano_ensures_a_pod_group() -> None:
    assert not plan().ensure_pod_group
    assert not plan(exp=experiment(scheduling={"gang": "kueue", "queueName": "q"})).ensure_pod_group
    assert plan(exp=experiment(scheduling={"gang": "volcano"})).ensure_pod_group
    assert not plan(
        exp=experiment(scheduling={"gang": "volcano"}, suspend=True), status=running_status()
    ).ensure_pod_group


# -- pods held by a finalizer (Kueue keeps its own on a pod of a group until it is replaced) ------


def held(manifest: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    manifest["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:00Z"
    manifest["metadata"]["finalizers"] = ["kueue.x-k8s.io/managed"]
    if name:
        manifest["metadata"]["name"] = name
    return manifest


def test_a_failed_pod_held_by_a_finalizer_is_replaced_under_the_other_name_uncounted() -> None:
    old = running_status()
    old["agentProgress"][0]["restarts"] = 1
    old["agentProgress"][0]["learnerPod"] = "Restarting"  # deleted by the operator after its failure, counted then
    p = plan(status=old, pods=others() + [held(pod("llama-char", "learner", "Failed"))])
    assert p.create_pods == [("llama-char", "learner", None)] and p.renamed == {LLAMA_LEARNER: LLAMA_LEARNER + "-r"}
    assert p.status.agent_progress[0].restarts == 1 and not p.delete_pods
    # The replacement runs while the old object is still held: it is the agent's pod; nothing more to do.
    replacement = pod("llama-char", "learner", "Running")
    replacement["metadata"]["name"] = LLAMA_LEARNER + "-r"
    settled = plan(status=p.status, pods=others() + [held(pod("llama-char", "learner", "Failed")), replacement])
    assert not settled.create_pods and not settled.delete_pods and cond(settled, "Ready").reason == "AllPodsRunning"
    # Its own replacement, later, takes the usual name again once that is free.
    assert build_name("llama-char", "learner", held_names=[LLAMA_LEARNER + "-r"]) == LLAMA_LEARNER


def build_name(agent: str, role: str, held_names: list[str]) -> str | None:
    pods = [held(pod(agent, role, "Failed"), name) for name in held_names]
    status = running_status()
    status["agentProgress"][AGENTS.index(agent)][f"{role}Pod"] = "Restarting"
    p = plan(
        status=status,
        pods=[x for x in all_pods() if x["metadata"]["name"] != pod_name("quickstart", agent, role)] + pods,
    )
    if (agent, role, None) not in p.create_pods:
        return None
    usual = pod_name("quickstart", agent, role)
    return p.renamed.get(usual, usual)


def test_while_both_names_are_held_the_replacement_waits() -> None:
    assert build_name("llama-char", "learner", held_names=[LLAMA_LEARNER, LLAMA_LEARNER + "-r"]) is None


def test_kueue_preempting_the_group_recreates_every_pod_uncounted() -> None:
    """Kueue stops a preempted group: TerminationTarget on each pod, then deletes them; its
    finalizer holds them until replacements exist, which wait for admission again."""
    stopped = [
        held(
            with_status(
                x,
                phase="Failed",
                conditions=[
                    {
                        "type": "TerminationTarget",
                        "status": "True",
                        "reason": "WorkloadEvictedDueToPreempted",
                        "message": "Preempted to accommodate a workload",
                    }
                ],
            )
        )
        for x in all_pods()
    ]
    p = plan(exp=experiment(scheduling={"gang": "kueue", "queueName": "team-a"}), status=running_status(), pods=stopped)
    assert sorted(p.create_pods) == sorted((a, r, None) for a in AGENTS for r in ("rollout", "learner"))
    assert sorted(p.renamed.values()) == sorted(
        pod_name("quickstart", a, r) + "-r" for a in AGENTS for r in ("rollout", "learner")
    )
    assert [a.restarts for a in p.status.agent_progress] == [0, 0] and not [
        e for e in p.events if e.reason == "PodLost"
    ]


def test_a_terminating_pod_whose_containers_still_run_is_waited_for() -> None:
    """A replacement never runs next to the pod it replaces."""
    p = plan(status=running_status(), pods=others() + [held(pod("llama-char", "learner", "Running"))])
    assert not p.create_pods and p.status.agent_progress[0].learner_pod == "Terminating"


# -- learners over several nodes (issue 15 item 1) ----------------------------------------------


def two_node_experiment():
    """The quickstart with llama-char's learner over 2 nodes."""
    exp = experiment()
    exp.spec.agents[0].learner.nodes = 2
    return exp


def node_pod(node: int, phase: str = "Running", **kw: Any) -> dict[str, Any]:
    manifest = pod("llama-char", "learner", phase, **kw)
    manifest["metadata"]["name"] = pod_name("quickstart", "llama-char", f"learner-{node}")
    manifest["metadata"]["labels"]["hacrl.io/node"] = str(node)
    return manifest


NODE_PODS = [pod_name("quickstart", "llama-char", f"learner-{node}") for node in (0, 1)]


def test_the_pods_of_a_learner_over_two_nodes_are_created_together_and_show_as_one_learner() -> None:
    p = plan(exp=two_node_experiment())
    assert sorted(p.create_pods) == sorted(
        (a, r, None) for a in AGENTS for r in ("rollout", "learner")
    )  # one slot: builders.pod_names expands it
    one_running = plan(
        exp=two_node_experiment(), status=p.status, pods=others() + [node_pod(0), node_pod(1, "Pending")]
    )
    assert not one_running.create_pods and one_running.status.agent_progress[0].learner_pod == "Pending"
    running = plan(exp=two_node_experiment(), status=one_running.status, pods=others() + [node_pod(0), node_pod(1)])
    assert running.status.phase == "Running" and running.status.agent_progress[0].learner_pod == "Running"
    assert cond(running, "Ready").reason == "AllPodsRunning" and not running.delete_pods


def test_one_failed_node_restarts_every_node_of_its_learner_counting_one_restart() -> None:
    exp = two_node_experiment()
    failed = node_pod(1, "Failed", terminated={"exitCode": 1, "reason": "Error"})
    p = plan(exp=exp, status=running_status(), pods=others() + [node_pod(0), failed])
    assert sorted(p.delete_pods) == sorted(NODE_PODS) and p.create_pods == [("llama-char", "learner", None)]
    assert [a.restarts for a in p.status.agent_progress] == [1, 0]
    (event,) = [e for e in p.events if e.reason == "PodFailed"]
    assert NODE_PODS[1] in event.message and "all 2 pods of the learner" in event.message
    # The healthy node still terminating: wait for it before creating any.
    waiting = plan(exp=exp, status=p.status, pods=others() + [node_pod(0, terminating=True)])
    assert not waiting.create_pods and [a.restarts for a in waiting.status.agent_progress] == [1, 0]
    gone = plan(exp=exp, status=waiting.status, pods=others())
    assert gone.create_pods == [("llama-char", "learner", None)] and [
        a.restarts for a in gone.status.agent_progress
    ] == [1, 0]


def test_a_node_pod_lost_restarts_the_learner_and_one_never_created_is_just_created() -> None:
    exp = two_node_experiment()
    lost = plan(exp=exp, status=running_status(), pods=others() + [node_pod(0)])
    assert lost.delete_pods == [NODE_PODS[0]] and lost.create_pods == [("llama-char", "learner", None)]
    assert [a.restarts for a in lost.status.agent_progress] == [1, 0] and [
        e.reason for e in lost.events if e.reason == "PodLost"
    ]
    status = running_status()
    status["agentProgress"][0]["learnerPod"] = "Restarting"  # being recreated: the other node's pod is on its way
    partial = plan(exp=exp, status=status, pods=others() + [node_pod(0, "Pending")])
    assert not partial.delete_pods and partial.create_pods == [("llama-char", "learner", None)]
    assert [a.restarts for a in partial.status.agent_progress] == [0, 0]


def test_node_pods_that_no_longer_fit_the_spec_are_orphans() -> None:
    """learner.nodes changed from 2 to 1: the node pods go, the one-node pod comes."""
    p = plan(status=running_status(), pods=others() + [node_pod(0), node_pod(1)])
    assert sorted(p.delete_pods) == sorted(NODE_PODS) and p.create_pods == [("llama-char", "learner", None)]


def test_a_held_node_pod_is_replaced_under_the_other_name() -> None:
    status = running_status()
    status["agentProgress"][0]["learnerPod"] = "Restarting"
    p = plan(exp=two_node_experiment(), status=status, pods=others() + [held(node_pod(1, "Failed"))])
    assert p.create_pods == [("llama-char", "learner", None)] and p.renamed == {NODE_PODS[1]: NODE_PODS[1] + "-r"}


# -- rollouts with several replicas (issue 15 item 2) --------------------------------------------


def two_replica_experiment(replicas: int = 2, **spec_changes: Any):
    """The quickstart with llama-char's rollout in ``replicas`` replicas."""
    exp = experiment(**spec_changes)
    exp.spec.agents[0].rollout.replicas = replicas
    return exp


REPLICA_PODS = [pod_name("quickstart", "llama-char", f"rollout-{replica}") for replica in range(3)]
LLAMA_ROLLOUT = pod_name("quickstart", "llama-char", "rollout")


def replica_pod(replica: int, phase: str = "Running", **kw: Any) -> dict[str, Any]:
    manifest = pod("llama-char", "rollout", phase, **kw)
    manifest["metadata"]["name"] = REPLICA_PODS[replica]
    manifest["metadata"]["labels"]["hacrl.io/replica"] = str(replica)
    return manifest


def but_the_rollout() -> list[dict[str, Any]]:
    """Every pod of the quickstart but llama-char's (one) rollout pod."""
    return [p for p in all_pods() if p["metadata"]["name"] != LLAMA_ROLLOUT]


def replicas_running(restarts: int = 0) -> dict[str, Any]:
    status = running_status()
    status["agentProgress"][0].update(rolloutPod="Running, Running", restarts=restarts)
    return status


def restarts(p) -> list[int]:
    return [a.restarts for a in p.status.agent_progress]


def test_each_replica_of_a_rollout_is_created_and_its_state_recorded_in_replica_order() -> None:
    exp = two_replica_experiment()
    p = plan(exp=exp)
    assert sorted(p.create_pods) == sorted(
        [
            ("llama-char", "rollout", 0),
            ("llama-char", "rollout", 1),
            ("llama-char", "learner", None),
            ("qwen-bpe", "rollout", None),
            ("qwen-bpe", "learner", None),
        ]
    )
    assert (
        p.status.agent_progress[0].rollout_pod == "Pending, Pending"
        and p.status.agent_progress[1].rollout_pod == "Pending"
    )
    one_pending = plan(exp=exp, status=p.status, pods=but_the_rollout() + [replica_pod(0), replica_pod(1, "Pending")])
    assert not one_pending.create_pods and one_pending.status.agent_progress[0].rollout_pod == "Running, Pending"
    assert (
        cond(one_pending, "Ready").reason == "PodsPending"
        and f"replica 1 pod {REPLICA_PODS[1]}" in cond(one_pending, "Ready").message
    )
    running = plan(exp=exp, status=one_pending.status, pods=but_the_rollout() + [replica_pod(0), replica_pod(1)])
    assert running.status.phase == "Running" and cond(running, "Ready").reason == "AllPodsRunning"
    assert (
        running.status.agent_progress[0].rollout_pod == "Running, Running"
        and not running.create_pods
        and not running.delete_pods
    )


def test_a_failed_replica_is_replaced_alone_counting_one_restart() -> None:
    exp = two_replica_experiment()
    failed = replica_pod(1, "Failed", terminated={"exitCode": 1, "reason": "Error"})
    p = plan(exp=exp, status=replicas_running(), pods=but_the_rollout() + [replica_pod(0), failed])
    assert (
        p.delete_pods == [REPLICA_PODS[1]] and p.create_pods == [("llama-char", "rollout", 1)] and restarts(p) == [1, 0]
    )
    assert p.status.agent_progress[0].rollout_pod == "Running, Restarting" and p.status.phase == "Running"
    (event,) = [e for e in p.events if e.reason == "PodFailed"]
    assert (
        f"agent llama-char rollout replica 1 pod {REPLICA_PODS[1]} failed" in event.message
        and "recreating it," in event.message
    )
    gone = plan(exp=exp, status=p.status, pods=but_the_rollout() + [replica_pod(0)])  # created again, not counted again
    assert gone.create_pods == [("llama-char", "rollout", 1)] and restarts(gone) == [1, 0] and not gone.delete_pods
    assert gone.status.agent_progress[0].rollout_pod == "Running, Restarting" and not [
        e for e in gone.events if e.reason == "PodLost"
    ]


def test_a_lost_replica_counts_a_restart_and_an_evicted_one_none() -> None:
    exp = two_replica_experiment()
    lost = plan(exp=exp, status=replicas_running(), pods=but_the_rollout() + [replica_pod(0)])
    assert not lost.delete_pods and lost.create_pods == [("llama-char", "rollout", 1)] and restarts(lost) == [1, 0]
    (event,) = [e for e in lost.events if e.reason == "PodLost"]
    assert "agent llama-char rollout replica 1 pod disappeared (was Running)" in event.message

    evicted = with_status(replica_pod(0, "Failed"), reason="Evicted", message="The node was low on resource: memory.")
    p = plan(
        exp=exp, status=replicas_running(restarts=3), pods=but_the_rollout() + [evicted, replica_pod(1)]
    )  # the limit is spent
    assert (
        p.delete_pods == [REPLICA_PODS[0]] and p.create_pods == [("llama-char", "rollout", 0)] and restarts(p) == [3, 0]
    )
    assert p.status.agent_progress[0].rollout_pod == "Disrupted, Running" and [e.reason for e in p.events] == [
        "PodDisrupted"
    ]
    gone = plan(exp=exp, status=p.status, pods=but_the_rollout() + [replica_pod(1)])
    assert (
        gone.create_pods == [("llama-char", "rollout", 0)]
        and restarts(gone) == [3, 0]
        and gone.status.phase == "Running"
    )


def test_replicas_failing_together_each_count_against_the_restart_limit() -> None:
    exp = two_replica_experiment(restartLimit=2)
    failed = [replica_pod(r, "Failed", terminated={"exitCode": 1, "reason": "Error"}) for r in (0, 1)]
    p = plan(exp=exp, status=replicas_running(restarts=1), pods=but_the_rollout() + failed)
    assert p.status.phase == "Failed" and not p.create_pods and not p.delete_pods
    assert (
        cond(p, "Failed").reason == "RestartLimitExceeded"
        and f"replica 1 pod {REPLICA_PODS[1]} failed" in cond(p, "Failed").message
    )
    assert p.status.agent_progress[0].rollout_pod == "Failed, Failed"


def test_a_replica_unscheduled_past_the_pending_timeout_is_unschedulable() -> None:
    p = plan(
        exp=two_replica_experiment(),
        status=replicas_running(),
        pods=but_the_rollout() + [replica_pod(0), replica_pod(1, "Pending", unschedulable=True)],
    )
    ready = cond(p, "Ready")
    assert ready.reason == "Unschedulable" and f"replica 1 pod {REPLICA_PODS[1]} not scheduled since" in ready.message
    assert (
        "pendingTimeoutSeconds 600" in ready.message
        and p.status.agent_progress[0].rollout_pod == "Running, Unschedulable"
    )
    assert not p.create_pods and not p.delete_pods


@pytest.mark.parametrize(
    ("before", "after", "pods", "deleted", "created"),
    [
        (2, 1, [replica_pod(0), replica_pod(1)], REPLICA_PODS[:2], [("llama-char", "rollout", None)]),
        (
            1,
            2,
            [pod("llama-char", "rollout")],
            [LLAMA_ROLLOUT],
            [("llama-char", "rollout", 0), ("llama-char", "rollout", 1)],
        ),
        (2, 3, [replica_pod(0), replica_pod(1)], [], [("llama-char", "rollout", 2)]),
        (3, 2, [replica_pod(0), replica_pod(1), replica_pod(2)], [REPLICA_PODS[2]], []),
    ],
    ids=["2-to-1", "1-to-2", "2-to-3", "3-to-2"],
)
def test_a_changed_replica_count_deletes_the_pods_that_no_longer_fit_and_creates_the_new_ones_uncounted(
    before: int, after: int, pods: list[dict[str, Any]], deleted: list[str], created: list[tuple[str, str, int | None]]
) -> None:
    """What a spec whose rollout.replicas changed gets where the CRD's rule (fixed once started)
    does not run: a cluster without CEL, or a change before the pods were first created."""
    status = running_status()
    status["agentProgress"][0]["rolloutPod"] = ", ".join(["Running"] * before)
    p = plan(exp=two_replica_experiment(after), status=status, pods=but_the_rollout() + pods)
    assert (
        sorted(p.delete_pods) == sorted(deleted) and sorted(p.create_pods) == sorted(created) and restarts(p) == [0, 0]
    )
    assert not [e for e in p.events if e.reason in ("PodLost", "PodFailed")]


def test_a_held_replica_pod_is_replaced_under_the_other_name_and_suspend_deletes_every_replica() -> None:
    exp = two_replica_experiment()
    status = replicas_running()
    status["agentProgress"][0]["rolloutPod"] = "Running, Restarting"
    p = plan(exp=exp, status=status, pods=but_the_rollout() + [replica_pod(0), held(replica_pod(1, "Failed"))])
    assert p.create_pods == [("llama-char", "rollout", 1)] and p.renamed == {REPLICA_PODS[1]: REPLICA_PODS[1] + "-r"}

    suspended = plan(
        exp=two_replica_experiment(suspend=True),
        status=replicas_running(),
        pods=but_the_rollout() + [replica_pod(0), replica_pod(1)],
    )
    assert set(REPLICA_PODS[:2]) <= set(suspended.delete_pods) and len(suspended.delete_pods) == 5
    assert suspended.status.agent_progress[0].rollout_pod is None
    resumed = plan(exp=exp, status=suspended.status)
    assert len(resumed.create_pods) == 5 and restarts(resumed) == [0, 0]


def test_a_replica_whose_pod_could_not_be_created_is_recorded_alone_and_tried_again_uncounted() -> None:
    """The reconcile records what creating each pod did (``Plan.set_pod_state`` of one replica)."""
    exp = two_replica_experiment()
    p = plan(exp=exp)
    p.set_pod_state("llama-char", "rollout", "CreateFailed", 1)
    assert p.status.agent_progress[0].rollout_pod == "Pending, CreateFailed"
    again = plan(exp=exp, status=p.status, pods=but_the_rollout() + [replica_pod(0)])
    assert again.create_pods == [("llama-char", "rollout", 1)] and restarts(again) == [0, 0]
    assert (
        again.status.agent_progress[0].rollout_pod == "Running, Pending"
        and cond(again, "Ready").reason == "PodsPending"
    )


@pytest.mark.parametrize(
    ("exp", "pods"),
    [
        (experiment(), others() + [node_pod(0), node_pod(1)]),  # learner.nodes 2 -> 1
        (two_node_experiment(), all_pods()),  # learner.nodes 1 -> 2
    ],
    ids=["nodes-2-to-1", "nodes-1-to-2"],
)
def test_a_changed_node_count_creates_the_new_learner_pods_without_counting_a_restart(
    exp, pods: list[dict[str, Any]]
) -> None:
    """Regression: the learner's pods of the old count were orphans and the new set, missing while
    the learner's last state said Running, counted as lost (a PodLost restart; with restartLimit 0
    the experiment failed)."""
    p = plan(exp=exp, status=running_status(), pods=pods)
    assert p.create_pods == [("llama-char", "learner", None)] and p.delete_pods and restarts(p) == [0, 0]
    assert not [e for e in p.events if e.reason in ("PodLost", "PodFailed")] and p.status.phase == "Running"


@pytest.mark.parametrize("text", ["a" * 40, "ü" * 40, "a" + "€" * 40, "🙂" * 40])
def test_cut_keeps_utf8_whole_and_within_the_limit_in_bytes(text: str) -> None:
    for limit in range(4, 40):
        short = cut(text, limit)
        assert len(short.encode("utf-8")) <= limit and short.endswith("…")
        assert (
            text.startswith(short[:-1]) and len(short.encode("utf-8")) > limit - 4 - 3
        )  # no more cut than one character
    assert cut(text, len(text.encode("utf-8"))) == text


# -- folding what the reconcile's actions did into the plan (status/outcome.py) -------------------


def snapshot(p) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
    """What a fold may change: the status, the events and the conditions as set."""
    return p.status.model_dump(), list(p.events), {k: c.model_dump() for k, c in p.conditions.new.items()}


def test_folding_an_outcome_leaves_the_plan_as_it_was() -> None:
    p = plan(status=running_status(), pods=all_pods())
    before = snapshot(p)
    outcome = ActionOutcome(pod_states=(PodStateChange("qwen-bpe", "learner", "CreateFailed"),)) + failure(
        "Ready", "PodCreateFailed", "quota"
    )
    folded = fold_outcome(p, outcome)
    assert snapshot(p) == before and folded is not p
    assert (
        folded.status.agent_progress[1].learner_pod == "CreateFailed"
        and cond(folded, "Ready").reason == "PodCreateFailed"
    )
    assert snapshot(fold_outcome(p, ActionOutcome())) == before  # nothing done: the plan's status is written as planned


def test_a_failed_action_sets_its_condition_and_its_warning_follows_the_plans_events() -> None:
    p = plan()  # first reconcile: Pending, PodsPending
    outcome = said("Normal", "ConfigMapCreated", "cm") + failure(
        "Ready", "PodCreateFailed", "cannot create pod x: quota"
    )
    outcome += said("Normal", "PodsCreated", "created 3 pods")
    folded = fold_outcome(p, outcome)
    ready = cond(folded, "Ready")
    assert (ready.status, ready.reason, ready.message) == ("False", "PodCreateFailed", "cannot create pod x: quota")
    assert ready.last_transition_time == "2026-01-01T12:00:00Z"
    assert folded.events[: len(p.events)] == p.events
    assert [(e.type, e.reason) for e in folded.events[len(p.events) :]] == [
        ("Normal", "ConfigMapCreated"),
        ("Warning", "PodCreateFailed"),
        ("Normal", "PodsCreated"),
    ]
    assert [c.type for c in folded.status.conditions] == [c.type for c in p.status.conditions]  # set again, not added


def test_a_warning_left_out_still_sets_the_condition() -> None:
    folded = fold_outcome(plan(), failure("Ready", "PodGroupCreateFailed", "no Volcano", warn=False))
    assert cond(folded, "Ready").reason == "PodGroupCreateFailed" and "PodGroupCreateFailed" not in [
        e.reason for e in folded.events
    ]


def test_pod_states_are_folded_in_the_order_the_actions_happened() -> None:
    """A learner over two nodes whose node 0 was created and node 1 refused: Pending, then
    CreateFailed; one replica of a rollout: that replica alone."""
    exp = two_replica_experiment()
    outcome = ActionOutcome(created=("a",), pod_states=(PodStateChange("qwen-bpe", "learner", "Pending"),))
    outcome += ActionOutcome(pod_states=(PodStateChange("qwen-bpe", "learner", "CreateFailed"),))
    outcome += ActionOutcome(pod_states=(PodStateChange("llama-char", "rollout", "CreateFailed", 1),))
    folded = fold_outcome(plan(exp=exp), outcome)
    assert folded.status.agent_progress[1].learner_pod == "CreateFailed"
    assert folded.status.agent_progress[0].rollout_pod == "Pending, CreateFailed"
    reversed_order = ActionOutcome(pod_states=outcome.pod_states[1::-1])
    assert fold_outcome(plan(exp=exp), reversed_order).status.agent_progress[1].learner_pod == "Pending"


def test_outcomes_add_up_field_by_field_in_order() -> None:
    first = ActionOutcome(created=("a",), deleted=("x",), events=(Event("Normal", "A", ""),))
    second = ActionOutcome(
        created=("b",), conditions=(ConditionChange("Ready", False, "R"),), events=(Event("Normal", "B", ""),)
    )
    total = first + second
    assert total.created == ("a", "b") and total.deleted == ("x",) and [e.reason for e in total.events] == ["A", "B"]
    assert total.conditions == (ConditionChange("Ready", False, "R", ""),) and first.created == ("a",)
