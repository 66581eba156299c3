"""Rollout replicas (``agents[].rollout.replicas``): which replica a rollout worker is, and which
of each step's prompts it samples.

Replica r of R samples a contiguous slice of the step's prompts (split as evenly as possible, the
first ``P % R`` replicas one prompt more) and writes its own part of the step's rollouts
(``TrajectoryStore.write_rollouts(..., replica=r)``). Whole prompts go to one replica, so each
prompt's group of G samples stays inside one part, and the parts in replica order hold the
step's prompts in the order one worker would have sampled them.

A replica learns its index from ``HACRL_ROLLOUT_REPLICA`` (``spec.ROLLOUT_REPLICA_ENV``): the
operator sets it on each replica's pod, `hacrl run` on each replica's process, and the worker
command is the same for every replica.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hacrl_core.spec import ROLLOUT_REPLICA_ENV


def replica_slice(prompts: int, replicas: int, replica: int) -> slice:
    """The prompts of a step (of ``prompts``) that replica ``replica`` of ``replicas`` samples."""
    check_replica_prompts(prompts, replicas)
    if not 0 <= replica < replicas:
        raise ValueError(f"replica {replica} out of range 0..{replicas - 1}")
    base, extra = divmod(prompts, replicas)
    start = replica * base + min(replica, extra)
    return slice(start, start + base + (1 if replica < extra else 0))


def check_replica_prompts(prompts: int, replicas: int, where: str = "rollout.replicas") -> None:
    """Refuse more replicas than prompts per step: a replica would have nothing to sample."""
    if replicas > prompts:
        raise ValueError(
            f"{where}: {replicas} replicas for {prompts} prompts per step (algorithm.promptsPerStep) would leave "
            f"{replicas - prompts} replica(s) without a prompt; use at most {prompts} replicas or more prompts per step"
        )


def rollout_replica(replicas: int, where: str, env: Mapping[str, str] | None = None) -> int:
    """This worker's replica index from ``HACRL_ROLLOUT_REPLICA`` (0 when unset and the agent has
    one replica); ``where``: the spec field, for messages (``spec.agents[0].rollout.replicas``)."""
    raw = (os.environ if env is None else env).get(ROLLOUT_REPLICA_ENV, "").strip()
    if not raw:
        if replicas == 1:
            return 0
        raise ValueError(
            f"{ROLLOUT_REPLICA_ENV} is not set, but {where} is {replicas}: set it to this replica's index, 0..{replicas - 1} "
            "(the operator sets it on each replica's pod, `hacrl run` on each replica's process)"
        )
    try:
        replica = int(raw)
    except ValueError:
        replica = -1
    if not 0 <= replica < replicas:
        raise ValueError(f"{ROLLOUT_REPLICA_ENV}={raw!r} is not a replica of {where} {replicas}: use 0..{replicas - 1}")
    return replica
