"""The learner's side of a team that changes (store/membership.py; docs/architecture.md, "Changing
the team"): where it joins, the members of each of its steps, whether it is still one, and what
it does as it leaves.

With several learner ranks, rank 0 alone reads and fixes a step's members in the store and every
rank takes its answer (``distributed.decide``), so the ranks never disagree on the team of a step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hacrl_core.context import WorkerContext
from hacrl_core.learner import distributed
from hacrl_core.store.membership import join_step, step_members, stint_start

log = logging.getLogger("hacrl")


def first_step(context: WorkerContext, start: int) -> int | None:
    """The first step this learner trains, at or after ``start`` (its checkpoint's next step):
    the first step whose members name its agent. None: it is not in the team (removed, or
    suspended) or no step is left for it; the worker then has nothing to do."""
    agent, steps = context.agent_name, context.spec.algorithm.steps
    found = join_step(context.store, agent, start, steps, context.current_team) if distributed.is_writer() else None
    found = distributed.decide(found)
    if found is None and start < steps:
        log.info("learner %s: not in the team for any step from %d (removed or suspended); nothing to do", agent, start)
    elif found is not None and found > start:
        log.info("learner %s: joins the team at step %d", agent, found)
    return found


def needs_first_weights(context: WorkerContext, first: int) -> bool:
    """Whether the learner publishes weights as it starts at step ``first``: when the agent's
    newest published version is older than the version its rollouts of that step sample from
    (0 for a fresh agent; its join step for a newcomer or an agent back from a pause)."""
    answer = None
    if distributed.is_writer():
        store, agent = context.store, context.agent_name
        latest = store.latest_weights_version(agent)
        answer = latest is None or latest < stint_start(store, agent, first)
    return bool(distributed.decide(answer))


def first_version(context: WorkerContext, step: int) -> int:
    """The weights version the agent samples its first steps from ``step`` with: the first step of
    its membership (``membership.stint_start``), 0 for an agent there from the start."""
    found = stint_start(context.store, context.agent_name, step) if distributed.is_writer() else None
    return distributed.decide(found) or 0  # rank 0's answer, never None


def members(context: WorkerContext, step: int) -> tuple[str, ...]:
    """The members of ``step``, fixed now from the spec's team when no worker did yet."""
    found: list[str] | None = (
        step_members(context.store, step, context.current_team) if distributed.is_writer() else None
    )
    decided: list[str] | None = distributed.decide(found)  # rank 0's answer, never None
    return tuple(decided or ())


def is_member(context: WorkerContext, step: int) -> bool:
    return context.agent_name in members(context, step)


def sits_out(context: WorkerContext, step: int, save: Callable[[], None]) -> bool:
    """The agent is not a member of ``step``. True: the spec's team still names it (the step was
    recorded without it while it was away, or before it came back), so it goes on to the next
    step that names it. False: it left the team (removed or suspended): ``save`` (a checkpoint of
    the ``step`` steps it finished, every rank) unless a checkpoint holds them, so that it comes
    back from there."""
    agent = context.agent_name
    staying = agent in context.current_team() if distributed.is_writer() else None
    if distributed.decide(staying):
        log.info("learner %s: step %d was recorded without it; it rejoins at a later step", agent, step)
        return True
    latest = context.store.latest_checkpoint(agent) if distributed.is_writer() else None
    if step > 0 and distributed.decide(latest) != step:
        save()
    log.info("learner %s: left the team at step %d (removed or suspended); its data stays in the store", agent, step)
    return False


def rejoined(context: WorkerContext, step: int, publish: Callable[[int], object]) -> None:
    """The agent is a member of ``step`` again after steps it sat out: its rollouts of ``step``
    sample the version ``step``, which ``publish`` (the learner's weights publish) puts out."""
    if needs_first_weights(context, step):
        publish(first_version(context, step))
