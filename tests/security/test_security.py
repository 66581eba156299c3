"""Security properties (docs/security.md): pods without privilege, least-privilege RBAC,
credentials only by Secret reference and never in ConfigMaps, status, Events or logs, metrics
bound where the spec says, and model output never executed.

The credential check of a real run (worker logs, `hacrl run` output and every S3 object grepped
for a known secret) is tests/reliability/test_run_faults.py::test_s3_run_leaks_no_credential,
which shares that run's SeaweedFS.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "operator"))

from harness import EmulatedCluster, run_operator, wait_for  # noqa: E402 (found through the path set above)

from tests.chart.rendering import CI_VALUES, objects, render  # noqa: E402

KNOWN_SECRET = "known-secret-value-4J9sQe"
NS = "hx-sec"


# -- pods -------------------------------------------------------------------------------------


def assert_restricted(pod_spec: dict[str, Any], where: str, *, read_only_root: bool = True) -> None:
    """The Pod Security Standard 'restricted' profile, plus a read-only root filesystem."""
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod_spec.get(key), f"{where}: {key}"
    assert not [v for v in pod_spec.get("volumes", []) if "hostPath" in v], f"{where}: hostPath volume"
    pod_security = pod_spec.get("securityContext") or {}
    for container in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        name = f"{where} container {container['name']}"
        security = container.get("securityContext") or {}
        assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, name
        assert security.get("runAsUser", pod_security.get("runAsUser")) != 0, name
        assert security.get("allowPrivilegeEscalation") is False, name
        assert not security.get("privileged"), name
        assert security.get("capabilities", {}).get("drop") == ["ALL"] and not security["capabilities"].get("add"), name
        seccomp = security.get("seccompProfile") or pod_security.get("seccompProfile") or {}
        assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), name
        if read_only_root:
            assert security.get("readOnlyRootFilesystem") is True, name


def experiment(**store: Any):
    from hacrl_core.spec import parse_experiment

    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["spec"]["store"] = store or document["spec"]["store"]
    return parse_experiment(document)


def test_worker_pods_are_restricted_non_root_read_only() -> None:
    from hacrl_operator.builders import build_pod
    from hacrl_operator.config import OperatorConfig

    config = OperatorConfig.from_env({"HACRL_ROLLOUT_IMAGE": "r:1", "HACRL_LEARNER_IMAGE": "l:1"})
    exp = experiment(uri="s3://bucket/runs", endpoint="http://minio:9000", credentialsSecret="store-creds")
    owner = {"metadata": {"name": "quickstart", "namespace": "ns", "uid": "u"}}
    for agent in exp.spec.agents:
        for role in ("rollout", "learner"):
            pod = build_pod(exp, agent.name, role, owner, config)
            assert_restricted(pod["spec"], f"{agent.name}/{role}")
            assert pod["spec"]["automountServiceAccountToken"] is False  # workers never talk to the API server


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_chart_workloads_are_restricted(values: Path) -> None:
    docs = render((str(values),))
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod")]
    assert any(d["kind"] == "Deployment" for d in workloads)
    for workload in workloads:
        pod_spec = workload["spec"]["template"]["spec"] if workload["kind"] != "Pod" else workload["spec"]
        assert_restricted(
            pod_spec,
            f"{values.name}: {workload['kind']} {workload['metadata']['name']}",
            read_only_root=workload["kind"] == "Deployment",
        )


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_chart_rbac_is_least_privilege(values: Path) -> None:
    """No wildcard, no Secrets, no pods/exec, no escalate/bind/impersonate, in any values file."""
    docs = render((str(values),))
    for role in objects(docs, "Role") + objects(docs, "ClusterRole"):
        for rule in role.get("rules", []):
            where = f"{values.name}: {role['kind']} {role['metadata']['name']} {rule}"
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), where
            assert not set(rule.get("verbs", [])) & {"escalate", "bind", "impersonate"}, where
            resources = set(rule.get("resources", []))
            assert not resources & {
                "secrets",
                "pods/exec",
                "pods/attach",
                "pods/portforward",
                "nodes/proxy",
                "serviceaccounts/token",
            }, where
    for binding in objects(docs, "ClusterRoleBinding") + objects(docs, "RoleBinding"):
        assert binding["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), binding["metadata"]["name"]


# -- credentials through the operator ---------------------------------------------------------


def test_operator_passes_credentials_by_reference_and_never_writes_them(cluster_with_secret) -> None:
    """A Secret holding KNOWN_SECRET is named by spec.store.credentialsSecret: the pods get a
    secretKeyRef; the value is in no ConfigMap, pod manifest, status, Event or operator log,
    even when the store is unreachable and the error is reported."""
    cluster, op = cluster_with_secret
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    closed = _closed_port()
    document["spec"]["store"] = {
        "uri": "s3://bucket/runs",
        "endpoint": f"http://127.0.0.1:{closed}",
        "credentialsSecret": "store-creds",
    }
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(document))
    pods = wait_for(lambda: len(found := cluster.get("pods", namespace=NS)) == 4 and found, timeout=30, what="4 pods")
    wait_for(
        lambda: any(e["reason"] == "StoreUnreachable" for e in cluster.get("events", namespace=NS)),
        timeout=60,
        what="the StoreUnreachable event",
    )
    for pod in pods:
        env = pod["spec"]["containers"][0]["env"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs == {k: {"name": "store-creds", "key": k} for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        assert not [e for e in env if e["name"].startswith("AWS_") and "value" in e and e["name"] != "AWS_REGION"]
    dumps = {
        "configmaps": cluster.get("configmaps", namespace=NS),
        "pods": pods,
        "experiment": cluster.get("hx", "quickstart", NS),
        "events": cluster.get("events", namespace=NS),
    }
    for what, value in dumps.items():
        assert KNOWN_SECRET not in json.dumps(value), f"the secret value is in the {what}"
    logged = "\n".join(r.getMessage() for r in op.logs.records)
    assert "StoreUnreachable" in logged and KNOWN_SECRET not in logged


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cluster_with_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    # The operator's own environment holds the same secret (as if mounted for its store reads).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "known-access-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KNOWN_SECRET)
    cluster = EmulatedCluster(tmp_path).start()
    try:
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        )
        cluster.kubectl(
            "apply",
            "-n",
            NS,
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "store-creds"},
                    "stringData": {"AWS_ACCESS_KEY_ID": "known-access-key", "AWS_SECRET_ACCESS_KEY": KNOWN_SECRET},
                }
            ),
        )
        with run_operator(cluster) as op:
            op.expect_errors("StoreUnreachable", "cannot read progress")
            yield cluster, op
    finally:
        cluster.stop()


# -- metrics endpoints ------------------------------------------------------------------------


def listening(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else f"v6:{address}")
    return found


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_worker_metrics_bind_where_the_spec_says(bind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from hacrl_core.metrics import WorkerMetrics

    monkeypatch.delenv("HACRL_METRICS_PORT", raising=False)
    monkeypatch.delenv("HACRL_METRICS_BIND", raising=False)
    port = _closed_port()
    assert WorkerMetrics("exp", "agent", "rollout").serve(port, bind) == port
    wait_for(lambda: listening(port), timeout=5, what=f"a listener on {port}")
    assert listening(port) == {bind}
    assert WorkerMetrics("exp", "agent", "rollout").serve(0, bind) is None  # port 0: nothing listens


def test_hacrl_run_passes_the_spec_bind_address_to_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hacrl run` gives each worker the spec's metrics.bindAddress (default 127.0.0.1)."""
    from hacrl_core.runtime import local

    started: list[Any] = []
    monkeypatch.setattr(local.WorkerProcess, "start", lambda self: started.append(self))
    document = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    document["spec"]["store"] = {"uri": (tmp_path / "store").as_uri()}
    document["spec"]["metrics"] = {"port": _closed_port()}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    run = local.prepare(spec, resume=False, workdir=tmp_path / "work")
    local.start_workers(run)
    assert len(started) == 4
    assert {w.env["HACRL_METRICS_BIND"] for w in started} == {"127.0.0.1"}


# -- model output is data, never code ---------------------------------------------------------


def test_verifiers_never_execute_model_output(tmp_path: Path) -> None:
    from hacrl_core.rewards import get_reward, reward_names

    marker = tmp_path / "pwned"
    payloads = [
        f"__import__('os').system('touch {marker}')",
        f"\\boxed{{__import__('os').system('touch {marker}')}}",
        f"The answer is {{{{ __import__('os').system('touch {marker}') }}}}",
        f"\\boxed{{eval(\"__import__('os').system('touch {marker}')\")}}",
        f"\\boxed{{exec(compile('import os; os.system(\"touch {marker}\")', 'x', 'exec'))}}",
        f"\\boxed{{(lambda: __import__('subprocess').run(['touch', '{marker}']))()}}",
    ]
    for name in reward_names():
        reward = get_reward(name)
        for payload in payloads:
            assert reward(payload, "424242") == 0.0, (name, payload)
    time.sleep(0.2)
    assert not marker.exists()
