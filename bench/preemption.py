"""What a preemption costs: the quickstart regime uninterrupted, and with SIGTERMs at random moments.

Issue 41, item 5: `examples/quickstart.yaml` (its agents, data, algorithm and checkpoint.everySteps
4) run by `hacrl run` twice, one after the other on the same machine: once uninterrupted, once
with ``--preemptions`` (3) SIGTERMs at seeded random moments (uniform over 10-85% of the
uninterrupted run's wall time), each to the process of a random worker, as the kubelet signals a
pod's container (runtime/preemption.py: the worker ends or abandons its step in flight,
checkpoints its last finished step, exits 7, and `hacrl run` restarts it, counting no restart).

Per preemption: the step its agent had finished, the seconds from SIGTERM to the worker's exit
(stop), from SIGTERM until the agent's learner finished its next step (back: the restart, the
resume and the step redone or waited for), that minus the uninterrupted run's mean step time
(cost: what the preemption added to the agent's clock), and the step the restarted worker
resumed from (its log). Per run: wall seconds and each agent's final held-out accuracy.

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
    """SIGTERMs a random live worker of the run at each moment of ``moments`` (seconds from start)
    and times what follows (module docstring)."""

    def __init__(self, workdir: Path, store: Any, agents: list[str], moments: list[float], seed: int) -> None:
        super().__init__(name="preempter", daemon=True)
        self.workdir, self.store, self.agents, self.moments = workdir, store, agents, moments
        self.rng = random.Random(seed)
        self.began = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        for moment in self.moments:
            while time.monotonic() - self.began < moment and not self.done.is_set():
                time.sleep(0.05)
            if self.done.is_set():
                return
            event = self.strike()
            if event is not None:
                self.events.append(event)
                threading.Thread(target=self.follow, args=(event,), daemon=True).start()

    def strike(self) -> dict[str, Any] | None:
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
            "at_seconds": round(at - self.began, 2),
            "agent": victim["agent"],
            "role": victim["role"],
            "pid": victim["pid"],
            "steps_finished": steps,
            "_at": at,
        }

    def follow(self, event: dict[str, Any]) -> None:
        while pid_alive(event["pid"]) and not self.done.is_set():
            time.sleep(0.02)
        event["stop_seconds"] = round(time.monotonic() - event["_at"], 2)
        agent = event["agent"]
        while not self.done.is_set():
            if progress(self.store, [agent])[agent] > event["steps_finished"]:
                event["back_seconds"] = round(time.monotonic() - event["_at"], 2)
                return
            time.sleep(0.05)


def run_once(
    spec: Path, workdir: Path, env: dict[str, str], store: Any, agents: list[str], preempter: Preempter | None
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
    if preempter is not None:
        preempter.began = began
        preempter.start()
    output, _ = process.communicate(timeout=3600)
    seconds = time.monotonic() - began
    if preempter is not None:
        preempter.done.set()
        preempter.join(10)
    if process.returncode != 0:
        raise RuntimeError(f"hacrl run {spec} failed ({process.returncode}):\n{output[-4000:]}")
    return seconds, output


def resumed_from(workdir: Path, event: dict[str, Any]) -> int | None:
    """The step count the restarted worker's log says it resumed from (its latest start)."""
    log = workdir / "logs" / f"{event['agent']}-{event['role']}.log"
    found = re.findall(r"resumed from checkpoint after (\d+) steps", log.read_text(errors="replace"))
    return int(found[-1]) if found else None


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
        preempter = None
        if mode == "preempted":
            rng = random.Random(args.seed)
            wall = results["uninterrupted"]["wall_seconds"]
            moments = sorted(rng.uniform(0.10 * wall, 0.85 * wall) for _ in range(count))
            preempter = Preempter(root / "work", store, agents, moments, args.seed)
        seconds, output = run_once(spec, root / "work", env, store, agents, preempter)
        entry: dict[str, Any] = {
            "wall_seconds": round(seconds, 1),
            "final_accuracy": final_accuracies(store, agents, steps),
            "restart_lines": [line for line in output.splitlines() if "restarting" in line],
        }
        if preempter is None:
            entry["mean_step_seconds"] = round(mean_step_seconds(store, agents, steps), 2)
        else:
            step_seconds = results["uninterrupted"]["mean_step_seconds"]
            for event in preempter.events:
                event.pop("_at", None)
                event["resumed_from"] = resumed_from(root / "work", event)
                back = event.get("back_seconds")
                event["cost_seconds"] = None if back is None else round(back - step_seconds, 2)
            entry["preemptions"] = preempter.events
        results[mode] = entry
        print(f"{mode}: {entry['wall_seconds']} s, final accuracy {entry['final_accuracy']}", flush=True)

    rows = [
        [
            f"{e['at_seconds']:.1f}",
            f"{e['agent']}.{e['role']}",
            e["steps_finished"],
            e["resumed_from"],
            e.get("stop_seconds"),
            e.get("back_seconds"),
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
            "back s",
            "cost s (back - mean step)",
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
