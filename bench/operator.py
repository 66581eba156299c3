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

    python bench/operator.py            # N = 1, 10, 50
    python bench/operator.py --quick    # N = 1, 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# `python bench/operator.py` puts bench/ first on sys.path, where this file shadows the standard
# library's `operator` for any later import of it: drop that entry (bench.common is found via REPO).
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
for extra in (REPO, REPO / "operator", REPO / "tests" / "operator"):
    sys.path.insert(0, str(extra))

from bench.common import RESULTS, save, table

NS = "hx-bench"
GROUP = "/apis/hacrl.io/v1alpha1"
POLL = 0.02


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scales", default="1,10,50")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--interval", type=float, default=0.2, help="HACRL_RECONCILE_INTERVAL in seconds")
    p.add_argument("--timeout", type=float, default=180, help="per stage; experiments not done by then are reported as timed out")
    p.add_argument("--work", type=Path, default=Path("/tmp/hacrl-bench/operator"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.scales = "1,3"
    return args


class Api:
    """Plain JSON over HTTP to the emulator."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")


def experiment_doc(name: str, agents: int, store_uri: str) -> dict[str, Any]:
    presets = ["tiny://llama-char?seed=0", "tiny://qwen2-bpe?seed=0"]
    return {
        "apiVersion": "hacrl.io/v1alpha1", "kind": "HACRLExperiment", "metadata": {"name": name, "namespace": NS},
        "spec": {
            "agents": [{"name": f"agent-{i}", "model": presets[i % 2], "rollout": {"maxNewTokens": 8}} for i in range(agents)],
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


def run_scale(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from harness import EmulatedCluster, run_operator

    from hacrl_core.store import open_trajectory_store
    from hacrl_core.store.trajectory_store import experiment_root

    work = args.work / f"n{n}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store_uri = f"file://{work / 'store'}"
    cluster = EmulatedCluster(work).start()
    try:
        api = Api(cluster.port)
        api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        with run_operator(cluster, HACRL_RECONCILE_INTERVAL=str(args.interval)) as _handle:
            names = [f"hx-{i:03d}" for i in range(n)]
            pods_per = 2 * args.agents

            def pods_done() -> set[str]:
                counts: dict[str, int] = {}
                for pod in api.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]:
                    owner = pod["metadata"].get("labels", {}).get("hacrl.io/experiment")
                    counts[owner] = counts.get(owner, 0) + 1
                return {k for k, v in counts.items() if v >= pods_per}

            created: dict[str, float] = {}
            began = time.perf_counter()
            for name in names:
                created[name] = time.perf_counter()
                api.call("POST", f"{GROUP}/namespaces/{NS}/hacrlexperiments", experiment_doc(name, args.agents, store_uri))
            post_seconds = time.perf_counter() - began
            to_pods = wait_each(names, created, pods_done, args.timeout, "create -> pods")
            all_pods = time.perf_counter() - began
            print(f"  N={n}: all {n * pods_per} pods in {all_pods:.1f}s", flush=True)

            for pod in api.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]:
                api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status", {"status": {"phase": "Running"}},
                         "application/merge-patch+json")

            def statuses() -> dict[str, dict[str, Any]]:
                items = api.call("GET", f"{GROUP}/namespaces/{NS}/hacrlexperiments")["items"]
                return {i["metadata"]["name"]: i.get("status") or {} for i in items}

            wait_each(names, {k: 0.0 for k in names}, lambda: {k for k, s in statuses().items() if s.get("phase") == "Running"},
                      args.timeout, "phase Running")
            print(f"  N={n}: all Running", flush=True)
            beat: dict[str, float] = {}
            began = time.perf_counter()
            for name in names:
                store = open_trajectory_store(experiment_root(store_uri, NS), name)  # where its workers write
                for i in range(args.agents):
                    store.write_progress(f"agent-{i}", {"agent": f"agent-{i}", "step": 3, "steps": 12, "weights_version": 3,
                                                        "reward": 0.3, "accuracy": None, "capability": 0.3, "last_checkpoint": None,
                                                        "done": False, "time": time.time()})
                beat[name] = time.perf_counter()
            to_status = wait_each(names, beat, lambda: {k for k, s in statuses().items() if s.get("step") == 3}, args.timeout,
                                  "heartbeat -> status")
            all_status = time.perf_counter() - began
    finally:
        cluster.stop()

    def stats(values: dict[str, float]) -> dict[str, float]:
        ordered = sorted(values.values())
        return {"median": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))], "max": ordered[-1],
                "timed_out": sum(v == float("inf") for v in ordered)}

    return {"experiments": n, "agents": args.agents, "pods": n * 2 * args.agents, "interval": args.interval, "post_seconds": post_seconds,
            "create_to_pods": stats(to_pods), "create_to_all_pods_seconds": all_pods,
            "heartbeat_to_status": stats(to_status), "heartbeat_to_all_status_seconds": all_status,
            "raw": {"create_to_pods": to_pods, "heartbeat_to_status": to_status}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    results = []
    for n in [int(x) for x in args.scales.split(",")]:
        result = run_scale(n, args)
        results.append(result)
        print(f"N={n}: create->pods median {result['create_to_pods']['median']:.3f}s, heartbeat->status median "
              f"{result['heartbeat_to_status']['median']:.3f}s", flush=True)
        write(args, results, began)  # after every scale: a larger scale that hangs keeps the smaller ones
    return 0


def write(args: argparse.Namespace, results: list[dict[str, Any]], began: float) -> None:
    ms = lambda s: f"{s * 1000:,.0f}"
    rows = [[r["experiments"], r["pods"], f"{r['interval']:g}", ms(r["create_to_pods"]["median"]), ms(r["create_to_pods"]["p90"]), ms(r["create_to_pods"]["max"]),
             ms(r["heartbeat_to_status"]["median"]), ms(r["heartbeat_to_status"]["p90"]), ms(r["heartbeat_to_status"]["max"])] for r in results]
    text = table(["experiments", "pods", "reconcile interval s", "create->pods median ms", "p90", "max", "heartbeat->status median ms", "p90", "max"], rows)
    print(f"\noperator latency ({args.agents} agents per experiment, kmock emulator)\n{text}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = save("operator-quick" if args.quick else "operator", {"settings": settings, "table": text, "results": results,
                                                                  "total_seconds": time.perf_counter() - began}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
