"""What a preemption costs: the quickstart regime uninterrupted, and with SIGTERMs at random moments.

Issue 41, item 5: `examples/quickstart.yaml` (its agents, data, algorithm and checkpoint.everySteps
4) run by `hacrl run` twice, one after the other on the same machine: once uninterrupted, once
with ``--preemptions`` (3) SIGTERMs, each once the slowest learner finished a seeded random step
(distinct, not the last two) and a seeded random part of a step later, to the process of a
random live worker, as the kubelet signals a pod's container (hacrl_core/preemption.py: the worker
ends or abandons its step in flight, checkpoints its last finished step, exits 7, and `hacrl
run` restarts it, counting no restart).

Per preemption: the steps its agent had finished, the step the restarted worker resumed from (its
log), the seconds from SIGTERM to the worker's exit (stop) and to its restart's resume line
(resumed: process start, model and checkpoint load), and the struck agent's gap: from its last
finished step before the SIGTERM to its next one after it, against the same run's median step
interval of that agent away from any SIGTERM (same machine, same load); the difference is the
preemption's cost in wall-clock seconds. Per run: wall seconds, the load, and each agent's final
held-out accuracy (the run's last evaluation).

    .venv/bin/python bench/preemption.py            # the quickstart as it is (12 steps)
    .venv/bin/python bench/preemption.py --quick    # 4 steps, 100 eval prompts, 2 preemptions
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_CACHE, REPO, bench_env, build_models, save, table, write_spec  # noqa: E402

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def quickstart(name: str, store: Path, *, quick: bool) -> dict[str, Any]:
    """The quickstart's document under ``name`` with its own store, metrics endpoints off."""
    document = yaml.safe_load(QUICKSTART.read_text())
    document["metadata"]["name"] = name
    document["spec"]["store"] = {"uri": store.as_uri()}
    document["spec"]["metrics"] = {"port": 0}
    if quick:
        document["spec"]["algorithm"]["steps"] = 4
        document["spec"]["evaluation"] = {"everySteps": 0}
        document["spec"]["data"]["eval"][0]["maxPrompts"] = 100
    return document


def progress(store: Any, agents: list[str]) -> dict[str, int]:
    out = {}
    for agent in agents:
        try:
            out[agent] = int((store.read_progress(agent) or {}).get("step", 0))
        except Exception:  # noqa: BLE001 (a progress file being replaced: read it next time)
            out[agent] = -1
    return out


def final_accuracies(store: Any, agents: list[str], steps: int) -> dict[str, float | None]:
    out = {}
    for agent in agents:
        metrics = store.read_metrics(steps - 1, agent)
        out[agent] = next((v for k, v in metrics.items() if k.startswith("eval/") and k.endswith("/accuracy")), None)
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by `hacrl run`) still answers kill(0)
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


class Preempter(threading.Thread):
    """SIGTERMs a random live worker of the run once the slowest learner finished each planned
    step, after a random part of a step (``plan``: (step, delay s)), and records every agent's
    progress as it changes, to time what follows (module docstring)."""

    def __init__(self, workdir: Path, store: Any, agents: list[str], plan: list[tuple[int, float]], seed: int) -> None:
        super().__init__(name="preempter", daemon=True)
        self.workdir, self.store, self.agents, self.plan = workdir, store, agents, plan
        self.rng = random.Random(seed)
        self.began = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.timeline: list[tuple[float, str, int]] = []  # (seconds, agent, steps finished) at each change
        self.done = threading.Event()
        self._last: dict[str, int] = {}

    def sample(self) -> dict[str, int]:
        now = progress(self.store, self.agents)
        for agent, step in now.items():
            if step >= 0 and step != self._last.get(agent):
                self._last[agent] = step
                self.timeline.append((time.monotonic() - self.began, agent, step))
        return now

    def run(self) -> None:
        pending = list(self.plan)
        while not self.done.is_set():
            now = self.sample()
            if pending and min(now.values()) >= pending[0][0]:
                step, delay = pending.pop(0)
                self.done.wait(delay)
                event = self.strike(step)
                if event is not None:
                    self.events.append(event)
                    threading.Thread(target=self.follow, args=(event,), daemon=True).start()
            self.done.wait(0.05)

    def strike(self, planned: int) -> dict[str, Any] | None:
        try:
            table_ = json.loads((self.workdir / "workers.json").read_text())
        except (OSError, ValueError):
            return None
        live = [w for w in table_ if w.get("pid") and pid_alive(w["pid"])]
        if not live:
            return None
        victim = self.rng.choice(sorted(live, key=lambda w: (w["agent"], w["role"])))
        steps = progress(self.store, [victim["agent"]])[victim["agent"]]
        at = time.monotonic()
        os.kill(victim["pid"], signal.SIGTERM)
        return {
            "planned_after_step": planned,
            "at_seconds": round(at - self.began, 2),
            "agent": victim["agent"],
            "role": victim["role"],
            "pid": victim["pid"],
            "steps_finished": steps,
            "_at": at,
        }

    def follow(self, event: dict[str, Any]) -> None:
        """Seconds from SIGTERM to the worker's exit, and to its restart's resume line."""
        log = self.workdir / "logs" / f"{event['agent']}-{event['role']}.log"
        resumes = log.read_text(errors="replace").count("resumed from checkpoint") if log.exists() else 0
        while pid_alive(event["pid"]) and not self.done.is_set():
            time.sleep(0.02)
        event["stop_seconds"] = round(time.monotonic() - event["_at"], 2)
        while not self.done.is_set():
            found = re.findall(r"resumed from checkpoint after (\d+) steps", log.read_text(errors="replace"))
            if len(found) > resumes:  # this stop's restart: its own line, not a later one's
                event["resumed_seconds"] = round(time.monotonic() - event["_at"], 2)
                event["resumed_from"] = int(found[resumes])
                return
            time.sleep(0.05)


def step_cost(timeline: list[tuple[float, str, int]], event: dict[str, Any], struck: list[float]) -> dict[str, Any]:
    """The struck agent's steps around the SIGTERM: the time from its last finished step before it
    to its next one after it, against the same run's median step interval of that agent away from
    any SIGTERM (same machine, same load): the extra is the preemption's cost to the agent."""
    at = event["at_seconds"]
    mine = [(t, s) for t, a, s in timeline if a == event["agent"]]
    before = [(t, s) for t, s in mine if t <= at]
    after = [(t, s) for t, s in mine if t > at]
    intervals = [
        (t1 - t0) / (s1 - s0)
        for (t0, s0), (t1, s1) in zip(mine, mine[1:])
        if s1 > s0 > 0 and not any(t0 < x <= t1 for x in struck)
    ]
    if not before or not after or not intervals:
        return {"gap_seconds": None, "median_step_seconds": None, "cost_seconds": None}
    (t0, s0), (t1, s1) = before[-1], after[0]
    median = sorted(intervals)[len(intervals) // 2]
    gap = t1 - t0
    return {
        "gap_seconds": round(gap, 2),
        "gap_steps": s1 - s0,
        "median_step_seconds": round(median, 2),
        "cost_seconds": round(gap - (s1 - s0) * median, 2),
    }


def run_once(
    spec: Path, workdir: Path, env: dict[str, str], store: Any, agents: list[str], preempter: Preempter
) -> tuple[float, str]:
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "hacrl_core.cli", "run", "--quiet", "--workdir", str(workdir), str(spec)],
        cwd=spec.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    preempter.began = began
    preempter.start()
    output, _ = process.communicate(timeout=3600)
    seconds = time.monotonic() - began
    preempter.done.set()
    preempter.join(10)
    if process.returncode != 0:
        raise RuntimeError(f"hacrl run {spec} failed ({process.returncode}):\n{output[-4000:]}")
    return seconds, output


def mean_step_seconds(store: Any, agents: list[str], steps: int) -> float:
    """The uninterrupted run's mean learner step wall time (its ``learner/seconds_*`` stages)."""
    totals = []
    for agent in agents:
        for step in range(steps):
            metrics = store.read_metrics(step, agent)
            totals.append(sum(v for k, v in metrics.items() if k.startswith("learner/seconds_")))
    return sum(totals) / len(totals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 steps, 100 eval prompts, 2 preemptions")
    parser.add_argument("--preemptions", type=int, help="SIGTERMs in the preempted run (default 3; --quick 2)")
    parser.add_argument("--seed", type=int, default=0, help="picks the moments and the workers")
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--work", type=Path, default=REPO / ".bench-work" / "preemption")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    count = args.preemptions if args.preemptions is not None else (2 if args.quick else 3)
    from hacrl_core.store import open_trajectory_store

    env = bench_env(args.cache)
    results: dict[str, Any] = {}
    agents: list[str] = []
    for mode in ("uninterrupted", "preempted"):
        name = f"preempt-{mode}"
        root = args.work / mode
        subprocess.run(["rm", "-rf", str(root)], check=True)
        document = quickstart(name, root / "store", quick=args.quick)
        agents = [a["name"] for a in document["spec"]["agents"]]
        steps = document["spec"]["algorithm"]["steps"]
        build_models([a["model"] for a in document["spec"]["agents"]], args.cache)
        spec = write_spec(document, root / f"{name}.yaml")
        store = open_trajectory_store((root / "store").as_uri(), name)
        if mode == "preempted":  # distinct steps, each struck a random part of a step after it
            rng = random.Random(args.seed)
            step_seconds = results["uninterrupted"]["mean_step_seconds"]
            plan = [(s, rng.uniform(0, step_seconds)) for s in sorted(rng.sample(range(1, steps - 1), count))]
        preempter = Preempter(root / "work", store, agents, plan if mode == "preempted" else [], args.seed)
        seconds, output = run_once(spec, root / "work", env, store, agents, preempter)
        entry: dict[str, Any] = {
            "wall_seconds": round(seconds, 1),
            "load_after": os.getloadavg(),
            "final_accuracy": final_accuracies(store, agents, steps),
            "restart_lines": [line for line in output.splitlines() if "restarting" in line],
        }
        entry["mean_step_seconds"] = round(mean_step_seconds(store, agents, steps), 2)
        entry["timeline"] = preempter.timeline
        if mode == "preempted":
            struck = [e["at_seconds"] for e in preempter.events]
            for event in preempter.events:
                event.pop("_at", None)
                event.update(step_cost(preempter.timeline, event, struck))
            entry["preemptions"] = preempter.events
        results[mode] = entry
        print(f"{mode}: {entry['wall_seconds']} s, final accuracy {entry['final_accuracy']}", flush=True)

    rows = [
        [
            f"{e['at_seconds']:.1f}",
            f"{e['agent']}.{e['role']}",
            e["steps_finished"],
            e.get("resumed_from"),
            e.get("stop_seconds"),
            e.get("resumed_seconds"),
            e.get("gap_seconds"),
            e.get("median_step_seconds"),
            e.get("cost_seconds"),
        ]
        for e in results["preempted"]["preemptions"]
    ]
    preemptions = table(
        [
            "SIGTERM at s",
            "worker",
            "steps finished",
            "resumed from",
            "stop s",
            "resumed s",
            "gap s",
            "median step s",
            "cost s",
        ],
        rows,
    )
    runs = table(
        ["run", "wall s", *[f"{a} final accuracy" for a in agents]],
        [
            [mode, results[mode]["wall_seconds"], *[results[mode]["final_accuracy"][a] for a in agents]]
            for mode in ("uninterrupted", "preempted")
        ],
    )
    extra = results["preempted"]["wall_seconds"] - results["uninterrupted"]["wall_seconds"]
    text = (
        f"{runs}\n\n{preemptions}\n\nwall-clock cost of the preemptions: {extra:.1f} s in all, "
        f"{extra / max(1, len(rows)):.1f} s each"
    )
    print(text)
    path = save(f"preemption{'-quick' if args.quick else ''}", {"table": text, "seed": args.seed, **results}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
