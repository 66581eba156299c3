"""The team of a running experiment changes (issue 41): an agent added by patching spec.agents gets
its pods, a suspended one is released once its workers left the team (never counted a restart)
and comes back, a removed one's running pods end by themselves; the others' pods are untouched
and the experiment completes. The workers' side (each step's members recorded in the store) is
tests/runtime/test_runtime_team_changes.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from harness import EmulatedCluster, OperatorHandle, wait_for
from test_operator_integration import (
    NS,
    agent,
    apply,
    heartbeat,
    pods_of,
    quickstart,
    run_all_pods,
    start_running,
    status_of,
    store_uri,
    worker_store,
)

from hacrl_operator.builders import pod_name

STEPS = 30


def with_agents(document: dict[str, Any], agents: list[dict[str, Any]]) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    changed["spec"]["agents"] = agents
    return changed


def names(cluster: EmulatedCluster) -> set[str]:
    return set(pods_of(cluster))


def test_agents_join_pause_come_back_and_leave_a_running_experiment(
    cluster: EmulatedCluster, op: OperatorHandle, tmp_path: Path
) -> None:
    uri = store_uri(tmp_path)
    document = quickstart(store={"uri": uri})
    document["spec"]["algorithm"]["steps"] = STEPS
    start_running(cluster, document)
    original = names(cluster)
    llama, qwen = document["spec"]["agents"]
    third = {**copy.deepcopy(llama), "name": "third"}
    third_pods = {pod_name("quickstart", "third", role) for role in ("rollout", "learner")}

    # Join: the newcomer's pods are created, the others' left as they are.
    joined = with_agents(document, [llama, qwen, third])
    apply(cluster, joined)
    wait_for(lambda: names(cluster) == original | third_pods, what="the newcomer's pods")
    run_all_pods(cluster)
    status = wait_for(
        lambda: (
            status_of(cluster).get("agents") == 3
            and status_of(cluster).get("phase") == "Running"
            and status_of(cluster)
        ),
        what="a team of 3 running",
    )
    assert "third" in cluster.get("configmap", "quickstart-spec", NS)["data"]["spec.yaml"]

    # Pause: running workers leave at their next step boundary (pods kept till then), then are released.
    apply(cluster, with_agents(document, [llama, qwen, {**third, "suspend": True}]))
    status = wait_for(
        lambda: agent(status_of(cluster), "third").get("suspended") and status_of(cluster), what="suspended"
    )
    assert agent(status, "third")["learnerPod"] == "Leaving" and names(cluster) == original | third_pods
    for name in third_pods:
        cluster.set_pod_phase(name, NS, "Succeeded")  # the workers left the team
    wait_for(lambda: names(cluster) == original, what="the suspended agent's pods released")
    status = status_of(cluster)
    assert status["phase"] == "Running" and agent(status, "third")["restarts"] == 0
    assert agent(status, "third").get("learnerPod") is None

    # Back: its pods are created again, no restart counted.
    apply(cluster, joined)
    wait_for(lambda: names(cluster) == original | third_pods, what="the agent back")
    run_all_pods(cluster)
    status = wait_for(
        lambda: not agent(status_of(cluster), "third").get("suspended") and status_of(cluster), what="back"
    )
    assert agent(status, "third")["restarts"] == 0

    # Leave: the removed agent's running pods are not killed mid-step; once ended, they are deleted.
    qwen_pods = {pod_name("quickstart", "qwen-bpe", role) for role in ("rollout", "learner")}
    apply(cluster, with_agents(document, [llama, third]))
    wait_for(lambda: status_of(cluster).get("agents") == 2, what="a team of 2")
    op.wait_for_reconciles(3)
    assert qwen_pods <= names(cluster)
    for name in qwen_pods:
        cluster.set_pod_phase(name, NS, "Succeeded")
    wait_for(lambda: not qwen_pods & names(cluster), what="the removed agent's pods deleted")

    store = worker_store(cluster, uri)
    for name in ("llama-char", "third"):
        store.write_progress(name, heartbeat(name, STEPS, STEPS))
    status = wait_for(lambda: status_of(cluster).get("phase") == "Succeeded" and status_of(cluster), what="Succeeded")
    assert [a["name"] for a in status["agentProgress"]] == ["llama-char", "third"]
