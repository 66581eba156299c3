"""Capability estimates of each agent and the ratios HACPO derives from them.

docs/algorithm.md, "Formulas" (step 3): P_j is the mean reward of agent j's own responses this step,
smoothed by a simple moving average over the last ``window`` steps (this one included) and
floored at ``floor``; omega(k, j) = P_k / P_j clamped to ``bounds``, 1 on the diagonal, and 1
everywhere before ``warmup_steps`` steps have been seen.

A team that changes (docs/algorithm.md, "A team that changes"): the history is kept per agent
name (``set_team`` names the step's members in order), so an agent's P_j is the mean over the
steps of the window it was a member of. A newcomer's estimate starts from its own first step:
nothing is carried over from another agent or assumed for the steps before it joined, and an
agent that left keeps no weight in the steps after it left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch


class CapabilityTracker:
    """Moving-average capability of ``n_agents`` agents.

    ``update`` is called once per training step with every agent's mean reward of that step.
    The tracker is deliberately tiny and serialisable (``state_dict``) because a learner must
    restore it from a checkpoint to resume without changing any later advantage.
    """

    def __init__(
        self,
        n_agents: int,
        window: int = 5,
        floor: float = 1e-8,
        bounds: tuple[float, float] = (0.1, 10.0),
        warmup_steps: int = 0,
    ) -> None:
        if n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {n_agents}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if floor <= 0:
            raise ValueError(f"floor must be > 0, got {floor}")
        low, high = bounds
        if not 0 < low <= 1 <= high:
            raise ValueError(f"bounds must satisfy 0 < low <= 1 <= high, got {bounds}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.n_agents = n_agents
        self.window = window
        self.floor = floor
        self.bounds = (float(low), float(high))
        self.warmup_steps = warmup_steps
        # One {agent: mean reward} per step seen; agents are named by ``set_team`` (by default
        # by their index, as strings).
        self._history: deque[dict[str, float]] = deque(maxlen=window)
        self.steps_seen = 0
        self.team = [str(i) for i in range(n_agents)]

    def set_team(self, names: Sequence[str]) -> None:
        """The members of the steps to come, in the order of their rewards, indices and ratios."""
        if not names:
            raise ValueError("a team has at least one agent")
        self.team = [str(n) for n in names]
        self.n_agents = len(self.team)

    def update(self, mean_reward_per_agent: Sequence[float]) -> None:
        rewards = [float(r) for r in mean_reward_per_agent]
        if len(rewards) != self.n_agents:
            raise ValueError(f"expected {self.n_agents} mean rewards, got {len(rewards)}")
        if any(r != r for r in rewards):
            raise ValueError(f"mean rewards must not be NaN, got {rewards}")
        self._history.append(dict(zip(self.team, rewards, strict=True)))
        self.steps_seen += 1

    @property
    def in_warmup(self) -> bool:
        """True while ratios are forced to 1 (fewer than ``warmup_steps`` updates seen)."""
        return self.steps_seen <= self.warmup_steps and self.warmup_steps > 0

    @property
    def capability(self) -> torch.Tensor:
        """Smoothed, floored capability per agent, float64[n_agents].

        Before the first update there is no evidence, so every agent counts as equal (ones).
        """
        means = []
        for name in self.team:  # over the steps of the window the agent was a member of
            seen = [step[name] for step in self._history if name in step]
            means.append(sum(seen) / len(seen) if seen else 1.0)
        return torch.tensor(means, dtype=torch.float64).clamp_min(self.floor)

    def ratio(self, k: int, j: int) -> float:
        """omega(k, j) = P_k / P_j clamped to ``bounds``; 1 when k == j or during warm-up."""
        return float(self.ratio_matrix()[k, j])

    def ratio_matrix(self) -> torch.Tensor:
        """All omega(k, j) at once, float64[n_agents, n_agents], row = k, column = j."""
        if self.in_warmup:
            return torch.ones(self.n_agents, self.n_agents, dtype=torch.float64)
        return capability_ratios(self.capability, self.bounds)

    def state_dict(self) -> dict:
        return {"history": [dict(h) for h in self._history], "steps_seen": self.steps_seen}

    def load_state_dict(self, state: dict) -> None:
        """A saved history; one saved before histories were kept by name (lists by index) is
        read as the current team's, in order."""
        self._history = deque(
            (
                {str(k): float(v) for k, v in h.items()}
                if isinstance(h, dict)
                else dict(zip(self.team, map(float, h), strict=False))
                for h in state["history"]
            ),
            maxlen=self.window,
        )
        self.steps_seen = int(state["steps_seen"])


def capability_ratios(capability: torch.Tensor, bounds: tuple[float, float] = (0.1, 10.0)) -> torch.Tensor:
    """omega[k, j] = clamp(capability[k] / capability[j], bounds), with exact ones on the diagonal."""
    cap = capability.to(torch.float64)
    ratios = (cap[:, None] / cap[None, :]).clamp(bounds[0], bounds[1])
    ratios.fill_diagonal_(1.0)
    return ratios
