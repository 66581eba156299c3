"""The colocated worker: `hacrl worker colocated --spec S --agent A`.

One process samples the agent's rollouts with the learner's live model and trains on them: no
rollout worker, no weight publish and load per step (weights are published with each checkpoint,
for `hacrl eval` and for a later run in the split mode). It composes the two packages from above:
the learner's step loop (``learner.worker.run_learner_worker``) with a sampler from the rollout
package, so that neither the learner nor the rollout package imports the other.
"""

from __future__ import annotations

from hacrl_core.context import RunDescription, WorkerContext
from hacrl_core.learner import distributed
from hacrl_core.learner.state import LearnerState
from hacrl_core.learner.worker import Sampler, run_learner_worker
from hacrl_core.rewards.remote import take_retries
from hacrl_core.rollout.hf_engine import HFEngine
from hacrl_core.rollout.sampling import rollout_metrics
from hacrl_core.rollout.worker import StoreRolloutPorts, sample_rollouts
from hacrl_core.spec import SpecError


def live_policy_sampler(context: WorkerContext) -> Sampler:
    """A sampler for the learner's step loop: the step's own rollouts sampled with the learner's
    live weights (version ``step``: on-policy by construction), unless an earlier attempt wrote
    them; their metrics. Rank 0 of several learner ranks samples; the others read its rollouts
    from the store."""
    engine = HFEngine(batch_size=context.agent.rollout.batch_size)
    ports = StoreRolloutPorts(context)

    def sample(state: LearnerState, step: int) -> dict[str, float]:
        if distributed.decide(
            context.store.rollouts_ready(step, context.agent_name) if distributed.is_writer() else None
        ):
            return {}
        with state.backend.gathered_weights() as model:
            if not distributed.is_writer():
                return {}
            engine.set_policy(model, state.tokenizer)
            rows, seconds = sample_rollouts(context.run, ports, engine, step, version=step)
        return rollout_metrics(rows, step, {"load_weights": 0.0, **seconds}, take_retries())

    return sample


def check_colocatable(run: RunDescription) -> None:
    """A SpecError naming each field that keeps this experiment from running colocated."""
    blockers = run.spec.colocation_blockers()
    if blockers:
        raise SpecError(
            str(run.experiment),
            [f"spec.{b}: cannot run colocated; or run the rollout and learner workers apart" for b in blockers],
        )


def run_colocated_worker(context: WorkerContext) -> None:
    check_colocatable(context.run)
    run_learner_worker(context, sampler=live_policy_sampler(context))
