"""charts/hacrl-operator: lint, render every documented values combination, validate the objects
against the Kubernetes versions we support, and check what the operator and the examples rely on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from hacrl_core.crd import CRD_PATH, render_crd
from hacrl_core.pod_policy import admission_rules
from hacrl_operator.builders import CREDENTIAL_KEYS
from hacrl_operator.config import OperatorConfig
from tests.chart.rendering import (
    CHART,
    CI_VALUES,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    ROOT,
    is_crd_hook,
    objects,
    one,
    render,
    run_helm,
)

CI_IDS = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]
# Kinds of CRDs not in Kubernetes itself (Prometheus Operator): kubernetes-validate has no schema.
FOREIGN_GROUPS = ("monitoring.coreos.com/",)


def test_documented_combinations_exist():
    assert set(CI_IDS) >= {"default", "namespaced", "minio", "monitoring", "kind"}


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_lint_strict(values: Path):
    result = run_helm("lint", "--strict", str(CHART), "-f", str(values))
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_rendered_objects_are_valid_kubernetes(values: Path):
    problems = []
    for version in KUBE_VERSIONS:  # rendered for each: some objects need a newer API (the admission policy)
        docs = render((str(values),), extra=("--include-crds", "--kube-version", version))
        assert docs, "nothing rendered"
        for doc in docs:
            if doc["apiVersion"].startswith(FOREIGN_GROUPS):
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                problems.append(
                    f"{version} {doc['kind']}/{doc['metadata']['name']}: {error.message} at {list(error.path)}"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("version", ["1.28.0", "1.27.0"])
def test_older_kubernetes_is_refused(version: str):
    result = run_helm("template", RELEASE, str(CHART), "--kube-version", version, check=False)
    assert result.returncode != 0 and "kubeVersion" in result.stderr


def test_admission_policy_ships_the_generated_rules_where_the_api_exists():
    policies = objects(render(extra=("--kube-version", "1.30.0")), "ValidatingAdmissionPolicy")
    assert [p["spec"]["validations"] for p in policies] == [admission_rules()]
    (binding,) = objects(render(extra=("--kube-version", "1.30.0")), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policies[0]["metadata"]["name"], "validationActions": ["Deny"]}
    assert policies[0]["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["hacrlexperiments"]
    assert not objects(render(extra=("--kube-version", "1.29.0")), "ValidatingAdmissionPolicy"), (
        "v1 needs Kubernetes 1.30"
    )
    assert not objects(
        render(sets=("admissionPolicy.enabled=false",), extra=("--kube-version", "1.30.0")), "ValidatingAdmissionPolicy"
    )


def test_admission_policy_checks_creations_and_spec_changes_only():
    """The policy's matchConditions, evaluated with cel-python: kopf's finalizer patch of an
    experiment that breaks the policy (created before it) is not checked, so it can be deleted."""
    import celpy

    (policy,) = objects(render(extra=("--kube-version", "1.30.0")), "ValidatingAdmissionPolicy")
    env = celpy.Environment()
    programs = [env.program(env.compile(c["expression"])) for c in policy["spec"]["matchConditions"]]

    def checked(operation: str, old: dict | None, new: dict) -> bool:
        variables = {
            "request": celpy.json_to_cel({"operation": operation}),
            "object": celpy.json_to_cel(new),
            "oldObject": celpy.json_to_cel(old),
        }
        return all(bool(program.evaluate(variables)) for program in programs)

    bad = {
        "metadata": {"name": "x", "finalizers": ["hacrl.io/store-cleanup"]},
        "spec": {"agents": [{"name": "a", "model": "m", "podTemplate": {"learner": {"hostNetwork": True}}}]},
    }
    released = {**bad, "metadata": {"name": "x"}}
    annotated = {**bad, "metadata": {**bad["metadata"], "annotations": {"hacrl.io/last-handled-configuration": "{}"}}}
    assert checked("CREATE", None, bad)
    assert not checked("UPDATE", bad, released) and not checked("UPDATE", bad, annotated)
    assert checked("UPDATE", released, {**bad, "spec": {**bad["spec"], "suspend": True}})
    assert checked("UPDATE", {"metadata": {"name": "x"}}, bad)


def test_experiment_secrets_and_worker_pull_secrets_reach_the_operator():
    def operator_env(*sets: str) -> dict[str, str]:
        (deployment,) = [
            d for d in objects(render(sets=sets), "Deployment") if d["metadata"]["name"].endswith("operator")
        ]
        return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert operator_env()["HACRL_EXPERIMENT_SECRETS"] == "" and "HACRL_WORKER_IMAGE_PULL_SECRETS" not in operator_env()
    env = operator_env(
        "experimentSecrets={hacrl-store,ml/hf-token}", "minio.enabled=true", "workerImagePullSecrets[0].name=regcred"
    )
    assert env["HACRL_EXPERIMENT_SECRETS"] == "hacrl-store,ml/hf-token,hacrl-minio"
    assert env["HACRL_WORKER_IMAGE_PULL_SECRETS"] == "regcred"
    # The default store's Secret is approved with it: naming it there is the admin's approval.
    env = operator_env(
        "defaultStore.uri=s3://team-runs", "defaultStore.credentialsSecret=team-s3", "experimentSecrets={hacrl-store}"
    )
    assert env["HACRL_EXPERIMENT_SECRETS"] == "hacrl-store,team-s3"


def test_crd_is_shipped_unchanged_and_alone():
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [Path(CRD_PATH).name]
    assert (CHART / "crds" / Path(CRD_PATH).name).read_text() == render_crd()
    crds = objects(render(extra=("--include-crds",)), "CustomResourceDefinition")
    assert [c["metadata"]["name"] for c in crds] == ["hacrlexperiments.hacrl.io"]
    assert not objects(render(), "CustomResourceDefinition"), "the CRD belongs in crds/, never in templates/"


def test_deployment_defaults():
    deployment = one(render(), "Deployment")
    spec = deployment["spec"]
    # Two replicas, one of them a standby (leader election: tests/chart/test_chart_leader_election.py).
    assert spec["replicas"] == 2 and spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/hacrl/hacrl-operator:0.1.0"
    assert container["command"] == ["python", "-m", "hacrl_operator"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == one(render(), "ServiceAccount")["metadata"]["name"]


def _plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_operator_accepts_the_environment_the_chart_gives_it(values: Path):
    """The Deployment's env parses with the operator's own OperatorConfig.from_env."""
    (container,) = one(render((str(values),)), "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    env = _plain_env(container)
    config = OperatorConfig.from_env(env)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == config.health_port and ports.get("metrics", 0) == config.metrics_port
    documented = set(re.findall(r'"(HACRL_[A-Z_]+)"', (ROOT / "operator/hacrl_operator/config.py").read_text()))
    unknown = {k for k in env if k.startswith("HACRL_") and k != "HACRL_S3_ENDPOINT"} - documented
    assert not unknown, f"the chart sets variables the operator does not read: {unknown}"
    chart_values = yaml.safe_load(values.read_text()) or {}
    namespaces = tuple(chart_values.get("watchNamespaces", ()))
    assert config.namespaces == namespaces


def test_worker_images_and_watch_settings_reach_the_operator():
    sets = (
        "images.rollout.repository=reg.example/hacrl-rollout",
        "images.rollout.tag=1.2.3",
        "images.learner.repository=reg.example/hacrl-learner",
        "images.learner.digest=sha256:" + "a" * 64,
        "reconcileInterval=2.5",
        "watchTimeouts.server=120",
        "watchTimeouts.client=200",
        "workerRunAsUser=2000",
        "metrics.port=9091",
    )
    (container,) = one(render(sets=sets), "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    config = OperatorConfig.from_env(_plain_env(container))
    assert config.rollout_image == "reg.example/hacrl-rollout:1.2.3"
    assert config.learner_image == "reg.example/hacrl-learner:0.1.0@sha256:" + "a" * 64
    assert (config.reconcile_interval, config.watch_server_timeout, config.watch_client_timeout) == (2.5, 120, 200)
    assert (config.run_as_user, config.metrics_port) == (2000, 9091)


def test_openshift_values_leave_every_uid_gid_and_fs_group_to_the_platform():
    """restricted-v2 refuses a fixed uid outside the namespace's range: the operator's pod and the
    worker pods it builds (from the config the chart gives it) set none, and stay non-root."""
    from hacrl_core.spec import parse_experiment
    from hacrl_operator.builders import build_pod

    fixed = ("runAsUser", "runAsGroup", "fsGroup")
    deployment = one(render((str(CHART / "ci" / "openshift-values.yaml"),)), "Deployment", RELEASE)
    pod = deployment["spec"]["template"]["spec"]
    contexts = [pod["securityContext"]] + [c.get("securityContext", {}) for c in pod["containers"]]
    assert not [k for context in contexts for k in fixed if k in context], contexts
    assert pod["securityContext"]["runAsNonRoot"]
    config = OperatorConfig.from_env(
        {**_plain_env(pod["containers"][0]), "HACRL_ROLLOUT_IMAGE": "r", "HACRL_LEARNER_IMAGE": "l"}
    )
    assert config.run_as_user is None
    experiment = parse_experiment(yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text()))
    owner = {"metadata": {"name": "quickstart", "namespace": "ns", "uid": "u"}}
    worker = build_pod(experiment, "qwen-bpe", "learner", owner, config)["spec"]
    contexts = [worker["securityContext"]] + [c["securityContext"] for c in worker["containers"]]
    assert not [k for context in contexts for k in fixed if k in context], contexts
    assert worker["securityContext"]["runAsNonRoot"] and worker["containers"][0]["securityContext"]["runAsNonRoot"]
    # The default stays uid/gid 1000, the images' USER.
    assert (
        OperatorConfig.from_env(
            _plain_env(one(render(), "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0])
        ).run_as_user
        == 1000
    )


def test_metrics_service_and_monitors():
    default = render()
    service = one(default, "Service", f"{RELEASE}-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    assert not objects(default, "ServiceMonitor") and not objects(default, "PodMonitor"), "monitors are off by default"

    docs = render((str(CHART / "ci" / "monitoring-values.yaml"),))
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= one(docs, "Service")["metadata"]["labels"].items()
    pods = one(docs, "PodMonitor")
    assert pods["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "hacrl-operator"}
    assert pods["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    # The worker pods the operator builds carry that label and a port of that name.
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"

    off = render(sets=("metrics.port=0", "metrics.serviceMonitor.enabled=false"))
    assert not [s for s in objects(off, "Service") if s["metadata"]["name"].endswith("-metrics")]
    (container,) = one(off, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in container["ports"]] == ["health"]


def test_worker_pods_match_the_pod_monitor():
    from hacrl_core.spec import load_experiment
    from hacrl_operator.builders import build_pod

    experiment = load_experiment(ROOT / "examples" / "kind-tiny.yaml")
    owner = {"metadata": {"name": experiment.name, "namespace": "default", "uid": "u"}}
    pod = build_pod(experiment, experiment.spec.agents[0].name, "learner", owner, OperatorConfig())
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hacrl-operator"
    assert [p["name"] for p in pod["spec"]["containers"][0]["ports"]] == ["metrics"]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_network_policies_select_the_pods_they_are_for():
    from hacrl_core.spec import load_experiment
    from hacrl_operator.builders import build_pod

    assert not objects(render(sets=("minio.enabled=true",)), "NetworkPolicy"), "off by default"
    docs = render(sets=("networkPolicy.enabled=true", "minio.enabled=true", "watchNamespaces={team-a,team-b}"))
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in objects(docs, "NetworkPolicy")}
    workers = [p for (ns, name), p in policies.items() if name.endswith("-workers")]
    assert sorted(p["metadata"]["namespace"] for p in workers) == ["team-a", "team-b"]
    # The worker policy selects the pods the operator builds and opens only their metrics port.
    experiment = load_experiment(ROOT / "examples" / "kind-tiny.yaml")
    owner = {"metadata": {"name": experiment.name, "namespace": "team-a", "uid": "u"}}
    for role in ("rollout", "learner"):
        pod = build_pod(experiment, experiment.spec.agents[0].name, role, owner, OperatorConfig())
        assert selects(workers[0]["spec"]["podSelector"], pod["metadata"]["labels"])
        (port,) = pod["spec"]["containers"][0]["ports"]
        assert workers[0]["spec"]["ingress"] == [{"ports": [{"port": port["name"], "protocol": "TCP"}]}]
    # The pods of a learner over several nodes (label hacrl.io/node), and only they, take any port from each other.
    ranks = [p for (ns, name), p in policies.items() if name.endswith("-learner-ranks")]
    assert sorted(p["metadata"]["namespace"] for p in ranks) == ["team-a", "team-b"]
    experiment.spec.agents[0].learner.nodes = 2
    node_pod = build_pod(experiment, experiment.spec.agents[0].name, "learner", owner, OperatorConfig(), node=1)
    rollout_pod = build_pod(experiment, experiment.spec.agents[0].name, "rollout", owner, OperatorConfig())

    def selects_with_expressions(selector: dict, labels: dict) -> bool:
        return selects(selector, labels) and all(
            e["operator"] == "Exists" and e["key"] in labels for e in selector.get("matchExpressions", [])
        )

    selector = ranks[0]["spec"]["podSelector"]
    assert selects_with_expressions(selector, node_pod["metadata"]["labels"]) and not selects_with_expressions(
        selector, rollout_pod["metadata"]["labels"]
    )
    assert ranks[0]["spec"]["ingress"] == [{"from": [{"podSelector": selector}]}]
    # MinIO's policy selects the MinIO pods and admits workers, the operator and the bucket Job.
    (minio,) = [p for (ns, name), p in policies.items() if name.endswith("-minio")]
    (minio_deployment,) = [d for d in objects(docs, "Deployment") if d["metadata"]["name"].endswith("-minio")]
    (operator,) = [d for d in objects(docs, "Deployment") if not d["metadata"]["name"].endswith("-minio")]
    (job,) = [j for j in objects(docs, "Job") if not is_crd_hook(j)]  # the bucket Job
    assert selects(minio["spec"]["podSelector"], minio_deployment["spec"]["template"]["metadata"]["labels"])
    peers = minio["spec"]["ingress"][0]["from"]
    for labels in (
        pod["metadata"]["labels"],
        operator["spec"]["template"]["metadata"]["labels"],
        job["spec"]["template"]["metadata"]["labels"],
    ):
        assert any(selects(peer["podSelector"], labels) for peer in peers), labels
    assert not selects(peers[0]["podSelector"], {"app": "something-else"}) and peers[0]["namespaceSelector"] == {}
    assert minio["spec"]["ingress"][0]["ports"] == [{"port": "s3", "protocol": "TCP"}]
    ports = {p["name"] for c in minio_deployment["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert "s3" in ports


def test_minio_off_by_default():
    docs = render()
    assert not [d for d in docs if "minio" in d["metadata"]["name"]]


def test_minio_secret_generated_never_in_values():
    docs = render((str(CHART / "ci" / "minio-values.yaml"),))
    secrets = objects(docs, "Secret")
    assert {s["metadata"]["namespace"] for s in secrets} == {NAMESPACE, "default"}
    assert {s["metadata"]["name"] for s in secrets} == {"hacrl-minio"}
    assert all(set(s["data"]) == set(CREDENTIAL_KEYS) for s in secrets)
    assert len({json.dumps(s["data"], sort_keys=True) for s in secrets}) == 1, "the copies must hold the same keys"
    # Random per render (no cluster: lookup finds nothing), i.e. generated, not from values.
    again = objects(render((str(CHART / "ci" / "minio-values.yaml"),), sets=("minio.bucket=hacrl",)), "Secret")
    assert again[0]["data"] != secrets[0]["data"]
    template = (CHART / "templates" / "minio-secret.yaml").read_text()
    assert "randAlphaNum" in template and 'lookup "v1" "Secret"' in template
    values_text = (CHART / "values.yaml").read_text().lower()
    assert not re.search(r"^\s*(password|secretkey|accesskey|rootpassword|rootuser)\s*:", values_text, re.M)
    # MinIO and the bucket job read the credentials by reference only.
    for kind in ("Deployment", "Job"):
        for obj in objects(docs, kind):
            for container in obj["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    assert (
                        not ("KEY" in env["name"] or "PASSWORD" in env["name"] or "ROOT_USER" in env["name"])
                        or "valueFrom" in env
                    ), env


def test_minio_objects_and_operator_credentials():
    docs = render((str(CHART / "ci" / "minio-values.yaml"),))
    minio = one(docs, "Deployment", "hacrl-minio")
    container = minio["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert minio["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert one(docs, "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"] == "5Gi"
    job = one(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    # The operator reads heartbeats with MinIO's credentials when store.credentialsSecret is empty.
    (operator,) = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in operator["env"] if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert {k: v["name"] for k, v in refs.items()} == {k: "hacrl-minio" for k in CREDENTIAL_KEYS}


def _operator_config(docs) -> OperatorConfig:
    (deployment,) = [d for d in objects(docs, "Deployment") if d["metadata"]["name"] != "hacrl-minio"]
    return OperatorConfig.from_env(_plain_env(deployment["spec"]["template"]["spec"]["containers"][0]))


@pytest.mark.parametrize(
    ("release", "namespace", "sets", "served"),
    [
        ("hacrl", "default", (), {"default"}),
        ("my-ops", "hacrl-system", (), {"hacrl-system"}),
        ("hacrl-operator", "tools", ("watchNamespaces={team-a,team-b}",), {"tools", "team-a", "team-b"}),
        ("x", "hacrl-system", ("minio.secretNamespaces={default}",), {"hacrl-system", "default"}),
    ],
)
def test_any_release_with_minio_gives_an_experiment_without_store_a_working_default(release, namespace, sets, served):
    """`helm install <any name> --set minio.enabled=true`, then examples/kind-tiny.yaml (no
    spec.store) in a namespace MinIO serves: the operator, configured from the rendered env alone,
    fills in a store whose endpoint is the rendered Service, whose bucket the hook Job creates,
    and whose Secret exists in that namespace and is approved for experiments."""
    from hacrl_core.spec import parse_experiment
    from hacrl_operator.builders import build_pod, experiment_from_body

    args = ["template", release, str(CHART), "--namespace", namespace, "--set", "minio.enabled=true"]
    for item in sets:
        args += ["--set", item]
    docs = [d for d in yaml.safe_load_all(run_helm(*args).stdout) if d]
    config = _operator_config(docs)
    store = config.default_store
    assert store is not None and store.uri == "s3://hacrl"
    service = one(docs, "Service", "hacrl-minio")
    assert store.endpoint == f"http://hacrl-minio.{namespace}.svc:{service['spec']['ports'][0]['port']}"
    job_env = {e["name"]: e.get("value") for e in one(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert job_env["BUCKET"] == "hacrl" and job_env["ENDPOINT"] == store.endpoint
    manifest = yaml.safe_load((ROOT / "examples" / "kind-tiny.yaml").read_text())
    assert "store" not in manifest["spec"], "the example relies on the install's default store"
    secret_namespaces = {
        s["metadata"]["namespace"] for s in objects(docs, "Secret") if s["metadata"]["name"] == "hacrl-minio"
    }
    assert secret_namespaces == served
    for experiment_ns in sorted(served - ({namespace} if config.namespaces else set())):
        body = {**manifest, "metadata": {"name": "kind-tiny", "namespace": experiment_ns, "uid": "u"}}
        experiment = parse_experiment(experiment_from_body(body, store))
        pod = build_pod(experiment, experiment.spec.agents[0].name, "learner", body, config)
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["HACRL_S3_ENDPOINT"]["value"] == store.endpoint and env["AWS_REGION"]["value"] == "us-east-1"
        for key in CREDENTIAL_KEYS:
            assert env[key]["valueFrom"]["secretKeyRef"]["name"] == "hacrl-minio"
        assert experiment_ns in secret_namespaces and config.secret_allowed(experiment_ns, "hacrl-minio")


def test_default_store_from_values_reaches_the_operator():
    docs = render(
        sets=(
            "defaultStore.uri=s3://team-runs/hacrl",
            "defaultStore.endpoint=https://s3.example.com",
            "defaultStore.region=eu-west-1",
            "defaultStore.credentialsSecret=team-s3",
            "minio.enabled=true",
        )
    )
    config = _operator_config(docs)
    assert config.default_store.model_dump(exclude_defaults=True) == {
        "uri": "s3://team-runs/hacrl",
        "endpoint": "https://s3.example.com",
        "region": "eu-west-1",
        "credentials_secret": "team-s3",
    }
    assert config.secret_allowed("any", "team-s3") and config.secret_allowed("any", "hacrl-minio")
    # The operator reads heartbeats with the default store's credentials unless store.credentialsSecret says otherwise.
    (container,) = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {k: "team-s3" for k in CREDENTIAL_KEYS}
    assert _operator_config(render()).default_store is None, "no default store unless one is configured"
    # `helm upgrade --reuse-values` from a release before defaultStore existed: no such key at all.
    assert _operator_config(render(sets=("defaultStore=null", "minio.enabled=true"))).default_store.uri == "s3://hacrl"
    external = _operator_config(render((str(CHART / "ci" / "default-store-values.yaml"),))).default_store
    assert (external.uri, external.credentials_secret) == ("s3://ml-runs/hacrl", "hacrl-store")


def test_grafana_dashboard_configmap():
    cm = one(render(), "ConfigMap", f"{RELEASE}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["hacrl.json"])
    assert dashboard["uid"] == "hacrl-overview" and dashboard["panels"]
    moved = one(render((str(CHART / "ci" / "monitoring-values.yaml"),)), "ConfigMap", f"{RELEASE}-dashboard")
    assert moved["metadata"]["namespace"] == "monitoring"


def test_notes_tell_the_next_command():
    result = run_helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "-f",
        str(CHART / "ci" / "minio-values.yaml"),
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in notes
    assert "applies the chart's CRD (crds/) first, in a hook Job" in notes
    manual = "kubectl replace --field-manager=hacrl-operator-chart -f charts/hacrl-operator/crds/"
    assert manual not in notes
    hookless = run_helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "crdUpgrade.enabled=false",
    )
    assert manual in hookless.stdout.split("NOTES:", 1)[1]
    assert f"s3://hacrl at http://hacrl-minio.{NAMESPACE}.svc:9000" in notes
    assert f"kubectl apply -n {NAMESPACE} -f examples/kind-tiny.yaml" in notes
    assert f"kubectl get hx -n {NAMESPACE} -w" in notes
    assert "helm upgrade" in notes and """minio.secretNamespaces=["default","<namespace>"]""" in notes
    # Watching other namespaces only: the example goes to a watched one.
    watched = run_helm(
        "install",
        "any-name",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "minio.enabled=true",
        "--set",
        "watchNamespaces={ml}",
    ).stdout.split("NOTES:", 1)[1]
    assert (
        "kubectl apply -n ml -f examples/kind-tiny.yaml" in watched
        and """watchNamespaces=["ml","<namespace>"]""" in watched
    )
    # No default store: the notes say that spec.store is needed, or how to get a default.
    bare = run_helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client").stdout.split(
        "NOTES:", 1
    )[1]
    assert "refuses experiments without spec.store" in bare
    assert (
        f"helm upgrade {RELEASE} charts/hacrl-operator -n {NAMESPACE} --reuse-values --set minio.enabled=true" in bare
    )
