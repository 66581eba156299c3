"""How many torch threads each worker of `hacrl run` gets: the CPUs this process may really use,
shared by the workers that compute at the same time.

A strictly on-policy agent's rollout and learner take turns (the rollout of step t + 1 needs the
weights the learner publishes after step t), so only one of them computes at a time and each may
use the agent's whole share; with ``maxStaleness`` >= 1 they overlap and split it. Idle OpenMP
threads must not spin meanwhile (``OMP_WAIT_POLICY=PASSIVE``, set by `hacrl run`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: cgroup v2 CPU limit of this container ("max 100000", or "<quota> <period>").
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
#: Set to a number to give every worker that many threads instead.
THREADS_ENV = "HACRL_TORCH_THREADS"


def available_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on (its affinity mask), capped by a cgroup CPU quota if one is set:
    ``os.cpu_count()`` counts the host's CPUs, not a container's share of them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def worker_threads(cpus: int, agents: int, max_staleness: int) -> int:
    """Torch threads per worker: the agent's share of the CPUs, halved when its two workers overlap."""
    busy_per_agent = 1 if max_staleness == 0 else 2
    return max(1, cpus // (agents * busy_per_agent))
