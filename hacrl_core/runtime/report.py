"""The report folder of a run: per-step metrics (JSONL, CSV), curves (PNG), summary (markdown)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import fmean

from hacrl_core.sharing import format_share, shared_rows_used, sharing_warning
from hacrl_core.skipped_rows import DatasetReport
from hacrl_core.store import TrajectoryStore


def collect_metrics(store: TrajectoryStore, agents: list[str], steps: int) -> list[dict]:
    rows = []
    for step in range(steps):
        for agent in agents:
            if store.metrics_ready(step, agent):
                rows.append({"agent": agent, **store.read_metrics(step, agent)})
    return rows


def accuracy_curve(rows: list[dict], agent: str) -> dict[str, list[tuple[int, float]]]:
    """Per eval set: (weights version, accuracy) points, the initial model's included."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row["agent"] != agent:
            continue
        for key, value in row.items():
            if key.startswith("eval/") and key.endswith("/accuracy_initial"):
                curves.setdefault(key.split("/")[1], []).append((0, value))
            elif key.startswith("eval/") and key.endswith("/accuracy"):
                curves.setdefault(key.split("/")[1], []).append((row["weights_version"], value))
    return {name: sorted(points) for name, points in curves.items()}


def write_report(
    store: TrajectoryStore,
    agents: list[str],
    steps: int,
    out_dir: Path,
    *,
    wall_seconds: float | None = None,
    title: str = "",
    datasets: list[DatasetReport] | None = None,
    delta: float = 0.2,
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = collect_metrics(store, agents, steps)
    with open(out_dir / "metrics.jsonl", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    columns = sorted({key for row in rows for key in row}, key=lambda k: (k not in ("agent", "step"), k))
    with open(out_dir / "metrics.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, agents, out_dir / "curves.png")

    lines = [f"# {title or 'HACRL run'}", ""]
    if wall_seconds is not None:
        lines += [f"Wall time: {wall_seconds:.0f} s.", ""]
    lines += [
        "| agent | steps | sampled reward first → last | eval accuracy initial → final | shared rows used |",
        "| --- | --- | --- | --- | --- |",
    ]
    warnings = []
    windows = 1
    for agent in agents:
        mine = [r for r in rows if r["agent"] == agent]
        if not mine:
            lines.append(f"| {agent} | 0 | – | – | – |")
            continue
        rewards = [r["rollout/reward_mean"] for r in mine]
        ends = reward_window(len(rewards))
        windows = max(windows, ends)
        curves = accuracy_curve(rows, agent)
        accuracy = "; ".join(f"{name}: {pts[0][1]:.3f} → {pts[-1][1]:.3f}" for name, pts in curves.items()) or "–"
        used = [u for u in (shared_rows_used(r) for r in mine) if u is not None]
        share = format_share(sum(used) / len(used) if used else None)
        lines.append(
            f"| {agent} | {len(mine)} | {fmean(rewards[:ends]):.3f} → {fmean(rewards[-ends:]):.3f} | {accuracy} | {share} |"
        )
        warning = sharing_warning(agent, sorted(mine, key=lambda r: r["step"]), delta=delta)
        if warning:
            warnings.append(warning)
    lines += [
        "",
        f"Sampled reward: the training rollouts' mean reward (sampled, not greedy), averaged over the first and the "
        f"last {'step' if windows == 1 else f'{windows} steps'}; it moves with each step's sample and can fall while the "
        "eval accuracy (greedy, held-out problems) rises.",
        "",
        "Shared rows used: the share of other agents' rows inside HACPO's clipping window (mean over steps).",
    ]
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {warning}" for warning in warnings]
    if datasets:
        lines += ["", "Data:", ""] + [f"- {report.summary()}" for report in datasets]
    retried = reward_retries(rows)
    if retried:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(retried.items()))
        lines += [
            "",
            f"Reward server: {sum(retried.values())} requests retried ({reasons}); see the workers' logs (docs/rewards.md).",
        ]
    lines += ["", "Files: `metrics.jsonl`, `metrics.csv` (one row per agent and step), `curves.png`."]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out_dir


def reward_retries(rows: list[dict]) -> dict[str, int]:
    """The reward server's retried requests over the run, by reason (``rollout/reward_retries/*``:
    in the step metrics of the workers that sample and train, the colocated ones)."""
    prefix = "rollout/reward_retries/"
    counts: dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(prefix):
                counts[key[len(prefix) :]] = counts.get(key[len(prefix) :], 0) + int(value)
    return counts


def reward_window(steps: int) -> int:
    """How many steps at each end the report averages the sampled reward over: up to 3, and at
    most a quarter of the run, so that a short run still compares its start with its end: one
    step's reward is the mean of one batch of samples, and the first and the last alone can
    disagree with the run's trend (0.052 -> 0.042 for an agent of a quickstart run whose greedy
    accuracy rose)."""
    return max(1, min(3, steps // 4))


def load_plotting() -> None:
    """Import matplotlib for the curves: `hacrl run` calls it in a thread while the workers train,
    so that the report at the end of the run only draws (the import is about 0.2 s of its 0.5 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def _plot(rows: list[dict], agents: list[str], path: Path) -> None:
    load_plotting()
    import matplotlib.pyplot as plt

    figure, (reward_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for agent in agents:
        mine = [r for r in rows if r["agent"] == agent]
        reward_axis.plot([r["step"] for r in mine], [r["rollout/reward_mean"] for r in mine], label=agent)
        for name, points in accuracy_curve(rows, agent).items():
            accuracy_axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{agent} ({name})")
    reward_axis.set(title="rollout reward", xlabel="step", ylabel="mean reward")
    accuracy_axis.set(title="eval accuracy (greedy)", xlabel="weights version", ylabel="accuracy")
    for axis in (reward_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
