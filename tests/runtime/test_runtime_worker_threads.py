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
