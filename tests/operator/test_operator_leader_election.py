"""Leader election (hacrl_operator/leader.py) against the emulator: the Lease protocol, then two
real operator processes (`python -m hacrl_operator`) of which only the leader acts, the leader
killed mid-run and the standby taking over without duplicate pods or lost status.

Each operator process gets a kubeconfig with its own bearer token, so the emulator tells their
writes apart (``writes_by_token``); nothing else distinguishes them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness import REPO, EmulatedCluster, free_port, measure, rbac_problems, wait_for
from test_operator_integration import (
    NS,
    agent,
    apply,
    create_namespace,
    event_reasons,
    pods_of,
    quickstart,
    run_all_pods,
    status_of,
)

from hacrl_operator.builders import pod_name
from hacrl_operator.config import OperatorConfig
from hacrl_operator.kube import load_configuration
from hacrl_operator.leader import LeaderElector, LeaseClient, LeaseConflict, Timing

LEASE_NS, LEASE = "hacrl-system", "hacrl-operator"
# Short enough for a test, long enough that a loaded 2-CPU machine renews in time (8 tries).
TIMING = Timing(lease_duration=6, renew_deadline=4.0, retry_period=0.5)


def lease_of(cluster: EmulatedCluster) -> dict[str, Any]:
    return (cluster.get("lease", LEASE, LEASE_NS) or {}).get("spec") or {}


def elector(cluster: EmulatedCluster, identity: str, timing: Timing = TIMING) -> LeaderElector:
    configuration = load_configuration(OperatorConfig(kubeconfig=str(cluster.kubeconfig)))
    return LeaderElector(
        LeaseClient(configuration, LEASE_NS, LEASE, timeout=timing.renew_deadline / 2), identity, timing
    )


# -- the protocol ---------------------------------------------------------------------------------


def test_a_held_lease_is_taken_only_after_its_duration_and_counts_a_transition(cluster: EmulatedCluster) -> None:
    first, second = elector(cluster, "first"), elector(cluster, "second")
    assert first.try_acquire_or_renew()
    assert lease_of(cluster)["holderIdentity"] == "first" and lease_of(cluster)["leaseDurationSeconds"] == 6
    assert not second.try_acquire_or_renew() and second.holder == "first"
    assert first.try_acquire_or_renew(), "the holder renews its own lease"
    renewed = time.monotonic()
    # The first stops renewing (as if it died): the second may take over only lease_duration after
    # it last saw the record change, on its own clock.
    taken = wait_for(
        lambda: second.try_acquire_or_renew() and time.monotonic(), timeout=15, interval=0.2, what="second takes over"
    )
    assert taken - renewed >= TIMING.lease_duration
    spec = lease_of(cluster)
    assert spec["holderIdentity"] == "second" and spec["leaseTransitions"] == 1
    assert not first.try_acquire_or_renew(), "the old leader must not take it back while the new one renews"


def test_of_two_writes_from_the_same_version_only_one_succeeds(cluster: EmulatedCluster) -> None:
    """The conditional update that keeps two standbys from both taking an expired Lease."""
    client = elector(cluster, "x").client
    created = client.create({"holderIdentity": "old", "leaseDurationSeconds": 6})
    version = created["metadata"]["resourceVersion"]
    client.update(version, {"holderIdentity": "a"})
    with pytest.raises(LeaseConflict):
        client.update(version, {"holderIdentity": "b"})
    assert lease_of(cluster)["holderIdentity"] == "a"
    with pytest.raises(LeaseConflict):
        client.create({"holderIdentity": "c"})


def test_a_leader_whose_lease_is_taken_stops(cluster: EmulatedCluster) -> None:
    leader = elector(cluster, "leader")
    leader.acquire()
    lost: list[str] = []
    leader.keep_renewing(lost.append)
    try:
        wait_for(lambda: lease_of(cluster)["renewTime"] != lease_of(cluster)["acquireTime"], what="a renewal")
        assert not lost
        cluster.kubectl(
            "patch",
            "lease",
            LEASE,
            "-n",
            LEASE_NS,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"holderIdentity": "intruder"}}),
        )
        wait_for(lambda: lost, timeout=5, what="the leader notices")
        assert lost == [f"lease {LEASE_NS}/{LEASE} taken by intruder"]
    finally:
        leader.stop()


def test_a_leader_that_cannot_reach_the_api_stops_within_its_renew_deadline(cluster: EmulatedCluster) -> None:
    leader = elector(cluster, "leader")
    leader.acquire()
    lost: list[tuple[float, str]] = []
    leader.keep_renewing(lambda reason: lost.append((time.monotonic(), reason)))
    try:
        leader.client.api.configuration.host = (
            f"http://127.0.0.1:{free_port()}"  # the API server is gone: connection refused
        )
        stopped = time.monotonic()
        wait_for(lambda: lost, timeout=TIMING.renew_deadline + 3, what="the leader gives up")
        ((at, reason),) = lost
        assert reason == f"lease {LEASE_NS}/{LEASE} not renewed for 4s"
        assert at - stopped <= TIMING.renew_deadline + 0.5 < TIMING.lease_duration
    finally:
        leader.stop()


def test_a_released_lease_is_taken_at_the_next_try(cluster: EmulatedCluster) -> None:
    leader, standby = elector(cluster, "leader"), elector(cluster, "standby")
    leader.acquire()
    assert not standby.try_acquire_or_renew()
    leader.release()
    assert "holderIdentity" not in lease_of(cluster)
    assert standby.try_acquire_or_renew(), "no waiting for lease_duration after a release"
    assert lease_of(cluster)["holderIdentity"] == "standby"


# -- two operator processes -----------------------------------------------------------------------


class OperatorProcess:
    """`python -m hacrl_operator` as the chart runs it, with its own token and ports."""

    def __init__(self, cluster: EmulatedCluster, identity: str, workdir: Path) -> None:
        self.identity = identity
        self.health_port, self.metrics_port = free_port(), free_port()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
            "KUBECONFIG": str(cluster.kubeconfig_for(identity)),
            "HACRL_WATCH_NAMESPACES": NS,
            "HACRL_RECONCILE_INTERVAL": "0.3",
            "HACRL_OPERATOR_METRICS_PORT": str(self.metrics_port),
            "HACRL_OPERATOR_HEALTH_PORT": str(self.health_port),
            "HACRL_ROLLOUT_IMAGE": "registry.test/hacrl-rollout:test",
            "HACRL_LEARNER_IMAGE": "registry.test/hacrl-learner:test",
            "HACRL_LEADER_ELECTION_LEASE": f"{LEASE_NS}/{LEASE}",
            "HACRL_LEADER_ELECTION_IDENTITY": identity,
            "HACRL_LEADER_ELECTION_LEASE_DURATION": str(TIMING.lease_duration),
            "HACRL_LEADER_ELECTION_RENEW_DEADLINE": str(TIMING.renew_deadline),
            "HACRL_LEADER_ELECTION_RETRY_PERIOD": str(TIMING.retry_period),
        }
        self.log = workdir / f"operator-{identity}.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hacrl_operator"],
            cwd=workdir,
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def healthz(self) -> dict[str, Any] | None:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as response:
                return json.loads(response.read() or b"{}") if response.status == 200 else None
        except (OSError, ValueError):
            return None

    def leader_gauge(self) -> str | None:
        """The value of ``hacrl_operator_leader`` on its metrics port (None while nothing answers)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=1) as response:
                text = response.read().decode()
        except OSError:
            return None
        return next((line.split()[1] for line in text.splitlines() if line.startswith("hacrl_operator_leader ")), None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def writes(cluster: EmulatedCluster, token: str, *, besides_lease: bool = True) -> list[tuple[str, str]]:
    assert cluster.emulator is not None
    return [
        (m, p)
        for m, p in list(cluster.emulator.writes_by_token.get(token, ()))
        if not (besides_lease and "/leases" in p)
    ]


def test_two_operators_only_the_leader_acts_and_the_standby_takes_over_when_it_is_killed(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    create_namespace(cluster)
    first = OperatorProcess(cluster, "op-a", tmp_path)
    processes = [first]
    try:
        wait_for(
            lambda: lease_of(cluster).get("holderIdentity") == "op-a" and "hacrl operator started" in first.output(),
            timeout=60,
            what=f"op-a leads and runs kopf; its log:\n{first.output()[-2000:]}",
        )
        second = OperatorProcess(cluster, "op-b", tmp_path)
        processes.append(second)
        # The standby answers its probes while it waits (else its liveness probe would restart it).
        assert wait_for(second.healthz, timeout=60, what="the standby's /healthz") == {
            "leader": False,
            "holder": "op-a",
        }
        assert wait_for(first.leader_gauge, what="the leader's metrics") == "1.0"
        assert wait_for(second.leader_gauge, what="the standby's metrics") == "0.0"

        apply(cluster, quickstart(restartLimit=5))
        pods = wait_for(lambda: len(pods_of(cluster)) == 4 and pods_of(cluster), what="4 pods")
        run_all_pods(cluster)
        wait_for(lambda: status_of(cluster).get("phase") == "Running", what="phase Running")
        failing = pod_name("quickstart", "llama-char", "learner")
        cluster.set_pod_phase(failing, NS, "Failed")
        wait_for(
            lambda: agent(status_of(cluster), "llama-char").get("restarts") == 1, what="op-a restarts the failed pod"
        )
        assert writes(cluster, "op-a"), "the leader acted"
        assert writes(cluster, "op-b") == [], "the standby wrote something other than its Lease"
        assert "hacrl operator started" not in second.output()

        # The leader dies mid-run (SIGKILL: no release, the Lease must expire).
        first.stop(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: lease_of(cluster).get("holderIdentity") == "op-b",
            timeout=TIMING.lease_duration + 10,
            what=f"op-b takes over; its log:\n{second.output()[-2000:]}",
        )
        failover = time.monotonic() - killed
        measure("leader killed -> standby holds the lease", failover)
        assert failover <= TIMING.lease_duration + TIMING.retry_period * 1.2 + 2, failover
        assert lease_of(cluster)["leaseTransitions"] == 1
        assert wait_for(lambda: second.leader_gauge() == "1.0", timeout=30, what="op-b's metrics say it leads")

        # The new leader acts on the same experiment, from the status the old one wrote.
        cluster.set_pod_phase(failing, NS, "Running")
        before = pods_of(cluster)[failing]["metadata"]["uid"]
        cluster.set_pod_phase(failing, NS, "Failed")
        wait_for(
            lambda: (pods_of(cluster).get(failing) or {}).get("metadata", {}).get("uid") not in (None, before),
            timeout=30,
            what=f"op-b recreates the failed pod; its log:\n{second.output()[-2000:]}",
        )
        status = wait_for(
            lambda: agent(status_of(cluster), "llama-char").get("restarts") == 2 and status_of(cluster),
            timeout=30,
            what="restarts 2: the count op-a wrote, plus op-b's",
        )
        assert status["phase"] == "Running" and agent(status, "qwen-bpe")["restarts"] == 0
        # The new leader created the one pod that failed, and tried no other (a duplicate would be a 409).
        assert writes(cluster, "op-b").count(("POST", f"/api/v1/namespaces/{NS}/pods")) == 1, writes(cluster, "op-b")
        assert sorted(pods_of(cluster)) == sorted(pods), "no pod more or less than the experiment's four"
        assert event_reasons(cluster).count("PodFailed") == 2
        assert not rbac_problems(cluster, clusterwide=False), rbac_problems(cluster, clusterwide=False)

        # A clean stop (SIGTERM) hands the Lease over at once.
        assert second.stop() == 0, second.output()[-3000:]
        assert "holderIdentity" not in lease_of(cluster)
        for process in processes:
            assert "Traceback" not in process.output(), process.output()[-3000:]
    finally:
        for process in processes:
            process.stop(signal.SIGKILL)


def test_three_candidates_hold_the_lease_one_after_another(cluster: EmulatedCluster) -> None:
    """Three electors start at once (all see no Lease and race to create it), each holds the Lease
    for a second and releases it: their terms never overlap."""
    terms: list[tuple[float, float, str]] = []
    lost: list[str] = []

    def compete(candidate: LeaderElector) -> None:
        candidate.acquire()
        start = time.monotonic()
        candidate.keep_renewing(lost.append)
        time.sleep(1.0)
        end = time.monotonic()
        candidate.release()
        terms.append((start, end, candidate.identity))

    timing = Timing(lease_duration=3, renew_deadline=2.0, retry_period=0.2)
    threads = [
        threading.Thread(target=compete, args=(elector(cluster, f"e{i}", timing),), daemon=True) for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    terms.sort()
    assert sorted(identity for *_, identity in terms) == ["e0", "e1", "e2"] and not lost
    for (_, end, before), (start, _, after) in zip(terms, terms[1:], strict=False):
        assert start >= end, f"{after} led from {start:.2f} while {before} led until {end:.2f}"
    assert lease_of(cluster)["leaseTransitions"] == 2
