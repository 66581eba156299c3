"""Orchestration overhead: a multi-process `hacrl run` against one in-process loop doing the same work.

The same short HACPO experiment (the quickstart's two agents, no evaluation) runs three ways,
interleaved (inproc, file, s3, inproc, file, s3, ...) so machine load hits all alike:

- ``inproc``: ONE process (``python bench/pipeline.py --child SPEC``) that loads both models and,
  per step, samples every agent's rollouts and runs the learners on them with the workers' own
  code (``rollout.sampling``: prompts, sampling parameters, seeds, rows; the one learner step
  ``learner.step.learner_step`` on in-memory ports: the peers' rows re-encoded, capability,
  advantages, pi_old, updates). The
  sampler uses the learner's live model, so there is no store, no serialization, no weight
  publish and no weight load. torch uses every CPU.
- ``file``: ``hacrl run --quiet`` with the file store: four worker processes (a rollout and a
  learner per agent, one torch thread each on 2 CPUs) talking only through the store.
- ``s3``: the same with the store on a real SeaweedFS S3 server on this machine.

Both wall times are measured from outside, process start to exit. Reported: overhead =
wall(multi-process) / wall(inproc) - 1 (target: <= 10% file, <= 20% S3), its inverse as the
efficiency ratio (limit 1.0), and where the time goes: per-stage seconds of each side (the
learner's ``learner/seconds_*`` metrics; worker start-up and tail from the worker logs'
timestamps; the in-process loop's own stage clock).

    python bench/pipeline.py           # 8 steps x 64 prompts, 2 repetitions of each mode
    python bench/pipeline.py --quick   # 2 steps x 16 prompts, 1 repetition
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    DEFAULT_CACHE,
    LLAMA,
    QWEN,
    REPO,
    RESULTS,
    agent_entry,
    bench_env,
    build_models,
    experiment,
    hacrl_run,
    save,
    table,
    write_spec,
)

STAGES = ("seconds_score", "seconds_wait_peers", "seconds_update", "seconds_publish")
#: The in-process loop's column of each stage of the learner step (``learner.step.STAGES``).
STEP_CLOCK = {
    "read_own": "gather",
    "read_peers": "gather",
    "plan": "update",
    "pi_old": "score",
    "publish_scores": "score",
    "read_peer_scores": "update",
    "update": "update",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument(
        "--modes",
        default="inproc,file,s3",
        help="inproc, file, s3; file-stale1 / s3-stale1: the same with algorithm.maxStaleness 1; file-colocated / s3-colocated: "
        "hacrl run --colocate; a -nofork suffix (file-colocated-nofork): every worker a fresh interpreter (HACRL_FORK_SERVER=0)",
    )
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/pipeline"))
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.prompts, args.reps = 2, 16, 1
    return args


# --------------------------------------------------------------------------- in-process loop


def inprocess_loop(spec_path: Path) -> dict[str, float]:
    """The generate / score / update work of every agent, in one process, without the store: the
    workers' own code (``rollout.sampling``, ``learner.step``) on rows in memory."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    clock: dict[str, float] = {}
    began = time.perf_counter()
    since = [began]

    def lap(key: str) -> None:
        now = time.perf_counter()
        clock[key] = clock.get(key, 0.0) + now - since[0]
        since[0] = now

    def step_lap(stage: str) -> None:  # the learner step's stages into this loop's columns
        lap(STEP_CLOCK[stage])

    from hacrl_core.algorithms import resolve_algorithm
    from hacrl_core.context import WorkerContext
    from hacrl_core.learner.backends import create_backend
    from hacrl_core.learner.state import start_state
    from hacrl_core.learner.step import StepSetup, learner_step, run_team
    from hacrl_core.learner.step_ports import MemoryExchange, MemoryPorts
    from hacrl_core.models.loading import load_policy
    from hacrl_core.rollout.hf_engine import HFEngine
    from hacrl_core.rollout.sampling import rollout_rows, sample_step, sampling_params
    from hacrl_core.spec import load_experiment

    experiment = load_experiment(spec_path)
    spec, settings = experiment.spec, experiment.spec.algorithm
    algorithm = resolve_algorithm(settings)
    names = [a.name for a in spec.agents]
    contexts = [WorkerContext(experiment=experiment, agent_name=n, store=None) for n in names]  # type: ignore[arg-type]
    # Scored apart from the first update, as this loop always has (its timings are compared over time).
    setups = [
        StepSetup(index, tuple(names), algorithm, settings, score_in_first_update=False) for index in range(len(names))
    ]
    states, engines = [], []
    for context in contexts:  # fresh learners (no checkpoint: there is no store)
        model, tokenizer = load_policy(context.initial_model_dir())
        states.append(
            start_state(
                model,
                tokenizer,
                create_backend(context.agent.learner.backend, model, context.agent.learner),
                settings,
                len(names),
                learner=context.agent.learner,
            )
        )
        engine = HFEngine(batch_size=context.agent.rollout.batch_size)
        engine.set_policy(states[-1].model, tokenizer)  # the live policy: no weight publish, no load
        engines.append(engine)
    lap("setup")
    for step in range(settings.steps):
        shards = []
        for index, (context, engine) in enumerate(zip(contexts, engines)):
            problems = context.step_problems(step)
            params = sampling_params(
                context.agent.rollout, group_size=settings.group_size, seed=settings.seed, step=step, agent_index=index
            )
            prompts, samples = sample_step(engine, problems, spec.data.template, params)
            lap("generate")
            shards.append(
                rollout_rows(
                    problems,
                    prompts,
                    samples,
                    context.score,
                    experiment=experiment.name,
                    agent=names[index],
                    step=step,
                    tokenizer=engine.tokenizer,
                )
            )
            lap("reward")
        exchange = MemoryExchange(experiment.name)
        run_team(
            [
                learner_step(
                    state,
                    setups[index],
                    MemoryPorts(shards, index, state.tokenizer, spec.data.template, exchange),
                    step,
                    lap=step_lap,
                )
                for index, state in enumerate(states)
            ]
        )
    clock["total"] = time.perf_counter() - began
    return clock


# --------------------------------------------------------------------------- multi-process runs


def log_times(workdir: Path) -> dict[str, list[float]]:
    """Timestamps (epoch seconds) of every worker's per-step log lines ("... step N: ..."), per worker log."""
    out = {}
    for path in sorted((workdir / "logs").glob("*.log")):
        stamps = []
        for line in path.read_text(errors="replace").splitlines():
            if " step " not in line:
                continue
            try:
                stamps.append(dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp())
            except ValueError:
                continue
        out[path.stem] = stamps
    return out


def multi_breakdown(
    store_uri: str, name: str, steps: int, workdir: Path, started: float, ended: float, endpoint: str | None
) -> dict[str, float]:
    """Learner stage sums (mean over agents) and start-up / tail seconds from the worker logs."""
    from hacrl_core.store import open_trajectory_store

    store = open_trajectory_store(store_uri, name, endpoint=endpoint)
    agents = [LLAMA["name"], QWEN["name"]]
    sums = {k: 0.0 for k in STAGES}
    first_step_start, last_step_end = [], []
    stamps = log_times(workdir)
    for agent in agents:
        step0 = store.read_metrics(0, agent)
        for step in range(steps):
            m = step0 if step == 0 else store.read_metrics(step, agent)
            for k in STAGES:
                sums[k] += m.get(f"learner/{k}", 0.0) / len(agents)
        learner = stamps.get(f"{agent}-learner") or stamps.get(
            f"{agent}-colocated", []
        )  # the colocated worker logs its steps too
        if learner:
            first_step_start.append(learner[0] - sum(step0.get(f"learner/{k}", 0.0) for k in STAGES))
            last_step_end.append(learner[-1])
    out = {f"learner_{k[8:]}": v for k, v in sums.items()}
    if first_step_start:
        out["startup"] = statistics.fmean(first_step_start) - started
        out["tail"] = ended - max(last_step_end)
    return out


def parse_mode(mode: str) -> tuple[str, int, bool, bool]:
    """``s3-stale1``, ``file-colocated-nofork``, ... -> (store kind, maxStaleness, colocated, fork server)."""
    fork = not mode.endswith("-nofork")
    mode = mode.removesuffix("-nofork")
    colocate = mode.endswith("-colocated")
    store_kind, _, stale = mode.removesuffix("-colocated").partition("-stale")
    return store_kind, int(stale or 0), colocate, fork


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        clock = inprocess_loop(args.child)
        print("CLOCK " + json.dumps(clock), flush=True)
        return 0
    began = time.perf_counter()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    cache = args.cache.resolve()
    agents = [agent_entry(LLAMA, warmup_steps=400), agent_entry(QWEN, warmup_steps=200)]
    build_models([a["model"] for a in agents], cache)
    algorithm = {
        "name": "hacpo",
        "groupSize": 8,
        "promptsPerStep": args.prompts,
        "miniBatchPrompts": max(1, args.prompts // 2),
        "steps": args.steps,
        "seed": 0,
    }
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    server = None
    s3_env: dict[str, str] = {}
    if any(parse_mode(m)[0] == "s3" for m in modes):
        sys.path.insert(0, str(REPO))
        from tests.support.seaweed import start_seaweedfs

        server = start_seaweedfs(args.work / "seaweed")
        s3_env = server.env()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    try:
        for rep in range(args.reps):
            for mode in modes:
                name = f"bench-pipe-{mode}-{rep}"
                store_kind, stale, colocate, fork = parse_mode(mode)
                if store_kind == "s3":
                    uri, endpoint, extra = f"s3://{server.bucket}/pipeline", server.endpoint, s3_env
                else:
                    uri, endpoint, extra = f"file://{args.work / 'store'}", None, {}
                doc = experiment(
                    name, agents, {**algorithm, "maxStaleness": stale}, store_uri=uri, eval_prompts=0, endpoint=endpoint
                )
                spec_path = write_spec(doc, args.work / f"{name}.yaml")
                env = bench_env(cache, {**extra, **({} if fork else {"HACRL_FORK_SERVER": "0"})})
                if mode == "inproc":
                    t0 = time.perf_counter()
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", str(spec_path)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    wall = time.perf_counter() - t0
                    if done.returncode:
                        raise RuntimeError(f"in-process loop failed:\n{done.stderr[-3000:]}")
                    clock = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("CLOCK "))[6:])
                    results[mode].append({"wall": wall, **{f"inproc_{k}": v for k, v in clock.items()}})
                else:
                    started = time.time()
                    wall = hacrl_run(
                        spec_path, args.work / "workdirs" / name, env, args=["--colocate" if colocate else "--split"]
                    )
                    ended = time.time()
                    for key, value in extra.items():
                        os.environ[key] = value
                    breakdown = multi_breakdown(
                        uri, name, args.steps, args.work / "workdirs" / name, started, ended, endpoint
                    )
                    results[mode].append({"wall": wall, **breakdown})
                print(f"rep {rep} {mode}: {wall:.1f}s", flush=True)
    finally:
        if server is not None:
            server.stop()

    med = {m: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for m, runs in results.items() if runs}
    rows = []
    base = med.get("inproc", {}).get("wall")
    for mode in modes:
        wall = med[mode]["wall"]
        over = f"{wall / base - 1:+.0%}" if base else "-"
        eff = f"{base / wall:.2f}" if base else "-"
        target = {"file": "<= +10%", "s3": "<= +20%"}.get(mode, "")  # the -staleN modes: for comparison
        rows.append([mode, f"{wall:.1f}", over, eff, target])
    # Steady state: the step loop alone (multi-process: wall minus worker start-up and tail;
    # in-process: total minus model loading), which is what longer runs converge to.
    steady_base = med["inproc"]["inproc_total"] - med["inproc"]["inproc_setup"] if "inproc" in med else None
    # Start-up (issue 17 item 2: at most 1.5x one process's): in-process, everything before its loop
    # (interpreter, imports, setup); multi-process, run start to the learners' first step.
    startup_base = med["inproc"]["wall"] - steady_base if steady_base is not None else None
    for row, mode in zip(rows, modes):
        m = med[mode]
        steady = (
            m["inproc_total"] - m["inproc_setup"]
            if mode == "inproc"
            else m["wall"] - m.get("startup", 0.0) - m.get("tail", 0.0)
        )
        m["steady"] = steady
        startup = startup_base if mode == "inproc" else m.get("startup")
        row.insert(4, f"{steady:.1f}")
        row.insert(5, f"{steady / steady_base - 1:+.0%}" if steady_base else "-")
        row.insert(6, "-" if startup is None else f"{startup:.1f}")
        row.insert(7, f"{startup / startup_base:.2f}x" if startup is not None and startup_base else "-")
        row.insert(8, f"{m['tail']:.1f}" if "tail" in m else "-")
    text = table(
        [
            "mode",
            "wall s (median)",
            "overhead vs inproc",
            "ratio inproc/mode",
            "step loop s",
            "step-loop overhead",
            "start-up s",
            "start-up vs inproc",
            "tail s",
            "target",
        ],
        rows,
    )
    keys = sorted({k for m in med.values() for k in m if k != "wall"})
    detail = table(
        ["stage (seconds, median)"] + modes,
        [[k] + [f"{med[m][k]:.2f}" if k in med[m] else "" for m in modes] for k in keys],
    )
    print(
        f"\npipeline ({args.steps} steps, {args.prompts} prompts x G 8, 2 agents, hacpo, no eval; median of {args.reps} interleaved reps)\n{text}\n\n{detail}"
    )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "pipeline-quick" if args.quick else "pipeline",
        {
            "settings": settings,
            "table": text,
            "detail": detail,
            "median": med,
            "runs": results,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
