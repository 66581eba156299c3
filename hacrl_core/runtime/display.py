"""Live progress of a local run: a rich table on a terminal, plain lines elsewhere (CI, logs)."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from hacrl_core.sharing import format_share
from hacrl_core.store.errors import StoreError


def make_display(experiment, *, quiet: bool = False):
    if quiet:
        return QuietDisplay()
    return LiveDisplay(experiment) if sys.stdout.isatty() else LineDisplay(experiment)


class QuietDisplay:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def note(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        warn_stderr(message)

    def update(self, run) -> None:
        pass


def warn_stderr(message: str) -> None:
    """Warnings reach the user even with --quiet and when stdout is a pipe."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


class _Progress:
    def __init__(self, experiment) -> None:
        self.experiment = experiment
        self.steps = experiment.spec.algorithm.steps
        self.started = time.monotonic()
        self.last: dict[str, dict] = {}
        self._last_poll = 0.0

    def poll(self, run) -> bool:
        """Re-read heartbeats at most twice a second; True when anything changed."""
        if time.monotonic() - self._last_poll < 0.5:
            return False
        self._last_poll = time.monotonic()
        changed = False
        for agent in self.experiment.spec.agents:
            try:
                progress = run.store.read_progress(agent.name) or {}
            except StoreError:  # a store outage must not stop the run: workers retry and restart
                return changed
            if progress != self.last.get(agent.name):
                self.last[agent.name] = progress
                changed = True
        return changed

    def eta(self) -> str:
        done = min((p.get("step", 0) for p in self.last.values()), default=0) if self.last else 0
        if not done:
            return "–"
        elapsed = time.monotonic() - self.started
        return f"{elapsed / done * (self.steps - done):.0f}s"


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def rollout_replicas(run, agent) -> str:
    """``running/R`` of an agent's rollout replicas ("–" with one replica: its row says enough)."""
    replicas = agent.rollout.replicas
    if replicas == 1 or run is None:
        return "–"
    mine = [w for w in run.workers if w.agent == agent.name and w.replica is not None]
    if mine and all(w.finished for w in mine):
        return "done"
    return f"{sum(w.process is not None and w.poll() is None for w in mine)}/{replicas}"


def _has_replicas(experiment) -> bool:
    return any(agent.rollout.replicas > 1 for agent in experiment.spec.agents)


class LiveDisplay(_Progress):
    def __init__(self, experiment) -> None:
        super().__init__(experiment)
        self.console = Console()
        self.live = Live(self._table(None), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        return self.live.__exit__(*exc)

    def note(self, message: str) -> None:
        self.console.print(escape(message))

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {escape(message)}")

    def update(self, run) -> None:
        if self.poll(run):
            self.live.update(self._table(run))

    def _table(self, run) -> Table:
        table = Table(title=f"{self.experiment.name} — {self.experiment.spec.algorithm.name} — ETA {self.eta()}")
        replicas = _has_replicas(self.experiment)
        for column in (
            "agent",
            "step",
            "reward",
            "accuracy",
            "capability",
            "shared rows used",
            "checkpoint",
            "restarts",
        ):
            table.add_column(column)
        if replicas:
            table.add_column("rollout replicas running")
        for agent in self.experiment.spec.agents:
            p = self.last.get(agent.name, {})
            restarts = run.restarts.get(agent.name, 0) if run else 0
            table.add_row(
                agent.name,
                f"{p.get('step', 0)}/{self.steps}",
                _fmt(p.get("reward")),
                _fmt(p.get("accuracy")),
                _fmt(p.get("capability")),
                format_share(p.get("shared_rows_used")),
                str(p.get("last_checkpoint") or "–"),
                str(restarts),
                *([rollout_replicas(run, agent)] if replicas else []),
            )
        return table


class LineDisplay(_Progress):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def note(self, message: str) -> None:
        print(message, flush=True)

    def warn(self, message: str) -> None:
        warn_stderr(message)

    def update(self, run) -> None:
        if not self.poll(run):
            return
        agents = {agent.name: agent for agent in self.experiment.spec.agents}
        parts = [
            f"{name} {p.get('step', 0)}/{self.steps} reward {_fmt(p.get('reward'))} acc {_fmt(p.get('accuracy'))}"
            + (f" shared {format_share(p['shared_rows_used'])}" if p.get("shared_rows_used") is not None else "")
            + (f" rollouts {rollout_replicas(run, agents[name])}" if agents[name].rollout.replicas > 1 else "")
            for name, p in self.last.items()
        ]
        print(f"[{time.monotonic() - self.started:6.0f}s] " + " | ".join(parts) + f" | ETA {self.eta()}", flush=True)
