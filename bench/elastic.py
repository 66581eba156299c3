"""An agent that joins a running experiment (issue 41), against the same agent present from step 0.

The quickstart regime (examples/quickstart.yaml: llama-char and qwen-bpe, HACPO, worked-chain
arithmetic), run for ``--steps`` steps (30) with a third agent ``llama-char-b`` (the llama-char
preset at another seed):

- ``from-0``: the three agents from step 0;
- ``join-<k>``: llama-char and qwen-bpe alone, stopped with Ctrl-C (SIGINT) once both finished
  step ``--join`` - 1 (10), then `hacrl run --resume` with the third agent added to the file: it
  joins at the first step nobody finished (the store's record of each step's members says which:
  ``steps/<t>/members.json``) and trains the steps left.

Reports, per configuration and agent, the held-out greedy accuracy before training and after the
last step, the step the third agent joined at and the wall time. Both configurations run with the
same seed (``--seed``: data order, sampling), so the agents present from step 0 see the same
prompts; the runs differ in the team only.

    python bench/elastic.py                   # 30 steps, join at 10, seed 0
    python bench/elastic.py --seeds 0,1,2     # more seeds
    python bench/elastic.py --quick           # smoke test: 4 steps, join at 2, 50 eval prompts

Results: ``bench/results/elastic.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_CACHE, REPO, bench_env, build_models, hacrl_run, save, table, write_spec  # noqa: E402
from hacrl_core.store import open_trajectory_store  # noqa: E402

NAME = "elastic"
THIRD = "llama-char-b"
EVAL = "eval/arithmetic/accuracy"


def quickstart(steps: int, seed: int, store: Path, agents: int, quick: bool = False) -> dict[str, Any]:
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["metadata"] = {"name": NAME}
    spec = document["spec"]
    spec["algorithm"].update(steps=steps, seed=seed)
    spec["evaluation"] = {"everySteps": 10}
    if quick:
        spec["data"]["eval"][0]["maxPrompts"] = 50
    spec["store"] = {"uri": store.as_uri()}
    llama = copy.deepcopy(spec["agents"][0])
    third = {**llama, "name": THIRD, "model": llama["model"].replace("seed=0", "seed=1")}
    spec["agents"] = spec["agents"][:2] + ([third] if agents == 3 else [])
    return document


def accuracies(store: Any, agent: str, steps: int) -> tuple[float | None, float | None, int | None]:
    """(initial, final, first step) of ``agent`` from its step metrics."""
    first = next((s for s in range(steps) if store.metrics_ready(s, agent)), None)
    if first is None:
        return None, None, None
    initial = store.read_metrics(first, agent).get(f"{EVAL}_initial")
    final = store.read_metrics(steps - 1, agent).get(EVAL) if store.metrics_ready(steps - 1, agent) else None
    return initial, final, first


def interrupted_run(spec: Path, workdir: Path, env: dict[str, str], store: Any, join: int) -> float:
    """`hacrl run` of ``spec`` stopped with SIGINT once both agents finished step ``join`` - 1."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "hacrl_core.cli", "run", "--quiet", "--workdir", str(workdir), str(spec)],
        env=env,
        cwd=str(spec.parent),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while not all(store.metrics_ready(join - 1, a) for a in ("llama-char", "qwen-bpe")):
        if process.poll() is not None:
            raise RuntimeError(f"the run ended (code {process.returncode}) before step {join}")
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    if process.wait(timeout=600) != 130:
        raise RuntimeError(f"the interrupted run exited {process.returncode}, not 130")
    return time.perf_counter() - began


def run_config(config: str, args: argparse.Namespace, seed: int, env: dict[str, str]) -> dict[str, Any]:
    root = args.work / f"{config}-seed{seed}"
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    store_dir, workdir = root / "store", root / "work"
    store = open_trajectory_store(store_dir.as_uri(), NAME)
    spec = root / f"{NAME}.yaml"
    if config == "from-0":
        write_spec(quickstart(args.steps, seed, store_dir, 3, args.quick), spec)
        seconds = hacrl_run(spec, workdir, env)
    else:
        write_spec(quickstart(args.steps, seed, store_dir, 2, args.quick), spec)
        seconds = interrupted_run(spec, workdir, env, store, args.join)
        write_spec(quickstart(args.steps, seed, store_dir, 3, args.quick), spec)
        seconds += hacrl_run(spec, workdir, env, args=["--resume"])
    members = [store.read_members(s) for s in range(args.steps)]
    agents = {}
    for agent in ("llama-char", "qwen-bpe", THIRD):
        initial, final, first = accuracies(store, agent, args.steps)
        agents[agent] = {"initial": initial, "final": final, "first_step": first}
    return {"config": config, "seed": seed, "seconds": seconds, "agents": agents, "members": members}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--join", type=int, default=10)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench-elastic"))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--configs", default="from-0,join", help="which of from-0 and join to run")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 steps, join at 2, 50 eval prompts")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.join = 4, 2
    env = bench_env(args.cache)
    document = quickstart(args.steps, 0, args.work, 3)
    build_models([a["model"] for a in document["spec"]["agents"]], args.cache)
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for config in [c if c == "from-0" else f"join-{args.join}" for c in args.configs.split(",")]:
            result = run_config(config, args, seed, env)
            runs.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "members"}), flush=True)
    rows = []
    for run in runs:
        for agent, values in run["agents"].items():
            rows.append(
                [
                    run["config"],
                    run["seed"],
                    agent,
                    values["first_step"],
                    "-" if values["initial"] is None else f"{values['initial']:.3f}",
                    "-" if values["final"] is None else f"{values['final']:.3f}",
                    f"{run['seconds']:.0f}",
                ]
            )
    print(table(["config", "seed", "agent", "first step", "initial", "final", "wall s"], rows))
    name = NAME if args.configs == "from-0,join" else f"{NAME}-{args.configs.replace(',', '-')}"
    name += "-quick" if args.quick else ""
    path = save(name, {"steps": args.steps, "join": args.join, "runs": runs}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
