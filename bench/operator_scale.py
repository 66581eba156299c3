"""Operator at scale: N experiments of 4 agents on s3:// stores, their requests and the operator's memory.

``python bench/operator.py --scale [--scales 10,100,500]`` runs this. For each N, fresh:

- a real SeaweedFS (tests/support/seaweed.py) holds every experiment's store (``s3://``, its
  endpoint named in the spec, as a cluster's experiments name theirs);
- the kmock API emulator of tests/operator/harness.py runs in this process and counts every
  request it serves from the operator (kopf's and the operator's own client, by User-Agent);
- the operator runs as its own process (``hacrl_operator.handlers.register`` under ``kopf.run``,
  what ``python -m hacrl_operator`` runs), with the chart's reconcile interval (10 s) and the
  S3 credentials in its environment; its resident memory is read from /proc (VmRSS) and its S3
  requests from its ``hacrl_operator_store_requests_total`` metric.

Stages: ``--warmup`` experiments are created and deleted first (memory "start" before, "idle"
after: the first reconciles' one-time cost is not counted as growth); the N experiments are POSTed at once (create -> pods: from each POST until its 8th pod
exists, as the emulator records each pod's creation); the benchmark plays kubelet (every pod
Running) and writes each agent's heartbeat to the store (phase Running); requests are counted
over ``--window`` seconds; half the experiments finish (done heartbeats, phase Succeeded:
memory "half finished"), then the rest; requests are counted over the window again; every
experiment is deleted and memory read once the operator has forgotten them all; then, for
``--rounds`` > 1, N more are created and deleted under other names (memory "round 2 all pending" and
"round 2 deleted"): a deleted round's memory reused, not added to, is what keeps a long-lived
operator flat even where the allocator keeps its high-water mark.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "operator", REPO / "tests" / "operator"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from bench.common import RESULTS, EmulatorApi, save, table  # noqa: E402 (the path set up above first)

NS = "hx-scale"
GOAL_MIB, GOAL_AT = 300, 500  # issue 38: under 300 MiB at 500 experiments, half of them finished
GROUP = "/apis/hacrl.io/v1alpha1"
STEPS = 12
LAUNCH = """
import kopf
from hacrl_operator.config import OperatorConfig
from hacrl_operator.handlers import register
config = OperatorConfig.from_env()
registry = kopf.OperatorRegistry()
register(registry, config)
kopf.configure(verbose=False, quiet=True)
kopf.run(registry=registry, clusterwide=False, namespaces=list(config.namespaces), standalone=True)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", default="10,100,500")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--interval", type=float, default=10.0, help="HACRL_RECONCILE_INTERVAL (the chart's default)")
    p.add_argument("--window", type=float, default=30.0, help="seconds over which steady requests are counted")
    p.add_argument("--timeout", type=float, default=900.0, help="per stage")
    p.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="experiments created and deleted before the idle reading, so that 'fell back' is measured "
        "past the one-time cost of the first reconciles (imports, caches, the S3 client's loader)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="create -> pods -> delete the N experiments this many times; round 2 shows whether a "
        "deleted round's memory is reused (flat) or added to (a leak)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/operator-scale"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--no-kubelet",
        dest="kubelet",
        action="store_false",
        help="leave the pods Pending (the emulator serves 4,000 pod updates too slowly at N = 500): "
        "the experiments read their stores every interval as running ones do, in phase Pending",
    )
    return p.parse_args(argv)


def counting_cluster(work: Path) -> Any:
    """An emulator that counts the operator's requests and records when each pod was created."""
    from harness import OPERATOR_USER_AGENTS, EmulatedCluster, PatchedEmulator

    class ScaleEmulator(PatchedEmulator):
        def __attrs_post_init__(self) -> None:
            super().__attrs_post_init__()
            self.requests: collections.Counter[str] = collections.Counter()
            self.pods_created: dict[str, list[float]] = collections.defaultdict(list)

        async def __call__(self, raw_request: Any) -> Any:
            agent = raw_request.headers.get("User-Agent", "")
            if agent.startswith(OPERATOR_USER_AGENTS):
                watch = raw_request.rel_url.query.get("watch") in ("true", "True", "1")
                self.requests["watch" if watch else raw_request.method] += 1
            return await super().__call__(raw_request)

        def _stamp_new(self, request: Any) -> None:
            super()._stamp_new(request)
            if request.resource.plural == "pods" and request.resource.group == "":
                owner = ((request.data.get("metadata") or {}).get("labels") or {}).get("hacrl.io/experiment")
                self.pods_created[owner].append(time.perf_counter())

    cluster = EmulatedCluster(work)
    cluster.emulator_class = ScaleEmulator
    return cluster


def experiment_doc(name: str, agents: int, bucket: str, endpoint: str) -> dict[str, Any]:
    presets = ["tiny://llama-char?seed=0", "tiny://qwen2-bpe?seed=0"]
    return {
        "apiVersion": "hacrl.io/v1alpha1",
        "kind": "HACRLExperiment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "agents": [
                {"name": f"agent-{i}", "model": presets[i % 2], "rollout": {"maxNewTokens": 8}} for i in range(agents)
            ],
            "algorithm": {
                "name": "hacpo",
                "groupSize": 8,
                "promptsPerStep": 64,
                "miniBatchPrompts": 32,
                "steps": STEPS,
            },
            "data": {"train": {"source": "builtin://arithmetic?difficulty=1&seed=0"}, "reward": "exact"},
            "store": {"uri": f"s3://{bucket}/scale", "endpoint": endpoint},
        },
    }


class Operator:
    """The operator process: its memory and its metrics."""

    def __init__(self, cluster: Any, s3: Any, interval: float, log: Path) -> None:
        from harness import free_port

        self.metrics_port = free_port()
        env = {
            **os.environ,
            **s3.env(),
            "KUBECONFIG": str(cluster.kubeconfig),
            "HACRL_WATCH_NAMESPACES": NS,
            "HACRL_RECONCILE_INTERVAL": str(interval),
            "HACRL_OPERATOR_METRICS_PORT": str(self.metrics_port),
            "HACRL_OPERATOR_HEALTH_PORT": str(free_port()),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "operator"), os.environ.get("PYTHONPATH", "")]),
        }
        self.log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH], env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=log.parent
        )

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("operator process gone")

    def cpu_seconds(self) -> float:
        """User and system CPU time the operator process has used (/proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metric(self, name: str) -> float:
        """The sum of a metric's samples (0 before the server answers)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as response:
                text = response.read().decode()
        except OSError:
            return -1.0
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    def check(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.process.returncode}; see {self.log.name}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def wait(predicate: Any, timeout: float, what: str, operator: Operator, interval: float = 1.0) -> float:
    began = time.perf_counter()
    while not predicate():
        operator.check()
        if time.perf_counter() - began > timeout:
            raise TimeoutError(f"{what}: not after {timeout}s")
        time.sleep(interval)
    return time.perf_counter() - began


def phases(api: EmulatorApi) -> collections.Counter[str]:
    items = api.call("GET", f"{GROUP}/namespaces/{NS}/hacrlexperiments")["items"]
    return collections.Counter((i.get("status") or {}).get("phase") or "-" for i in items)


def heartbeats(s3: Any, names: list[str], agents: int, step: int, done: bool) -> None:
    """Each agent's heartbeat, where its learner writes it (one client for all: the workers' own)."""
    from hacrl_core.store import S3ObjectStore, TrajectoryStore
    from hacrl_core.store.s3_store import make_s3_client

    client = make_s3_client(endpoint=s3.endpoint)

    def write(name: str) -> None:
        store = TrajectoryStore(S3ObjectStore(s3.bucket, f"scale/{NS}", client, shared_client=True), name)
        for i in range(agents):
            store.write_progress(
                f"agent-{i}", {"agent": f"agent-{i}", "step": step, "steps": STEPS, "done": done, "time": time.time()}
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, names))


def counted(emulator: Any, operator: Operator) -> tuple[int, float, float, float]:
    """(API requests but watches, S3 requests, CPU seconds, wall seconds) of the operator so far."""
    api = sum(v for k, v in emulator.requests.items() if k != "watch")
    return api, operator.metric("hacrl_operator_store_requests_total"), operator.cpu_seconds(), time.perf_counter()


def create_all(api: EmulatorApi, names: list[str], args: argparse.Namespace, s3: Any) -> dict[str, float]:
    """POST every experiment at once; when each was posted (time.perf_counter)."""
    posted: dict[str, float] = {}
    for name in names:
        posted[name] = time.perf_counter()
        api.call(
            "POST",
            f"{GROUP}/namespaces/{NS}/hacrlexperiments",
            experiment_doc(name, args.agents, s3.bucket, s3.endpoint),
        )
    return posted


def wait_pods(emulator: Any, names: list[str], args: argparse.Namespace, operator: Operator) -> float:
    pods_per = 2 * args.agents
    return wait(
        lambda: all(len(emulator.pods_created.get(x, ())) >= pods_per for x in names),
        args.timeout,
        "every experiment's pods",
        operator,
        0.25,
    )


def delete_all(api: EmulatorApi, names: list[str], args: argparse.Namespace, operator: Operator) -> float:
    """DELETE every experiment; seconds until the operator has forgotten them all."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda x: api.call("DELETE", f"{GROUP}/namespaces/{NS}/hacrlexperiments/{x}"), names))
    return wait(
        lambda: operator.metric("hacrl_operator_experiments") == 0,
        args.timeout,
        "experiments forgotten",
        operator,
        2.0,
    )


def run_scale(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.seaweed import start_seaweedfs

    work = args.work / f"n{n}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    s3 = start_seaweedfs(work / "seaweed")
    os.environ.update(s3.env())  # this process writes the heartbeats with the same credentials
    cluster = counting_cluster(work).start()
    operator = None
    memory: dict[str, float] = {}
    seconds: dict[str, float] = {}
    try:
        api = EmulatorApi(cluster.port, timeout=120)  # 4,000 pods at N = 500: slow answers
        emulator = cluster.emulator
        api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        operator = Operator(cluster, s3, args.interval, work / "operator.log")
        wait(
            lambda: emulator.requests["watch"] >= 2 and operator.metric("hacrl_operator_reconciles_total") >= 0,
            120,
            "operator start",
            operator,
        )
        time.sleep(2)
        memory["start"] = operator.rss_mib()
        if args.warmup:
            warm = [f"warm-{i:04d}" for i in range(args.warmup)]
            create_all(api, warm, args, s3)
            wait_pods(emulator, warm, args, operator)
            delete_all(api, warm, args, operator)
            time.sleep(args.interval)
        memory["idle"] = operator.rss_mib()
        names = [f"hx-{i:04d}" for i in range(n)]
        pods_per = 2 * args.agents

        # 1. create -> pods
        api0, store0, cpu0, t0 = counted(emulator, operator)
        began = time.perf_counter()
        posted = create_all(api, names, args, s3)
        seconds["post"] = time.perf_counter() - began
        seconds["all pods"] = wait_pods(emulator, names, args, operator) + seconds["post"]
        to_pods = {x: sorted(emulator.pods_created[x])[pods_per - 1] - posted[x] for x in names}
        time.sleep(2)  # the reconciles that pod creation itself triggers settle
        api1, store1, cpu1, t1 = counted(emulator, operator)
        memory["all pending"] = operator.rss_mib()
        print(
            f"  N={n}: all {n * pods_per} pods in {seconds['all pods']:.1f}s (create->pods p50 "
            f"{statistics.median(to_pods.values()):.1f}s); RSS {memory['all pending']:.0f} MiB",
            flush=True,
        )

        # 2. Running: kubelet plays, heartbeats written
        if args.kubelet:
            pods = api.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda pod: api.call(
                            "PATCH",
                            f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
                            {"status": {"phase": "Running"}},
                            "application/merge-patch+json",
                        ),
                        pods,
                    )
                )
        heartbeats(s3, names, args.agents, 3, False)
        if args.kubelet:
            seconds["to Running"] = wait(
                lambda: phases(api)["Running"] == n, args.timeout, "phase Running", operator, 2.0
            )
        time.sleep(args.interval)
        api2, store2, cpu2, t2 = counted(emulator, operator)
        time.sleep(args.window)
        api3, store3, cpu3, t3 = counted(emulator, operator)
        memory["all running"] = operator.rss_mib()
        print(f"  N={n}: Running window counted", flush=True)

        # 3. half finished, then all
        half = names[: n // 2]
        heartbeats(s3, half, args.agents, STEPS, True)
        seconds["half to Succeeded"] = wait(
            lambda: phases(api)["Succeeded"] >= len(half), args.timeout, "half Succeeded", operator, 2.0
        )
        time.sleep(args.interval)
        memory["half finished"] = operator.rss_mib()
        heartbeats(s3, names[n // 2 :], args.agents, STEPS, True)
        seconds["all to Succeeded"] = wait(
            lambda: phases(api)["Succeeded"] == n, args.timeout, "all Succeeded", operator, 2.0
        )
        time.sleep(args.interval)
        api4, store4, cpu4, t4 = counted(emulator, operator)
        time.sleep(args.window)
        api5, store5, cpu5, t5 = counted(emulator, operator)
        memory["all finished"] = operator.rss_mib()
        print(f"  N={n}: finished window counted", flush=True)

        # 4. deleted
        seconds["forget all"] = delete_all(api, names, args, operator)
        time.sleep(args.interval)
        memory["all deleted"] = operator.rss_mib()
        print(f"  N={n}: {fell_back(n, memory)}", flush=True)

        # 5. the same N again, under other names: memory reused, or added to? A round that times out
        # (at N = 500 the emulator served round 2's pods far slower than round 1's) keeps round 1's
        # results and says so.
        for round_ in range(2, args.rounds + 1):
            again = [f"r{round_}-{i:04d}" for i in range(n)]
            try:
                create_all(api, again, args, s3)
                seconds[f"round {round_} all pods"] = wait_pods(emulator, again, args, operator)
                time.sleep(2)
                memory[f"round {round_} all pending"] = operator.rss_mib()
                delete_all(api, again, args, operator)
            except TimeoutError as error:
                memory[f"round {round_} at timeout"] = operator.rss_mib()
                print(
                    f"  N={n}: round {round_} not finished ({error}); RSS then {operator.rss_mib():.0f} MiB", flush=True
                )
                break
            time.sleep(args.interval)
            memory[f"round {round_} deleted"] = operator.rss_mib()
            print(f"  N={n}: {reused(memory, round_)}", flush=True)
        per_minute = 60.0 / args.window
        result = {
            "experiments": n,
            "agents": args.agents,
            "interval": args.interval,
            "window": args.window,
            "kubelet": args.kubelet,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "create_to_pods": {
                "p50": statistics.median(to_pods.values()),
                "p99": sorted(to_pods.values())[max(0, int(0.99 * n) - 1)],
                "max": max(to_pods.values()),
            },
            "requests_per_experiment": {
                "create": {"api": (api1 - api0) / n, "store": (store1 - store0) / n},
                "running_per_minute": {
                    "api": (api3 - api2) / n * per_minute,
                    "store": (store3 - store2) / n * per_minute,
                },
                "finished_per_minute": {
                    "api": (api5 - api4) / n * per_minute,
                    "store": (store5 - store4) / n * per_minute,
                },
            },
            # CPU cores the operator used: creating every experiment's pods, then Running, then finished.
            "cpu_cores": {
                "create": (cpu1 - cpu0) / (t1 - t0),
                "running": (cpu3 - cpu2) / (t3 - t2),
                "finished": (cpu5 - cpu4) / (t5 - t4),
            },
            "memory_mib": memory,
            "peak_mib": _peak(operator),
            "seconds": seconds,
            "api_requests_by_verb": dict(emulator.requests),
        }
        return result
    finally:
        if operator is not None:
            operator.stop()
        cluster.stop()
        s3.stop()
        shutil.rmtree(work / "seaweed", ignore_errors=True)


def fell_back(n: int, memory: dict[str, float]) -> str:
    """The memory goal (under 300 MiB at 500 experiments, half finished) and how far the resident
    size fell back once every experiment was deleted, of what it had grown since idle."""
    grown = max(memory["all running"], memory["half finished"], memory["all finished"]) - memory["idle"]
    fallen = max(memory["all running"], memory["half finished"], memory["all finished"]) - memory["all deleted"]
    goal = "met" if memory["half finished"] < GOAL_MIB else "NOT met"
    scale = f"{memory['half finished']:.0f} MiB half finished" + (
        f" (goal < {GOAL_MIB} MiB at {GOAL_AT}: {goal})" if n >= GOAL_AT else ""
    )
    return (
        f"RSS {memory['idle']:.0f} MiB idle, {scale}, {memory['all deleted']:.0f} MiB after deleting all: "
        f"fell back {fallen:.0f} of the {grown:.0f} MiB it grew"
    )


def reused(memory: dict[str, float], round_: int) -> str:
    """Round ``round_`` against round 1: the same N again after a delete; flat if it needs no more."""
    pending, deleted = memory[f"round {round_} all pending"], memory[f"round {round_} deleted"]
    return (
        f"round {round_} (the same N again after deleting all): {pending:.0f} MiB with every pod created "
        f"(round 1: {memory['all pending']:.0f}), {deleted:.0f} MiB after deleting it "
        f"(round 1: {memory['all deleted']:.0f}): {pending - memory['all pending']:+.0f} MiB against round 1"
    )


def _peak(operator: Operator) -> float:
    for line in Path(f"/proc/{operator.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write(args: argparse.Namespace, runs: list[dict[str, Any]], began: float) -> None:
    rows = []
    for r in runs:
        q, m = r["requests_per_experiment"], r["memory_mib"]
        rows.append(
            [
                r["experiments"],
                f"{r['create_to_pods']['p50']:.2f}",
                f"{r['create_to_pods']['p99']:.2f}",
                f"{q['create']['api']:.1f}",
                f"{q['create']['store']:.1f}",
                f"{q['running_per_minute']['api']:.1f}",
                f"{q['running_per_minute']['store']:.1f}",
                f"{q['finished_per_minute']['api']:.2f}",
                f"{q['finished_per_minute']['store']:.2f}",
                f"{m['idle']:.0f}",
                f"{m['all running']:.0f}",
                f"{m['half finished']:.0f}",
                f"{m['all deleted']:.0f}",
                f"{m['round 2 all pending']:.0f}" if "round 2 all pending" in m else "-",
                f"{m['round 2 deleted']:.0f}" if "round 2 deleted" in m else "-",
                f"{r['peak_mib']:.0f}",
                f"{r['cpu_cores']['create']:.2f}",
                f"{r['cpu_cores']['running']:.3f}",
                f"{r['cpu_cores']['finished']:.3f}",
            ]
        )
    text = table(
        [
            "experiments",
            "create->pods p50 s",
            "p99 s",
            "API req/exp while pods appear",
            "S3 req/exp",
            "API req/exp/min Running",
            "S3",
            "API req/exp/min finished",
            "S3",
            "RSS MiB idle",
            "all Running",
            "half finished",
            "after delete",
            "round 2 with pods",
            "after delete",
            "peak",
            "CPU cores creating",
            "Running",
            "finished",
        ],
        rows,
    )
    for r in runs:
        print(f"N={r['experiments']}: {fell_back(r['experiments'], r['memory_mib'])}")
        for round_ in range(2, r.get("rounds", 1) + 1):
            if f"round {round_} deleted" in r["memory_mib"]:
                print(f"N={r['experiments']}: {reused(r['memory_mib'], round_)}")
        finished = r["requests_per_experiment"]["finished_per_minute"]
        print(
            f"N={r['experiments']}: a finished experiment costs {finished['api']:.2f} API and "
            f"{finished['store']:.2f} S3 requests a minute (0 S3 expected)"
        )
    print(
        f"\noperator at scale ({args.agents} agents per experiment, s3:// stores on SeaweedFS, reconcile interval {args.interval:g}s)\n{text}"
    )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save(
        "operator-scale",
        {"settings": settings, "table": text, "runs": runs, "total_seconds": time.perf_counter() - began},
        args.out,
    )
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for n in [int(x) for x in args.scales.split(",")]:
        print(f"N={n}", flush=True)
        runs.append(run_scale(n, args))
        write(args, runs, began)  # after every scale: a larger one that fails keeps the smaller ones
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
