"""`hacrl run` sizes each worker's torch threads from the CPUs it may really use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hacrl_core.runtime.cpus import available_cpus, started_wait_policy, wait_policy, worker_threads


@pytest.mark.parametrize(
    ("cpus", "agents", "staleness", "threads"),
    [
        (2, 2, 0, 1),  # this machine: two agents take turns within each agent
        (2, 1, 0, 2),  # one agent: its rollout and learner alternate, each may use both CPUs
        (16, 2, 0, 8),
        (16, 2, 1, 4),  # overlapping workers split the agent's share
        (2, 3, 1, 1),  # never fewer than one
    ],
)
def test_threads_follow_the_workers_that_compute_at_once(cpus, agents, staleness, threads):
    assert worker_threads(cpus, agents, staleness) == threads


def test_a_cgroup_quota_caps_the_cpus(tmp_path: Path):
    cpu_max = tmp_path / "cpu.max"
    affinity = len(os.sched_getaffinity(0))
    cpu_max.write_text("max 100000\n")
    assert available_cpus(cpu_max) == affinity
    cpu_max.write_text("50000 100000\n")  # half a CPU is still one thread
    assert available_cpus(cpu_max) == 1
    cpu_max.write_text(f"{(affinity + 3) * 100000} 100000\n")  # a quota above the affinity mask does not add CPUs
    assert available_cpus(cpu_max) == affinity
    assert available_cpus(tmp_path / "missing") == affinity


@pytest.mark.parametrize(
    ("agents", "colocated", "staleness", "replicas", "policy"),
    [
        (1, True, 0, 1, "ACTIVE"),  # one worker computes, alone: its threads keep spinning between kernels
        (2, True, 0, 1, "PASSIVE"),  # two colocated agents share the CPUs
        (1, False, 0, 1, "PASSIVE"),  # a split pair takes turns: ACTIVE would spin the waiting one's threads
        (1, True, 1, 1, "PASSIVE"),
        (1, True, 0, 2, "PASSIVE"),
    ],
)
def test_openmp_threads_spin_only_for_a_worker_that_computes_alone(agents, colocated, staleness, replicas, policy):
    assert wait_policy(agents, colocated, staleness, replicas) == policy


def test_started_wait_policy_is_read_from_the_environment_the_process_started_with(tmp_path):
    environ = tmp_path / "environ"
    environ.write_bytes(b"PATH=/bin\0OMP_WAIT_POLICY=ACTIVE\0OMP_WAIT_POLICY_X=no\0")
    assert started_wait_policy(environ) == "ACTIVE"
    environ.write_bytes(b"PATH=/bin\0OMP_WAIT_POLICY_X=no\0")
    assert started_wait_policy(environ) is None
    assert started_wait_policy(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("agents", "colocated", "staleness", "cpus", "gpu", "warned"),
    [
        (1, False, 1, 2, False, True),  # this machine: overlap on 2 CPUs, both phases CPU-bound
        (2, False, 1, 4, False, True),
        (1, True, 0, 2, False, False),  # colocated on-policy: nothing overlaps
        (1, False, 0, 2, False, False),  # split on-policy: the workers take turns
        (1, False, 1, 2, True, False),  # a GPU takes a phase off the CPUs
        (1, False, 2, 16, False, False),  # enough CPUs for both
    ],
)
def test_an_overlap_that_cannot_pay_is_said(agents, colocated, staleness, cpus, gpu, warned):
    from hacrl_core.runtime.cpus import overlap_warning

    line = overlap_warning(agents, colocated, staleness, cpus, gpu)
    assert (line is not None) == warned
    if warned:
        assert f"maxStaleness {staleness}" in line and f"{cpus} CPU(s)" in line and "maxStaleness: 0" in line


def test_validate_and_run_say_when_max_staleness_cannot_pay(tmp_path: Path, monkeypatch, capsys):
    """`hacrl validate` prints the overlap warning for a maxStaleness 1 spec on 2 CPUs and no GPU,
    not for the same spec on-policy; `hacrl run` warns with the same function at start-up."""
    import yaml

    from hacrl_core import cli
    from hacrl_core.runtime import cpus, local

    monkeypatch.setattr(cpus, "available_cpus", lambda: 2)
    monkeypatch.setattr(cpus, "has_gpu", lambda: False)
    document = yaml.safe_load(Path("examples/quickstart.yaml").read_text())
    document["spec"]["agents"] = document["spec"]["agents"][:1]
    document["spec"]["algorithm"]["name"] = "grpo"
    printed = {}
    for staleness in (0, 1):
        document["spec"]["algorithm"]["maxStaleness"] = staleness
        path = tmp_path / f"stale{staleness}.yaml"
        path.write_text(yaml.safe_dump(document))
        assert cli.main(["validate", str(path)]) == 0
        printed[staleness] = capsys.readouterr().out
    assert "cannot pay for itself" not in printed[0]
    assert "warning: `hacrl run` on this machine: algorithm.maxStaleness 1" in printed[1]
    assert "2 CPU(s) for 1 agent(s)" in printed[1]
    assert local.spec_overlap_warnings is cpus.spec_overlap_warnings  # the start-up's warning is this one
