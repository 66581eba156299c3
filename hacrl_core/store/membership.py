"""The team of each step, recorded: ``steps/<t>/members.json`` (docs/architecture.md, "Changing the team").

Agents join (added to ``spec.agents``), leave (removed from it) and pause (``agents[].suspend``)
while an experiment runs. Each step's team is fixed once, by the first worker that reaches the
step, from the team its spec names at that moment (``ExperimentSpec.team``: the agents not
suspended), and recorded in the store. Every later reader of the step (its workers, a restarted
worker, a replay, an audit) takes that record, never the spec:

- a learner reads peers' rows and scores only from the members of its step;
- a worker whose agent is not a member of its next step leaves the team there (``still_member``
  is False): the learner checkpoints its last finished step and exits, the rollout worker exits;
- a worker that starts (a newcomer, an agent back from a pause, or a restart) runs from the first
  step at or after its own next step that names it (``join_step``); where no record names it,
  it fixes the first step no worker has fixed yet, the team's frontier, with itself in it.

Records are written once per step, by whichever worker gets there first; two workers that reach
an unfixed step at the same moment may both write, and the last write is the record (each reads
it back). Steps written before membership was recorded have no record and are never read again:
a resumed run fixes its steps from its checkpoints on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from hacrl_core.store.errors import CorruptObject
from hacrl_core.store.trajectory_store import TrajectoryStore

Team = Callable[[], Sequence[str]]


def read_members(store: TrajectoryStore, step: int, *, attempts: int = 20) -> list[str] | None:
    """The recorded members of ``step`` (None: not fixed yet). A record being rewritten by a
    second worker that reached the step at the same moment reads as damaged for an instant:
    read again."""
    for attempt in range(attempts):
        try:
            return store.read_members(step)
        except CorruptObject:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05)
    return None


def step_members(store: TrajectoryStore, step: int, team: Team) -> list[str]:
    """The members of ``step``: as recorded, or fixed now from ``team()`` (then read back, so that
    of two workers that wrote at once both go on with the same record)."""
    found = read_members(store, step)
    if found is not None:
        return found
    store.write_members(step, list(team()))
    found = read_members(store, step)
    if found is None:  # deleted under us (a resume reopening the step): fix it again
        return step_members(store, step, team)
    return found


def still_member(store: TrajectoryStore, agent: str, step: int, team: Team) -> bool:
    """Whether ``agent`` is a member of ``step`` (fixing the step's members when no worker did)."""
    return agent in step_members(store, step, team)


def join_step(store: TrajectoryStore, agent: str, start: int, steps: int, team: Team) -> int | None:
    """The first step at or after ``start`` that ``agent`` is a member of: a recorded one, else
    the frontier (the step after the last recorded one), fixed now. None when there is none
    before ``steps``, or when the team (``team()``) no longer names the agent: it left or is
    suspended, and has nothing to do."""
    recorded = store.member_steps()
    for step in recorded:
        # A listed record without its commit marker: its writer is between the data and the
        # marker, or stopped there (paused, killed). Fix the step as it would have (the same team
        # from the same spec) rather than read it as unrecorded: the worker then joined the step
        # after it, while the others waited for it at this one, for ever.
        if start <= step < steps and agent in (read_members(store, step) or step_members(store, step, team)):
            return step
    step = max([start] + [s + 1 for s in recorded])
    while step < steps:
        if agent not in team():
            return None
        if agent in step_members(store, step, team):
            return step
        step += 1  # another worker fixed this step at the same moment, without the agent yet
    return None


def reopen_steps(store: TrajectoryStore, team: Collection[str], agents: Collection[str]) -> list[int]:
    """Drop the records of the steps no member finished (no member's metrics), from the first one
    on, when any of them is another team than ``team``: a resume without an agent would otherwise
    wait for its rows there for ever, and an agent added on resume joins at the first step nobody
    finished rather than after the steps the stopped run had only begun. ``agents``: every agent
    whose metrics may be in the store. Steps a member finished keep their record. Returns the
    steps reopened."""
    recorded = store.member_steps()
    open_steps: list[tuple[int, list[str]]] = []
    for step in recorded:
        members = read_members(store, step) or []
        if any(store.metrics_ready(step, name) for name in set(members) | set(agents)):
            open_steps = []  # finished by someone: the steps after it may still reopen
            continue
        open_steps.append((step, members))
    if all(set(members) == set(team) for _, members in open_steps):
        return []
    for step, _ in open_steps:
        store.delete_members(step)
    return [step for step, _ in open_steps]


def stint_start(store: TrajectoryStore, agent: str, step: int) -> int:
    """The first step of ``agent``'s membership that ``step`` belongs to: ``step``, or earlier while
    the steps before it name the agent too (a step with no record, written before membership was
    recorded, counts as the agent's). 0 for an agent of the team from the start; a newcomer's join
    step; the step an agent came back at after a pause. Its weights version for sampling is at
    least this one (the learner publishes it as the agent starts: ``learner.team``)."""
    while step > 0:
        members = read_members(store, step - 1)
        if members is not None and agent not in members:
            return step
        step -= 1
    return 0
