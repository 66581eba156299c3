"""Operator latency: experiment creation to pods, and heartbeat to status, for 1, 10 and 50 experiments.

The operator (every handler of ``operator/hacrl_operator``, under ``kopf.testing.KopfRunner``)
runs against the kmock Kubernetes API emulator of ``tests/operator/harness.py`` — the same
harness as the operator's integration tests. For each scale N (a fresh emulator and operator):

1. ``create -> pods``: N experiments of 4 agents are POSTed at once; for each, the time from its
   POST to the moment all of its 8 pods (a rollout and a learner per agent) are listed.
2. The benchmark plays kubelet (every pod's phase set to Running) and waits for phase Running.
3. ``heartbeat -> status``: every agent's learner heartbeat (``progress/<agent>.json``) is
   written to the file store; for each experiment, the time from its last heartbeat write to the
   moment its ``status.step`` shows the new step. Heartbeats are objects in the store, which sends
   no events, so this is set by the operator's periodic reconcile (``HACRL_RECONCILE_INTERVAL``,
   10 s by default in the chart; 0.2 s here, as in the tests) and is reported next to it.

The benchmark talks to the emulator over plain HTTP (no kubectl processes) and polls every 20 ms.

The floor (``--floor``, on by default): the same N experiments POSTed to a fresh emulator with
no operator, and the same pods created without it, timed the same way (from each experiment's
POST until all its pods are listed). The pods are what the operator's builders make of the
experiment as stored (``Reconciler.parse`` then ``builders.build_pod``, for every agent and
role in the plan's order), created through the operator's own client (``hacrl_operator.kube.Kube``:
the kubernetes package's ``ApiClient``, urllib3, the operator's User-Agent). Concurrency is the
operator's: its create handler is synchronous, so kopf runs it in its executor for synchronous
handlers (a ``ThreadPoolExecutor`` of ``min(32, CPUs + 4)`` threads, 6 on 2 CPUs), one
reconcile per experiment at a time (the reconciler's per-experiment lock), and that reconcile
creates the experiment's pods one after another; the floor runs one task per experiment, its
pods in sequence, in a pool of the same size, each task started as soon as its experiment's POST
returns. Operator and floor runs alternate (``--repeats`` rounds, the order swapped every round)
so that load from other users of the machine falls on both; ``create->pods`` is reported as a
ratio of the floor. Every request the emulator serves during ``create -> pods`` is counted by
client (operator, kopf, benchmark) and verb, to show where the operator's extra requests go.

    python bench/operator.py            # N = 1, 10, 50, three rounds
    python bench/operator.py --quick    # N = 1, 3, one round
    python bench/operator.py --scale    # N = 10, 100, 500 on s3:// stores: requests and memory (operator_scale.py)
"""

from __future__ import annotations

import argparse
import collections
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# `python bench/operator.py` puts bench/ first on sys.path, where this file shadows the standard
# library's `operator` for any later import of it: drop that entry (bench.common is found via REPO).
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
for extra in (REPO, REPO / "operator", REPO / "tests" / "operator"):
    sys.path.insert(0, str(extra))

from bench.common import RESULTS, EmulatorApi, save, table  # noqa: E402 (the path set up above first)

NS = "hx-bench"
GROUP = "/apis/hacrl.io/v1alpha1"
POLL = 0.02


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scales", default="1,10,50")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--interval", type=float, default=0.2, help="HACRL_RECONCILE_INTERVAL in seconds")
    p.add_argument(
        "--timeout", type=float, default=180, help="per stage; experiments not done by then are reported as timed out"
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/operator"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--repeats", type=int, default=3, help="rounds of operator and floor runs, alternating")
    p.add_argument("--no-floor", dest="floor", action="store_false", help="operator runs only")
    args = p.parse_args(argv)
    if args.quick:
        args.scales, args.repeats = "1,3", 1
    return args


def experiment_doc(name: str, agents: int, store_uri: str) -> dict[str, Any]:
    presets = ["tiny://llama-char?seed=0", "tiny://qwen2-bpe?seed=0"]
    return {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "agents": [
                {"name": f"agent-{i}", "model": presets[i % 2], "rollout": {"maxNewTokens": 8}} for i in range(agents)
            ],
            "algorithm": {"name": "hacpo", "groupSize": 8, "promptsPerStep": 64, "miniBatchPrompts": 32, "steps": 12},
            "data": {"train": {"source": "builtin://arithmetic?difficulty=1&seed=0"}, "reward": "exact"},
            "store": {"uri": store_uri},
        },
    }


def wait_each(names: list[str], since: dict[str, float], done, timeout: float, what: str) -> dict[str, float]:
    """Poll ``done() -> set of finished names`` until all are; latency of each from ``since``."""
    latency: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(latency) < len(names):
        finished = done()
        now = time.perf_counter()
        for name in finished:
            if name not in latency and name in since:
                latency[name] = now - since[name]
        if time.monotonic() > deadline:  # report what finished; the rest count as the timeout
            print(f"  {what}: only {len(latency)}/{len(names)} done after {timeout}s", flush=True)
            for name in names:
                latency.setdefault(name, float("inf"))
            break
        time.sleep(POLL)
    return latency


def counting_cluster(work: Path) -> Any:
    """An ``EmulatedCluster`` whose emulator counts the requests it serves by (client, verb, resource)."""
    from harness import EmulatedCluster, PatchedEmulator, rbac_access

    class CountingEmulator(PatchedEmulator):
        def __attrs_post_init__(self) -> None:
            super().__attrs_post_init__()
            self.counts: collections.Counter[str] = collections.Counter()

        async def __call__(self, raw_request: Any) -> Any:
            agent = raw_request.headers.get("User-Agent", "")
            client = (
                "kopf" if agent.startswith("kopf/") else "operator" if agent.startswith("hacrl-operator/") else "bench"
            )
            access = rbac_access(raw_request.method, raw_request.path, raw_request.rel_url.query)
            self.counts[
                f"{client} {access[0]} {access[2]}" if access else f"{client} {raw_request.method} {raw_request.path}"
            ] += 1
            return await super().__call__(raw_request)

    cluster = EmulatedCluster(work)
    cluster.emulator_class = CountingEmulator
    return cluster


def kopf_sync_workers() -> int:
    """Threads of kopf's executor for synchronous handlers, as the operator gets it (kopf's default)."""
    import kopf

    executor = kopf.OperatorSettings().execution.executor
    workers = int(executor._max_workers)  # ThreadPoolExecutor's default: min(32, CPUs + 4)
    executor.shutdown(wait=False)
    return workers


class Floor:
    """The operator's pod creates without the operator: for each experiment, as soon as its POST
    returns, a task in a pool of kopf's executor size parses it as the reconciler does and creates
    its pods one after another through the operator's client (see the module docstring)."""

    def __init__(self, cluster: Any) -> None:
        from harness import operator_config

        from hacrl_operator.handlers.reconcile import Reconciler
        from hacrl_operator.kube import Kube, load_configuration
        from hacrl_operator.metrics import OperatorMetrics

        self.config = operator_config(cluster)
        self.kube = Kube(load_configuration(self.config))
        self.reconciler = Reconciler(self.config, OperatorMetrics())
        self.reconciler.kube = self.kube
        self.workers = kopf_sync_workers()
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="floor")
        self.tasks: list[Future[int]] = []

    def submit(self, body: dict[str, Any]) -> None:
        self.tasks.append(self.pool.submit(self.create_pods, body))

    def create_pods(self, body: dict[str, Any]) -> int:
        from hacrl_operator import builders

        experiment, errors = self.reconciler.parse(body)
        if experiment is None:
            raise RuntimeError(f"floor: {body['metadata']['name']} does not parse: {errors}")
        created = 0
        for agent in experiment.spec.agents:
            for role in builders.ROLES:
                created += self.kube.create(builders.build_pod(experiment, agent.name, role, body, self.config))
        return created

    def check(self) -> None:
        """Raise what a finished task raised (called at every poll: a broken floor fails at once, not at the timeout)."""
        for task in self.tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()

    def close(self) -> int:
        """Pods created; raises what any task raised, so a broken floor fails the run."""
        self.pool.shutdown(wait=True)
        self.kube.close()
        return sum(task.result() for task in self.tasks)


def create_stage(
    api: EmulatorApi,
    names: list[str],
    args: argparse.Namespace,
    store_uri: str,
    posted: Callable[[dict[str, Any]], None] | None = None,
    check: Callable[[], None] | None = None,
) -> tuple[float, dict[str, float], float]:
    """POST the experiments (``posted`` gets each as stored); per experiment, seconds until all its
    pods are listed. ``check`` is called at every poll (it raises to stop the run)."""
    pods_per = 2 * args.agents

    def pods_done() -> set[str]:
        if check is not None:
            check()
        counts: dict[str, int] = {}
        for pod in api.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]:
            owner = pod["metadata"].get("labels", {}).get("hacrl.io/experiment")
            counts[owner] = counts.get(owner, 0) + 1
        return {k for k, v in counts.items() if v >= pods_per}

    created: dict[str, float] = {}
    began = time.perf_counter()
    for name in names:
        created[name] = time.perf_counter()
        body = api.call(
            "POST", f"{GROUP}/namespaces/{NS}/hacrlexperiments", experiment_doc(name, args.agents, store_uri)
        )
        if posted is not None:
            posted(body)
    post_seconds = time.perf_counter() - began
    to_pods = wait_each(names, created, pods_done, args.timeout, "create -> pods")
    return post_seconds, to_pods, time.perf_counter() - began


def stats(values: dict[str, float]) -> dict[str, float]:
    ordered = sorted(values.values())
    return {
        "median": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
        "timed_out": sum(v == float("inf") for v in ordered),
    }


def run_scale(n: int, args: argparse.Namespace, mode: str = "operator") -> dict[str, Any]:
    """One fresh emulator; ``mode`` "operator" (create -> pods, then heartbeat -> status) or "floor" (create -> pods)."""
    from harness import run_operator, wait_for

    from hacrl_core.store import open_trajectory_store
    from hacrl_core.store.trajectory_store import experiment_root

    work = args.work / f"{mode}-n{n}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store_uri = f"file://{work / 'store'}"
    cluster = counting_cluster(work).start()
    names = [f"hx-{i:03d}" for i in range(n)]
    pods_per = 2 * args.agents
    result: dict[str, Any] = {
        "mode": mode,
        "experiments": n,
        "agents": args.agents,
        "pods": n * pods_per,
        "interval": args.interval,
    }
    try:
        api = EmulatorApi(cluster.port)
        api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        if mode == "floor":
            floor = Floor(cluster)
            try:
                counted = collections.Counter(cluster.emulator.counts)
                post_seconds, to_pods, all_pods = create_stage(api, names, args, store_uri, floor.submit, floor.check)
                requests = cluster.emulator.counts - counted
            finally:
                created = floor.close()
            if created != n * pods_per:
                raise RuntimeError(f"floor: created {created} of {n * pods_per} pods")
            print(f"  N={n} floor ({floor.workers} threads): all {n * pods_per} pods in {all_pods:.1f}s", flush=True)
            return {
                **result,
                "threads": floor.workers,
                "post_seconds": post_seconds,
                "create_to_pods": stats(to_pods),
                "create_to_all_pods_seconds": all_pods,
                "requests": dict(sorted(requests.items())),
                "raw": {"create_to_pods": to_pods},
            }
        with run_operator(cluster, HACRL_RECONCILE_INTERVAL=str(args.interval)) as _handle:
            # run_operator returns once the operator is healthy, before kopf has opened its
            # watches; a running operator has them open, so its first list and watch are not
            # timed (before 2026-12-03 they were: they were part of N = 1's create->pods).
            wait_for(
                lambda: all(cluster.emulator.counts[f"kopf watch {r}"] for r in ("hacrlexperiments", "pods")),
                timeout=30,
                what="kopf's watches of experiments and pods",
            )
            counted = collections.Counter(cluster.emulator.counts)
            post_seconds, to_pods, all_pods = create_stage(api, names, args, store_uri)
            requests = cluster.emulator.counts - counted
            print(f"  N={n} operator: all {n * pods_per} pods in {all_pods:.1f}s", flush=True)

            for pod in api.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]:
                api.call(
                    "PATCH",
                    f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
                    {"status": {"phase": "Running"}},
                    "application/merge-patch+json",
                )

            def statuses() -> dict[str, dict[str, Any]]:
                items = api.call("GET", f"{GROUP}/namespaces/{NS}/hacrlexperiments")["items"]
                return {i["metadata"]["name"]: i.get("status") or {} for i in items}

            wait_each(
                names,
                {k: 0.0 for k in names},
                lambda: {k for k, s in statuses().items() if s.get("phase") == "Running"},
                args.timeout,
                "phase Running",
            )
            print(f"  N={n} operator: all Running", flush=True)
            beat: dict[str, float] = {}
            began = time.perf_counter()
            for name in names:
                store = open_trajectory_store(experiment_root(store_uri, NS), name)  # where its workers write
                for i in range(args.agents):
                    store.write_progress(
                        f"agent-{i}",
                        {
                            "agent": f"agent-{i}",
                            "step": 3,
                            "steps": 12,
                            "weights_version": 3,
                            "reward": 0.3,
                            "accuracy": None,
                            "capability": 0.3,
                            "last_checkpoint": None,
                            "done": False,
                            "time": time.time(),
                        },
                    )
                beat[name] = time.perf_counter()
            to_status = wait_each(
                names,
                beat,
                lambda: {k for k, s in statuses().items() if s.get("step") == 3},
                args.timeout,
                "heartbeat -> status",
            )
            all_status = time.perf_counter() - began
    finally:
        cluster.stop()

    return {
        **result,
        "post_seconds": post_seconds,
        "create_to_pods": stats(to_pods),
        "create_to_all_pods_seconds": all_pods,
        "requests": dict(sorted(requests.items())),
        "heartbeat_to_status": stats(to_status),
        "heartbeat_to_all_status_seconds": all_status,
        "raw": {"create_to_pods": to_pods, "heartbeat_to_status": to_status},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--scale" in argv:  # N = 10, 100, 500 on s3:// stores: requests and memory (bench/operator_scale.py)
        from bench.operator_scale import main as scale

        return scale([a for a in argv if a != "--scale"])
    args = parse_args(argv)
    began = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for round_ in range(args.repeats):
        for n in [int(x) for x in args.scales.split(",")]:
            modes = ["operator", "floor"] if args.floor else ["operator"]
            for mode in modes if round_ % 2 == 0 else modes[::-1]:  # alternate which goes first
                run = {**run_scale(n, args, mode), "round": round_}
                runs.append(run)
                extra = (
                    f", heartbeat->status median {run['heartbeat_to_status']['median']:.3f}s"
                    if mode == "operator"
                    else ""
                )
                print(
                    f"round {round_} N={n} {mode}: create->pods median {run['create_to_pods']['median']:.3f}s{extra}",
                    flush=True,
                )
                write(args, runs, began)  # after every run: a larger scale that hangs keeps the smaller ones
    return 0


def pooled(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """``stats`` over every experiment of every round (the rounds' raw latencies together)."""
    return stats({f"{r['round']}/{name}": v for r in runs for name, v in r["raw"][key].items()})


def write(args: argparse.Namespace, runs: list[dict[str, Any]], began: float) -> None:
    def ms(s: float) -> str:
        return f"{s * 1000:,.0f}"

    scales = sorted({r["experiments"] for r in runs})
    by = {
        (mode, n): [r for r in runs if r["mode"] == mode and r["experiments"] == n]
        for mode in ("operator", "floor")
        for n in scales
    }
    rows, ratio_rows, summary = [], [], []
    for n in scales:
        ops, floors = by["operator", n], by["floor", n]
        if not ops:
            continue
        c, h = pooled(ops, "create_to_pods"), pooled(ops, "heartbeat_to_status")
        rows.append(
            [
                n,
                ops[0]["pods"],
                f"{ops[0]['interval']:g}",
                len(ops),
                ms(c["median"]),
                ms(c["p90"]),
                ms(c["max"]),
                ms(h["median"]),
                ms(h["p90"]),
                ms(h["max"]),
            ]
        )
        entry: dict[str, Any] = {
            "experiments": n,
            "operator_create_to_pods": c,
            "heartbeat_to_status": h,
            "operator_all_pods_seconds": [r["create_to_all_pods_seconds"] for r in ops],
        }
        # Rounds in which both ran: their ratios show how much the load moved between runs.
        paired = [(o, f) for o in ops for f in floors if o["round"] == f["round"]]
        if floors and paired:
            f = pooled(floors, "create_to_pods")
            all_op = statistics.median(r["create_to_all_pods_seconds"] for r in ops)
            all_floor = statistics.median(r["create_to_all_pods_seconds"] for r in floors)
            per_round = [o["create_to_pods"]["median"] / fl["create_to_pods"]["median"] for o, fl in paired]
            ratio_rows.append(
                [
                    n,
                    ops[0]["pods"],
                    floors[0]["threads"],
                    len(paired),
                    ms(c["median"]),
                    ms(f["median"]),
                    f"{c['median'] / f['median']:.1f}",
                    "-".join(f"{x:.1f}" for x in (min(per_round), max(per_round))),
                    ms(all_op),
                    ms(all_floor),
                    f"{all_op / all_floor:.1f}",
                ]
            )
            entry.update(
                floor_create_to_pods=f,
                floor_all_pods_seconds=[r["create_to_all_pods_seconds"] for r in floors],
                ratio_median=c["median"] / f["median"],
                ratio_per_round=per_round,
                ratio_all_pods=all_op / all_floor,
                requests_per_experiment={
                    mode: {k: v / n for k, v in group[-1]["requests"].items()}
                    for mode, group in (("operator", ops), ("floor", floors))
                },
            )
        summary.append(entry)
    text = table(
        [
            "experiments",
            "pods",
            "reconcile interval s",
            "rounds",
            "create->pods median ms",
            "p90",
            "max",
            "heartbeat->status median ms",
            "p90",
            "max",
        ],
        rows,
    )
    print(
        f"\noperator latency ({args.agents} agents per experiment, kmock emulator; every experiment of every round)\n{text}"
    )
    if ratio_rows:
        floor_text = table(
            [
                "experiments",
                "pods",
                "floor threads",
                "rounds",
                "operator create->pods median ms",
                "floor create->pods median ms",
                "ratio",
                "ratio per round",
                "operator all pods ms",
                "floor all pods ms",
                "ratio (all pods)",
            ],
            ratio_rows,
        )
        print(
            f"\noperator create->pods against the floor (the same pods, client and concurrency, no operator)\n{floor_text}"
        )
        text += "\n\n" + floor_text
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "operator-quick" if args.quick else "operator",
        {
            "settings": settings,
            "table": text,
            "summary": summary,
            "runs": runs,
            "total_seconds": time.perf_counter() - began,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
