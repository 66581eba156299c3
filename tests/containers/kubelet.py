"""A kubelet for the API emulator: runs every Pod of a namespace as podman containers, with
`podman kube play` from the Pod's own manifest, and reports them back as a kubelet would.

scripts/container-e2e.sh runs it beside the emulator (tests/operator/harness.py) and the operator's
container. Each poll it lists the namespace's pods; a pod it has not started is played; a pod it
started has its containers' state written to ``status`` (phase, containerStatuses, conditions);
a pod gone from the API (deleted, or garbage-collected with its experiment) is removed.

The manifest is played as written (command, args, env, securityContext, volumes, resources,
restartPolicy, image and pull policy), with these adaptations, each for a reason:

- env ``valueFrom`` (secretKeyRef, configMapKeyRef, fieldRef) and ``envFrom`` are resolved here,
  from the API, into plain values: a kubelet reads them from its API server, while kube play would
  look for Secrets and ConfigMaps in podman's own store instead;
- ``configMap`` volumes: the ConfigMaps are read from the API and handed to kube play
  (``--configmap``), which mounts them as a kubelet does;
- ``hostNetwork: true``: every pod on the host's network, so that pods reach the S3 server and
  each other on loopback and no traffic leaves the machine (a pod network would need CNI plugins
  and routes to the host); ``ports`` are dropped, as podman refuses port mappings on the host
  network (Kubernetes treats them as informational there);
- an ``emptyDir`` with ``medium: Memory`` mounted at /dev/shm is left to podman: every podman
  container has its own writable tmpfs at /dev/shm (what the volume gives on Kubernetes), while
  podman's memory-backed emptyDir is root-owned and not writable by uid 1000.

Every podman call has a deadline that fits what it does (``DEADLINES``): a call that does not
return in time is killed; a ``kube play`` is retried once (after removing what the killed call may
have made), and a call that times out twice in a row marks the kubelet stuck, naming the call, so
that the e2e fails within minutes instead of waiting near CI's limit on a podman that hangs (seen
here: a lock table at odds with podman's database makes every call of one pod hang forever).
"""

from __future__ import annotations

import argparse
import base64
import copy
import dataclasses
import datetime as dt
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("kubelet")

SHM = "/dev/shm"


class ApiError(RuntimeError):
    """The API answered an error (its status and body in the message)."""


@dataclasses.dataclass
class Api:
    """Just enough of the Kubernetes API for a kubelet, over plain HTTP (the emulator's)."""

    server: str

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Api:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        return cls(config["clusters"][0]["cluster"]["server"].rstrip("/"))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.server + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise ApiError(f"{method} {path}: {error.code} {error.read()[:500]!r}") from None

    def get(self, path: str) -> Any:
        try:
            return self.request("GET", path)
        except ApiError as error:
            if ": 404 " in str(error):
                return None
            raise

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]

    def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )


class ManifestError(ValueError):
    """The pod names something this kubelet cannot find (a Secret, a key, a field)."""


def _data(obj: dict[str, Any] | None, kind: str) -> dict[str, str]:
    if obj is None:
        return {}
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()} | dict(
            obj.get("stringData") or {}
        )
    return dict(obj.get("data") or {})


def resolve_env(pod: dict[str, Any], container: dict[str, Any], api: Api) -> list[dict[str, str]]:
    """The container's env as plain values, as a kubelet computes it: envFrom first, then env
    (which wins), ``$(VAR)`` references left to the runtime."""
    namespace = pod["metadata"]["namespace"]

    def source(kind: str, name: str) -> dict[str, str] | None:
        obj = api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        return None if obj is None else _data(obj, kind)

    values: dict[str, str] = {}
    for entry in container.get("envFrom") or []:
        for ref_key, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            ref = entry.get(ref_key)
            if ref is None:
                continue
            data = source(kind, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise ManifestError(f"envFrom {ref_key} {ref['name']!r}: no such {kind[:-1]} in namespace {namespace}")
            values.update({entry.get("prefix", "") + k: v for k, v in data.items()})
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": namespace,
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": "localhost",
        "status.podIP": "127.0.0.1",
    }
    for var in container.get("env") or []:
        if "valueFrom" not in var:
            values[var["name"]] = var.get("value", "")
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            if path not in fields:
                raise ManifestError(
                    f"env {var['name']}: fieldRef {path!r} is not one this kubelet knows ({', '.join(fields)})"
                )
            values[var["name"]] = fields[path]
            continue
        for ref_key, kind in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if ref_key in ref:
                data = source(kind, ref[ref_key]["name"])
                key = ref[ref_key]["key"]
                if data is None or key not in data:
                    if ref[ref_key].get("optional"):
                        break
                    raise ManifestError(
                        f"env {var['name']}: {ref_key} {ref[ref_key]['name']}/{key} not found in namespace {namespace}"
                    )
                values[var["name"]] = data[key]
                break
        else:
            raise ManifestError(f"env {var['name']}: valueFrom {sorted(ref)} is not supported here")
    return [{"name": k, "value": v} for k, v in values.items()]


def playable(pod: dict[str, Any], api: Api) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the Pod manifest kube play runs, the ConfigMaps its volumes need): the pod as written with
    the adaptations of the module docstring."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {k: v for k, v in pod["metadata"].items() if k in ("name", "labels", "annotations")},
        "spec": copy.deepcopy(pod["spec"]),
    }
    spec = manifest["spec"]
    spec["hostNetwork"] = True
    shm_volumes = {
        v["name"]
        for v in spec.get("volumes") or []
        if (v.get("emptyDir") or {}).get("medium") == "Memory"
        and any(
            m["name"] == v["name"] and m["mountPath"] == SHM
            for c in spec["containers"]
            for m in c.get("volumeMounts") or []
        )
    }
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in shm_volumes]
    for container in spec["containers"] + (spec.get("initContainers") or []):
        container.pop("ports", None)
        container["env"] = resolve_env(pod, container, api)
        container.pop("envFrom", None)
        container["volumeMounts"] = [m for m in container.get("volumeMounts") or [] if m["name"] not in shm_volumes]
    configmaps = []
    for volume in spec["volumes"]:
        if "configMap" in volume:
            name = volume["configMap"]["name"]
            found = api.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/configmaps/{name}")
            if found is None:
                raise ManifestError(f"volume {volume['name']}: ConfigMap {name!r} not found")
            configmaps.append(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": found.get("data") or {}}
            )
    return manifest, configmaps


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(podman_time: str) -> str:
    """podman's RFC 3339 with nanoseconds to Kubernetes' seconds."""
    return podman_time[:19] + "Z" if podman_time and not podman_time.startswith("0001") else _now()


def container_status(name: str, image: str, state: dict[str, Any]) -> dict[str, Any]:
    """A containerStatuses entry from `podman inspect`'s State."""
    if state.get("Running"):
        current = {"running": {"startedAt": _time(state.get("StartedAt", ""))}}
    elif state.get("Status") in ("exited", "stopped"):
        code = int(state.get("ExitCode", 0))
        reason = "OOMKilled" if state.get("OOMKilled") else ("Completed" if code == 0 else "Error")
        current = {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": _time(state.get("StartedAt", "")),
                "finishedAt": _time(state.get("FinishedAt", "")),
            }
        }
    else:
        current = {"waiting": {"reason": "ContainerCreating"}}
    return {
        "name": name,
        "image": image,
        "imageID": image,
        "ready": bool(state.get("Running")),
        "restartCount": 0,
        "started": bool(state.get("Running")),
        "state": current,
    }


def pod_phase(statuses: list[dict[str, Any]]) -> str:
    """restartPolicy Never: Running while any runs, then Succeeded when all exited 0, else Failed."""
    states = [s["state"] for s in statuses]
    if any("running" in s for s in states):
        return "Running"
    if states and all("terminated" in s for s in states):
        return "Succeeded" if all(s["terminated"]["exitCode"] == 0 for s in states) else "Failed"
    return "Pending"


# Seconds each podman command may take, by its first word(s); each far above what it takes here (a
# play of a cached image: under a second, the first play of a store also builds podman's pause
# image: a few seconds; under a loaded CI machine ten times that) and far below CI's patience.
# HACRL_KUBELET_PLAY_DEADLINE shortens the play's for the test of a podman that always hangs.
DEADLINES = {
    "kube play": float(os.environ.get("HACRL_KUBELET_PLAY_DEADLINE", "90")),
    "inspect": 30.0,
    "pod rm": 60.0,
    "rm": 60.0,
    "kill": 30.0,
    "logs": 30.0,
    "run": 120.0,
}
DEFAULT_DEADLINE = 60.0


class PodmanTimeout(RuntimeError):
    """A podman call did not return within its deadline and was killed."""

    def __init__(self, call: str, seconds: float) -> None:
        super().__init__(f"`podman {call}` did not return within {seconds:.0f} s (killed)")
        self.call = call


def call_name(args: tuple[str, ...]) -> str:
    """The command of a podman call, as DEADLINES keys it: `kube play`, `pod rm`, `inspect`."""
    two = " ".join(args[:2])
    return two if two in DEADLINES else args[0]


def podman(*args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    call = call_name(args)
    seconds = timeout if timeout is not None else DEADLINES.get(call, DEFAULT_DEADLINE)
    try:
        result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        raise PodmanTimeout(call, seconds) from None
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


class Kubelet:
    """Plays the pods of ``namespace`` and reports them; ``played`` names every podman pod it made
    (whatever is left of them on exit goes with the run's podman store: scripts/container-e2e.sh)."""

    def __init__(self, api: Api, namespace: str, workdir: Path) -> None:
        self.api = api
        self.namespace = namespace
        self.workdir = workdir
        self.running: dict[str, dict[str, Any]] = {}  # pod name -> its manifest (as the API has it)
        self.played: list[tuple[str, str]] = []  # (name, uid) of every pod played, in order
        self.reported: dict[str, str] = {}  # pod name -> the last status written (JSON)
        self.stopping = threading.Event()
        self.timeouts: dict[str, int] = {}  # podman command -> how many of its last calls timed out in a row
        self.failed: set[str] = set()  # pods whose play failed: reported Failed, nothing to inspect
        self.stuck: str | None = None  # why the kubelet cannot go on (a call that timed out twice in a row)

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``podman(*args)``, counting timeouts per command: the second in a row marks the kubelet stuck."""
        call = call_name(args)
        try:
            result = podman(*args, check=check)
        except PodmanTimeout as error:
            self.timeouts[call] = self.timeouts.get(call, 0) + 1
            log.error("%s (%d in a row)", error, self.timeouts[call])
            if self.timeouts[call] >= 2 and self.stuck is None:
                self.stuck = f"{error}, twice in a row: podman is hung (args: {' '.join(args)[:300]})"
            raise
        self.timeouts[call] = 0
        return result

    def check(self) -> None:
        """Raises if the kubelet is stuck: what the e2e's waits call, to fail at once, naming the call."""
        if self.stuck is not None:
            raise RuntimeError(f"the kubelet stand-in is stuck: {self.stuck}")

    def play(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.running[name] = pod
        self.played.append((name, pod["metadata"].get("uid", "")))
        try:
            manifest, configmaps = playable(pod, self.api)
        except ManifestError as error:
            log.error("pod %s: %s", name, error)
            self.report(
                name,
                {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "name": c["name"],
                            "image": c["image"],
                            "ready": False,
                            "restartCount": 0,
                            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": str(error)}},
                        }
                        for c in pod["spec"]["containers"]
                    ],
                },
            )
            return
        directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
        (directory / "pod.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
        args = ["kube", "play", "--quiet"]
        for index, configmap in enumerate(configmaps):
            path = directory / f"configmap-{index}.yaml"
            path.write_text(yaml.safe_dump(configmap), encoding="utf-8")
            args += ["--configmap", str(path)]
        started = time.monotonic()
        try:
            try:
                result = self.podman(*args, str(directory / "pod.yaml"), check=False)
            except PodmanTimeout:
                # Whatever the killed call made (a pod, its infra container) would make the retry
                # fail on its name.
                podman("pod", "rm", "--force", "--ignore", "--time", "0", name, check=False)
                log.warning("pod %s: retrying podman kube play once", name)
                result = self.podman(*args, str(directory / "pod.yaml"), check=False)
        except PodmanTimeout as error:
            log.error("pod %s: %s", name, error)
            self.failed.add(name)
            self.report(name, {"phase": "Failed", "reason": "RunContainerError", "message": f"{error}, twice"})
            return
        if result.returncode != 0:
            log.error("pod %s: podman kube play failed: %s", name, result.stderr.strip()[-2000:])
            self.failed.add(name)
            self.report(
                name, {"phase": "Failed", "reason": "RunContainerError", "message": result.stderr.strip()[-1000:]}
            )
            return
        log.info("pod %s: played in %.1f s", name, time.monotonic() - started)

    def remove(self, name: str, why: str = "deleted from the API") -> None:
        self.podman("pod", "rm", "--force", "--ignore", "--time", "2", name, check=False)
        self.running.pop(name, None)
        self.reported.pop(name, None)
        self.failed.discard(name)
        log.info("pod %s: %s, its containers removed", name, why)

    def sync_status(self, name: str) -> None:
        pod = self.running[name]
        statuses = []
        for container in pod["spec"]["containers"]:
            found = self.podman("inspect", "--type", "container", f"{name}-{container['name']}", check=False)
            state = json.loads(found.stdout)[0]["State"] if found.returncode == 0 and found.stdout.strip() else {}
            statuses.append(container_status(container["name"], container["image"], state))
        phase = pod_phase(statuses)
        ready = "True" if phase == "Running" and all(s["ready"] for s in statuses) else "False"
        self.report(
            name,
            {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "containerStatuses": statuses,
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready}],
            },
        )

    def report(self, name: str, status: dict[str, Any]) -> None:
        text = json.dumps(status, sort_keys=True)
        if self.reported.get(name) == text:
            return
        try:
            self.api.patch_pod_status(self.namespace, name, status)
        except ApiError as error:
            if ": 404 " not in str(error):
                raise
            return
        if status.get("phase") != json.loads(self.reported.get(name, "{}")).get("phase"):
            log.info("pod %s: %s", name, status.get("phase"))
        self.reported[name] = text

    def poll(self) -> None:
        pods = {p["metadata"]["name"]: p for p in self.api.pods(self.namespace)}
        for name, pod in list(self.running.items()):
            if name not in pods or pods[name]["metadata"].get("deletionTimestamp"):
                self.remove(name)
            elif pods[name]["metadata"].get("uid") != pod["metadata"].get("uid"):
                # Deleted and created again under its name between two polls (the operator
                # replaces a failed pod so): a new pod, whose old containers must go.
                self.remove(name, "replaced by a new pod of the same name")
        for name, pod in pods.items():
            if name not in self.running and not pod["metadata"].get("deletionTimestamp"):
                self.play(pod)
        for name in list(self.running):
            if name not in self.failed:  # its Failed report stands (no containers to read)
                self.sync_status(name)

    def run(self, interval: float = 0.5) -> None:
        while not self.stopping.is_set():
            try:
                self.poll()
            except (ApiError, OSError, RuntimeError) as error:  # the API restarting, podman busy: next poll
                log.warning("poll failed: %s", error)
            self.stopping.wait(interval)

    def remove_all(self) -> None:
        for name in list(self.running):
            try:
                self.remove(name, "the kubelet stops")
            except PodmanTimeout as error:  # the run's folder is removed after it anyway
                log.error("pod %s: %s", name, error)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kubelet %(message)s", stream=sys.stderr)
    kubelet = Kubelet(Api.from_kubeconfig(args.kubeconfig), args.namespace, args.workdir)
    try:
        kubelet.run()
    finally:
        kubelet.remove_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
