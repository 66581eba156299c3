"""The chart runs a leader and a standby (leaderElection, replicas): the operator's settings as
rendered, the strategy that lets them overlap, and the value combinations refused with the value
to change. The election itself: tests/operator/test_operator_leader_election.py."""

from __future__ import annotations

import pytest

from hacrl_operator.config import OperatorConfig
from tests.chart.rendering import NAMESPACE, one, render, run_helm, template_args


def operator_env(docs) -> dict[str, dict]:
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def test_two_replicas_elect_a_leader_on_a_lease_named_like_the_release():
    docs = render()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # A new pod starts as a standby before an old one stops: never zero replicas in an upgrade.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    env = operator_env(docs)
    assert env["HACRL_LEADER_ELECTION_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    literal = {name: e["value"] for name, e in env.items() if "value" in e}
    config = OperatorConfig.from_env({**literal, "HACRL_LEADER_ELECTION_IDENTITY": "pod-0"})
    assert config.leader_lease == (NAMESPACE, deployment["metadata"]["name"])
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (15, 10.0, 2.0)
    # The standby is spread from the leader's node, so one drain does not take both.
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= deployment["spec"]["selector"][
        "matchLabels"
    ].items() | {("app.kubernetes.io/component", "operator")}


def test_timing_values_reach_the_operator():
    docs = render(
        sets=("leaderElection.leaseDuration=30", "leaderElection.renewDeadline=20", "leaderElection.retryPeriod=0.5")
    )
    literal = {name: e["value"] for name, e in operator_env(docs).items() if "value" in e}
    config = OperatorConfig.from_env(literal)
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (30, 20.0, 0.5)


def test_without_leader_election_one_replica_is_recreated():
    docs = render(sets=("leaderElection.enabled=false", "replicas=1"))
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not [name for name in operator_env(docs) if name.startswith("HACRL_LEADER_ELECTION")]
    assert "affinity" not in deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("leaderElection.enabled=false",), "replicas=2 needs leaderElection.enabled=true"),
        (
            ("leaderElection.renewDeadline=15",),
            "leaderElection.renewDeadline (15) must be less than leaderElection.leaseDuration (15)",
        ),
        (
            ("leaderElection.retryPeriod=9",),
            "leaderElection.retryPeriod (9) must be under leaderElection.renewDeadline / 1.2",
        ),
    ],
)
def test_unsafe_combinations_are_refused_naming_the_value(sets, message):
    result = run_helm(*template_args(sets=sets), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-500:]


def test_a_drain_evicts_one_replica_at_a_time():
    docs = render()
    budget = one(docs, "PodDisruptionBudget")
    deployment = one(docs, "Deployment")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # One replica: a budget would block every drain.
    assert not [d for d in render(sets=("replicas=1",)) if d["kind"] == "PodDisruptionBudget"]
    assert not [
        d for d in render(sets=("leaderElection.enabled=false", "replicas=1")) if d["kind"] == "PodDisruptionBudget"
    ]
