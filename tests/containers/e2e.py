"""The cluster path with real containers and no cluster: what scripts/container-e2e.sh runs.

- the API: the project's emulator (tests/operator/harness.py, the real kubectl drives it);
- the store: a real SeaweedFS S3 server (tests/support/seaweed.py);
- the operator: its image, as a podman container on the host network, reading the emulator;
- the pods: every Pod the operator creates, run from its manifest by ``podman kube play``, its
  state written back by a kubelet (tests/containers/kubelet.py);
- the experiment: examples/kind-tiny.yaml (two tiny agents on the worker-cpu image) with an S3
  store whose credentials come from a Secret, and an envFrom ConfigMap.

It kills one worker container (``podman kill``) once the run has committed its first step, and
checks that the operator replaced that pod, that the experiment Succeeded, and that the store
holds every step's rollouts, scores and metrics and every checkpoint exactly once.

With ``HACRL_E2E_STOP=sigterm`` it stops that learner's container with SIGTERM instead (``podman
stop`` with a grace period, as a kubelet stops a pod that is deleted, evicted or preempted),
mid-step, with periodic checkpoints only at the last step: the learner must exit with code 7
having checkpointed the step it stopped at, the operator must replace its pod counting a
preemption and no restart, and the replacement must resume from that step (its agent's progress
never goes back below it) while the store still holds every step exactly once.

    python -m tests.containers.e2e --operator-image IMG --worker-image IMG --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from hacrl_core.store import open_trajectory_store
from hacrl_operator.builders import LABEL_AGENT, LABEL_EXPERIMENT, LABEL_ROLE
from tests.containers.kubelet import Api, Kubelet, podman
from tests.operator.harness import EmulatedCluster, free_port, wait_for
from tests.reliability.faults import assert_every_step_shard_exactly_once
from tests.support.seaweed import seaweedfs_server

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kind-tiny.yaml"
NAMESPACE = "default"
NAME = "ce2e"
STORE_SECRET = "ce2e-store"
ENV_CONFIGMAP = "ce2e-env"
# The worker whose container is killed mid-run: the learner of the first agent.
KILLED_ROLE = "learner"
STEPS = 6
#: How that worker is stopped: "sigkill" (`podman kill`) or "sigterm" (`podman stop`, a preemption).
STOP = os.environ.get("HACRL_E2E_STOP", "sigkill")
#: sigterm: the learner stops after this many finished steps (or one more, the step in flight).
STOP_AFTER = 2

log = logging.getLogger("container-e2e")


def experiment(store_uri: str, endpoint: str) -> dict[str, Any]:
    """examples/kind-tiny.yaml with a short warm start of its tiny models, an S3 store (credentials from a Secret), an envFrom ConfigMap,
    every checkpoint kept and room for the one restart the test causes."""
    document = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    document["metadata"]["name"] = NAME
    spec = document["spec"]
    for agent in spec["agents"]:  # the tests' short warm start (tests/integration/runs.py): seconds, not minutes
        agent["model"] += "&warmup_steps=40"
    spec["store"] = {"uri": store_uri, "endpoint": endpoint, "credentialsSecret": STORE_SECRET}
    spec["envFrom"] = [{"configMapRef": {"name": ENV_CONFIGMAP}}]
    spec["restartLimit"] = 3
    # Long enough that a worker killed after the first step has steps left to lose (a few s each).
    spec["algorithm"]["steps"] = STEPS
    spec["checkpoint"] = {"everySteps": 1, "keepLast": spec["algorithm"]["steps"]}
    if STOP == "sigterm":  # no periodic checkpoint before the last step: only the stop's own
        spec["checkpoint"] = {"everySteps": 100, "keepLast": STEPS, "gracePeriodSeconds": 60}
    return document


def apply(cluster: EmulatedCluster, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in documents))


def start_operator(cluster: EmulatedCluster, image: str, worker_image: str) -> tuple[str, int]:
    """The operator's image as a container on the host network: (its name, its health port)."""
    name = f"hacrl-ce2e-operator-{os.getpid()}"
    cluster.kubeconfig.chmod(0o644)  # the operator runs as uid 1000
    health = free_port()
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        "--pull",
        "never",
        "--volume",
        f"{cluster.kubeconfig}:/etc/hacrl/kubeconfig:ro",
        "--env",
        "KUBECONFIG=/etc/hacrl/kubeconfig",
        "--env",
        f"HACRL_WATCH_NAMESPACES={NAMESPACE}",
        "--env",
        f"HACRL_ROLLOUT_IMAGE={worker_image}",
        "--env",
        f"HACRL_LEARNER_IMAGE={worker_image}",
        "--env",
        f"HACRL_EXPERIMENT_SECRETS={STORE_SECRET}",
        # Its own store credentials, to read the workers' progress (the chart gives them from
        # a Secret); passed by name, so their values stay out of the process list.
        "--env",
        "AWS_ACCESS_KEY_ID",
        "--env",
        "AWS_SECRET_ACCESS_KEY",
        "--env",
        f"HACRL_OPERATOR_HEALTH_PORT={health}",
        "--env",
        f"HACRL_OPERATOR_METRICS_PORT={free_port()}",
        "--env",
        "HACRL_RECONCILE_INTERVAL=2",
        image,
    )
    return name, health


def healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def phase(cluster: EmulatedCluster) -> str | None:
    found = cluster.get("hacrlexperiment", NAME, NAMESPACE)
    return ((found or {}).get("status") or {}).get("phase")


def worker_pods(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.get("pods", namespace=NAMESPACE)
        if (p["metadata"].get("labels") or {}).get(LABEL_EXPERIMENT) == NAME
    ]


def kill_one_worker(
    cluster: EmulatedCluster, kubelet: Kubelet, store: Any, agent: str, timeout: float
) -> dict[str, Any]:
    """``podman kill`` the running KILLED_ROLE container of ``agent`` once step 0 is committed and
    the run is not over; returns the killed pod."""

    def target() -> dict[str, Any] | None:
        kubelet.check()
        if not store.objects.list(f"{store.experiment}/steps/"):
            return None
        for pod in worker_pods(cluster):
            labels = pod["metadata"]["labels"]
            if (
                labels.get(LABEL_AGENT) == agent
                and labels.get(LABEL_ROLE) == KILLED_ROLE
                and (pod.get("status") or {}).get("phase") == "Running"
            ):
                return pod
        return None

    pod = wait_for(
        target, timeout=timeout, interval=0.3, what=f"a committed step and {agent}'s {KILLED_ROLE} pod Running"
    )
    name = pod["metadata"]["name"]
    container = f"{name}-{pod['spec']['containers'][0]['name']}"
    killed = podman("kill", container, check=False)
    assert killed.returncode == 0, (
        f"could not kill {container} mid-run (the run ended first? make it longer): {killed.stderr.strip()}"
    )
    log.info("killed container %s (pod %s) mid-run", container, name)
    return pod


def stop_one_learner(
    cluster: EmulatedCluster, kubelet: Kubelet, store: Any, agent: str, timeout: float
) -> dict[str, Any]:
    """``podman stop`` (SIGTERM, 60 s before SIGKILL) the running learner container of ``agent``
    once it finished STOP_AFTER steps; it must exit 7 having checkpointed the step it stopped at.
    Returns the pod, with ``stopped_at`` (that step) added."""

    def target() -> dict[str, Any] | None:
        kubelet.check()
        if (store.read_progress(agent) or {}).get("step", 0) < STOP_AFTER:
            return None
        for pod in worker_pods(cluster):
            labels = pod["metadata"]["labels"]
            if (
                labels.get(LABEL_AGENT) == agent
                and labels.get(LABEL_ROLE) == KILLED_ROLE
                and (pod.get("status") or {}).get("phase") == "Running"
            ):
                return pod
        return None

    pod = wait_for(target, timeout=timeout, interval=0.3, what=f"{agent}'s {KILLED_ROLE} past step {STOP_AFTER}")
    container = f"{pod['metadata']['name']}-{pod['spec']['containers'][0]['name']}"
    finished = (store.read_progress(agent) or {}).get("step", 0)
    began = time.monotonic()
    stopped = podman("stop", "--time", "60", container, check=False)
    seconds = time.monotonic() - began
    assert stopped.returncode == 0, f"could not stop {container} mid-run: {stopped.stderr.strip()}"
    code = podman("inspect", "--format", "{{.State.ExitCode}}", container, check=False).stdout.strip()
    checkpoints = store.list_checkpoints(agent)
    log.info(
        "stopped container %s with SIGTERM after %d finished steps: exit code %s in %.1f s, checkpoints %s",
        container,
        finished,
        code,
        seconds,
        checkpoints,
    )
    assert code in ("7", ""), f"{container} exited with code {code} on SIGTERM, not 7 (preempted)"
    assert len(checkpoints) == 1 and finished <= checkpoints[0] <= finished + 1, (
        f"{agent}'s learner stopped after {finished} steps but the checkpoints are {checkpoints}"
    )
    return {**pod, "stopped_at": checkpoints[0]}


def check_store(store: Any, steps: int, agents: list[str], stopped_at: int | None = None) -> None:
    """Every step's records and every checkpoint exactly once (sigterm: the first agent's stop
    checkpoint and the last step's; the other agent's last step's)."""
    assert_every_step_shard_exactly_once(store, steps, agents)
    for index, agent in enumerate(agents):
        if stopped_at is None:
            expected = list(range(1, steps + 1))
        else:
            expected = [stopped_at, steps] if index == 0 else [steps]
        assert store.list_checkpoints(agent) == expected, (agent, store.list_checkpoints(agent))
        assert store.read_metrics(steps - 1, agent), f"{agent}: no metrics for the last step"


def check_preemption(cluster: EmulatedCluster, stopped_at: int, seen_steps: list[int]) -> None:
    """The replacement resumed from the step the learner stopped at (its progress never went
    back below it), and the operator counted a preemption, no restart."""
    assert seen_steps and min(seen_steps) >= stopped_at, (
        f"the replacement started below step {stopped_at}: progress seen {seen_steps}"
    )
    entry = cluster.get("hacrlexperiment", NAME, NAMESPACE)["status"]["agentProgress"][0]
    assert (entry.get("preemptions"), entry.get("restarts")) == (1, 0), entry
    log.info(
        "the learner resumed from step %d (progress seen %d..%d); status preemptions 1, restarts 0",
        stopped_at,
        min(seen_steps),
        max(seen_steps),
    )


def run(args: argparse.Namespace) -> None:
    workdir: Path = args.workdir
    with seaweedfs_server(workdir / "s3") as s3:
        os.environ.update(s3.env())  # the checks' own store client
        cluster = EmulatedCluster(workdir).start()
        operator = None
        kubelet = Kubelet(Api.from_kubeconfig(cluster.kubeconfig), NAMESPACE, workdir)
        thread = threading.Thread(target=kubelet.run, name="kubelet", daemon=True)
        try:
            apply(
                cluster,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": STORE_SECRET},
                    "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
                },
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": ENV_CONFIGMAP},
                    "data": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
                },
            )
            operator, health = start_operator(cluster, args.operator_image, args.worker_image)
            wait_for(lambda: healthy(health), timeout=120, interval=0.5, what="the operator container's /healthz")
            log.info("operator container %s is up", operator)
            thread.start()
            document = experiment(f"s3://{s3.bucket}/e2e", s3.endpoint)
            spec = document["spec"]
            agents = [a["name"] for a in spec["agents"]]
            steps = spec["algorithm"]["steps"]
            began = time.monotonic()
            apply(cluster, document)
            store = open_trajectory_store(f"s3://{s3.bucket}/e2e/{NAMESPACE}", NAME, endpoint=s3.endpoint)
            if STOP == "sigterm":
                killed = stop_one_learner(cluster, kubelet, store, agents[0], args.timeout)
            else:
                killed = kill_one_worker(cluster, kubelet, store, agents[0], args.timeout)
            seen_steps: list[int] = []  # the first agent's progress after the stop

            def finished() -> str | None:
                kubelet.check()
                seen_steps.append(int((store.read_progress(agents[0]) or {}).get("step", 0)))
                current = phase(cluster)
                assert current != "Failed", (
                    f"the experiment Failed: {json.dumps(cluster.get('hacrlexperiment', NAME, NAMESPACE).get('status'))[:3000]}"
                )
                return current if current == "Succeeded" else None

            wait_for(finished, timeout=args.timeout, interval=2, what="the experiment to reach Succeeded")
            log.info("experiment %s Succeeded in %.0f s", NAME, time.monotonic() - began)
            # The operator replaced the killed pod (a new pod, maybe of the same name), which ran.
            killed_uid = killed["metadata"]["uid"]
            replaced = [
                (p["metadata"]["name"], p["metadata"]["uid"])
                for p in worker_pods(cluster)
                if p["metadata"]["labels"].get(LABEL_AGENT) == agents[0]
                and p["metadata"]["labels"].get(LABEL_ROLE) == KILLED_ROLE
                and p["metadata"]["uid"] != killed_uid
            ]
            assert replaced, f"the operator did not replace pod {killed['metadata']['name']} (uid {killed_uid})"
            assert set(replaced) <= set(kubelet.played), (
                f"replacement {replaced} never ran as containers (played: {kubelet.played})"
            )
            check_store(store, steps, agents, killed.get("stopped_at"))
            if STOP == "sigterm":
                check_preemption(cluster, killed["stopped_at"], seen_steps)
            log.info(
                "store: %d steps x %d agents, each step's records and checkpoints exactly once; pod %s (uid %s) replaced by uid %s",
                steps,
                len(agents),
                killed["metadata"]["name"],
                killed_uid,
                replaced[0][1],
            )
        except BaseException:
            if operator:
                logs = podman("logs", "--tail", "60", operator, check=False)
                log.error("operator logs (last 60 lines):\n%s%s", logs.stdout, logs.stderr)
            raise
        finally:
            kubelet.stopping.set()
            if thread.is_alive():
                thread.join(60)
            kubelet.remove_all()
            if operator:
                podman("rm", "--force", "--ignore", operator, check=False)
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operator-image", required=True)
    parser.add_argument("--worker-image", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for the experiment to succeed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # the emulator's every request
    # The script's trap stops the driver with SIGTERM: clean up as on any other exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
