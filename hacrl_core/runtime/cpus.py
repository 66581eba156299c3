"""How many torch threads each worker of `hacrl run` gets: the CPUs this process may really use,
shared by the workers that compute at the same time.

A strictly on-policy agent's rollout and learner take turns (the rollout of step t + 1 needs the
weights the learner publishes after step t), so only one of them computes at a time and each may
use the agent's whole share; with ``maxStaleness`` >= 1 they overlap and split it.

Idle OpenMP threads (libgomp, torch's on Linux) either spin or sleep between parallel regions:
``wait_policy`` picks per run. A worker that computes alone keeps them spinning: the hundreds of
small kernels of a generate or a backward pass then do not pay a wake-up each. Workers that share
the CPUs, or that wait for each other in turns, let them sleep: libgomp's ACTIVE policy spins an
idle worker's threads without end, on the cores the busy one needs.

The OpenMP runtime reads ``OMP_WAIT_POLICY`` once, when torch loads it: a worker forked from `hacrl
run`'s fork server (runtime/forkserver.py) has the policy the server started with, whatever its own
environment says later, so `hacrl run` starts the server with the run's policy
(``started_wait_policy`` reads back what a process got).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: cgroup v2 CPU limit of this container ("max 100000", or "<quota> <period>").
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
#: Set to a number to give every worker that many threads instead.
THREADS_ENV = "HACRL_TORCH_THREADS"
#: ACTIVE or PASSIVE; set by the user, it wins over ``wait_policy``'s choice.
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
#: The environment this process started with (Linux): what its OpenMP runtime read.
START_ENVIRON = Path("/proc/self/environ")


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


def wait_policy(agents: int, colocated: bool, max_staleness: int, replicas: int = 1) -> str:
    """``OMP_WAIT_POLICY`` for the workers of a run: ACTIVE only when one worker computes, alone,
    from start to end (one agent, colocated, one rollout replica); PASSIVE otherwise."""
    alone = agents == 1 and colocated and replicas == 1
    return "ACTIVE" if alone and max_staleness == 0 else "PASSIVE"


def started_wait_policy(start_environ: Path = START_ENVIRON) -> str | None:
    """``OMP_WAIT_POLICY`` as this process's OpenMP runtime read it: from the environment the
    process started with, which for a forked worker is its fork server's (``os.environ`` shows
    what the worker was given instead); None where unset or not readable (not Linux)."""
    try:
        entries = start_environ.read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = WAIT_POLICY_ENV.encode() + b"="
    return next((e[len(prefix) :].decode(errors="replace") for e in entries if e.startswith(prefix)), None)


#: Where the CPUs per agent are this few and no GPU takes a phase, ``maxStaleness`` >= 1 measured
#: slower than colocated (docs/benchmarks.md, section 7: 2 CPUs, one agent, 16-token completions).
OVERLAP_MIN_CPUS_PER_AGENT = 3


def has_gpu(dev: Path = Path("/dev")) -> bool:
    """Whether this machine shows an NVIDIA GPU (its device files), without importing torch."""
    return any(dev.glob("nvidia[0-9]*"))


def overlap_warning(agents: int, colocated: bool, max_staleness: int, cpus: int, gpu: bool) -> str | None:
    """Why overlapping sampling with training (``maxStaleness`` >= 1, split workers) may be slower
    here than colocated on-policy, or None: with no GPU and fewer than
    ``OVERLAP_MIN_CPUS_PER_AGENT`` CPUs per agent both phases are CPU-bound on the same few cores,
    so the overlap halves each worker's threads (``worker_threads``) and gains nothing back."""
    if colocated or max_staleness < 1 or gpu or cpus // max(agents, 1) >= OVERLAP_MIN_CPUS_PER_AGENT:
        return None
    threads = worker_threads(cpus, agents, max_staleness)
    return (
        f"algorithm.maxStaleness {max_staleness} overlaps sampling with training, but on {cpus} CPU(s) for "
        f"{agents} agent(s) and no GPU both are CPU-bound on the same cores: each worker gets {threads} thread(s) "
        "instead of the agent's share, so the overlap cannot pay for itself and a step may be slower than "
        "colocated on-policy (measured up to 20% slower on 2 CPUs, docs/benchmarks.md section 7); "
        "maxStaleness: 0 runs colocated"
    )


def spec_overlap_warnings(spec, colocated: bool) -> list[str]:
    """``overlap_warning`` of an experiment's spec placed as ``colocated`` says, on this machine."""
    line = overlap_warning(len(spec.team()), colocated, spec.algorithm.max_staleness, available_cpus(), has_gpu())
    return [line] if line else []
