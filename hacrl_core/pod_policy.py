"""What `spec.agents[].podTemplate.<role>` may set: one allow-list, checked in two places.

The operator creates worker pods with its own service account, so whatever an experiment may
put into a pod, anyone who may create an experiment may put there. A deny-list always misses
something (a sidecar without a securityContext, a `projected` Secret volume, `nodeName`), so
the override is checked against what users legitimately need instead: scheduling fields,
resources, ConfigMap-backed env, emptyDir/PVC/configMap/ephemeral volumes and their mounts,
sidecars and init containers. Secrets never enter through it: they reach pods only through
first-class spec fields (store credentials, model token, ``spec.env``/``spec.envFrom``), which the operator checks against the Secrets the cluster admin marked
usable (``OperatorConfig.experiment_secrets``).

The same tables give

- ``override_problems``: the Python check behind `hacrl validate`/`hacrl run` and the operator;
- ``admission_rules``: CEL for the chart's ValidatingAdmissionPolicy, so `kubectl apply` refuses
  the same documents before the operator sees them (tests evaluate both on the same cases);
- ``LOCKED_POD_SECURITY``/``LOCKED_CONTAINER_SECURITY``: what the operator merges over every
  container's securityContext after the override, whatever the override said.
"""

from __future__ import annotations

import json
from typing import Any

# Pod spec fields an override may set (or delete with null), plus `metadata` (labels and
# annotations only; the operator's own labels win).
POD_FIELDS = (
    "metadata",
    "affinity",
    "nodeSelector",
    "tolerations",
    "topologySpreadConstraints",
    "priorityClassName",
    "schedulerName",
    "runtimeClassName",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "dnsConfig",
    "enableServiceLinks",
    "containers",
    "initContainers",
    "volumes",
    "securityContext",
)
CONTAINER_FIELDS = (
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "resources",
    "volumeMounts",
    "ports",
    "securityContext",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "restartPolicy",
    "terminationMessagePath",
    "terminationMessagePolicy",
)
CONTAINER_LISTS = ("containers", "initContainers")
VOLUME_SOURCES = ("emptyDir", "persistentVolumeClaim", "configMap", "ephemeral", "downwardAPI")
VOLUME_MOUNT_FIELDS = ("name", "mountPath", "subPath", "subPathExpr", "readOnly")
ENV_VALUE_SOURCES = ("configMapKeyRef", "fieldRef", "resourceFieldRef")
ENV_FROM_FIELDS = ("configMapRef", "prefix")
PORT_FIELDS = ("name", "containerPort", "protocol")
METADATA_FIELDS = ("labels", "annotations")

# Security settings merged over the override; an override may repeat them, never change them.
LOCKED_POD_SECURITY: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
LOCKED_CONTAINER_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY_FIELDS = ("runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy", "supplementalGroups")
CONTAINER_SECURITY_FIELDS = ("runAsUser", "runAsGroup", "readOnlyRootFilesystem")

SECRETS_HINT = (
    "Secrets reach pods only through spec.store.credentialsSecret, spec.modelTokenSecret, "
    "spec.env[].valueFrom.secretKeyRef and spec.envFrom[].secretRef (each approved by the cluster admin)"
)
_WHY = {
    "serviceAccountName": "worker pods run without a service account token",
    "serviceAccount": "worker pods run without a service account token",
    "automountServiceAccountToken": "worker pods run without a service account token",
    "imagePullSecrets": "pull secrets of worker pods are set by the cluster admin (chart value workerImagePullSecrets)",
    "nodeName": "it bypasses the scheduler; use nodeSelector or affinity",
    "hostNetwork": "worker pods use no host namespaces",
    "hostPID": "worker pods use no host namespaces",
    "hostIPC": "worker pods use no host namespaces",
    "ephemeralContainers": "containers go in containers or initContainers",
}

Problem = tuple[str, str]  # (path inside the override, what is wrong)


def _not_allowed(key: str, allowed: tuple[str, ...]) -> str:
    why = _WHY.get(key)
    return f"not allowed ({why})" if why else f"not allowed (allowed: {', '.join(allowed)})"


def _locked(
    path: str, key: str, value: Any, locked: dict[str, Any], allowed: tuple[str, ...], problems: list[Problem]
) -> None:
    if key in locked:
        if value != locked[key]:
            problems.append(
                (
                    f"{path}.{key}",
                    f"{json.dumps(value)} is not allowed (worker pods always run with {key}: {json.dumps(locked[key])})",
                )
            )
    elif key not in allowed:
        problems.append((f"{path}.{key}", _not_allowed(key, allowed + tuple(locked))))
    elif key == "runAsUser" and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        problems.append(
            (
                f"{path}.runAsUser",
                f"{json.dumps(value)} is not allowed (worker pods run as a non-root user: a positive uid)",
            )
        )


def _security_context(
    path: str, value: Any, locked: dict[str, Any], allowed: tuple[str, ...], problems: list[Problem]
) -> None:
    if value is None:
        return  # deleting it is harmless: the locked settings are merged back afterwards
    if not isinstance(value, dict):
        problems.append((path, "must be an object"))
        return
    for key, item in value.items():
        _locked(path, key, item, locked, allowed, problems)


def _keys(path: str, value: Any, allowed: tuple[str, ...], problems: list[Problem]) -> dict[str, Any]:
    if not isinstance(value, dict):
        problems.append((path, "must be an object"))
        return {}
    for key in value:
        if key not in allowed:
            problems.append((f"{path}.{key}", _not_allowed(key, allowed)))
    return value


def _container(path: str, container: Any, problems: list[Problem]) -> None:
    fields = _keys(path, container, CONTAINER_FIELDS, problems)
    if fields and not isinstance(fields.get("name"), str):
        problems.append(
            (f"{path}.name", "required (containers are merged by name; the worker container is named after its role)")
        )
    for index, var in enumerate(fields.get("env") or []):
        source = (var or {}).get("valueFrom") if isinstance(var, dict) else None
        if isinstance(source, dict):
            for key in source:
                if key not in ENV_VALUE_SOURCES:
                    hint = SECRETS_HINT if key == "secretKeyRef" else f"allowed: {', '.join(ENV_VALUE_SOURCES)}"
                    problems.append((f"{path}.env[{index}].valueFrom.{key}", f"not allowed ({hint})"))
    for index, source in enumerate(fields.get("envFrom") or []):
        for key in source if isinstance(source, dict) else ():
            if key not in ENV_FROM_FIELDS:
                hint = SECRETS_HINT if key == "secretRef" else f"allowed: {', '.join(ENV_FROM_FIELDS)}"
                problems.append((f"{path}.envFrom[{index}].{key}", f"not allowed ({hint})"))
    for index, mount in enumerate(fields.get("volumeMounts") or []):
        _keys(f"{path}.volumeMounts[{index}]", mount, VOLUME_MOUNT_FIELDS, problems)
    for index, port in enumerate(fields.get("ports") or []):
        _keys(f"{path}.ports[{index}]", port, PORT_FIELDS, problems)
    if "securityContext" in fields:
        _security_context(
            f"{path}.securityContext",
            fields["securityContext"],
            LOCKED_CONTAINER_SECURITY,
            CONTAINER_SECURITY_FIELDS,
            problems,
        )


def override_problems(override: dict[str, Any]) -> list[Problem]:
    """Every place where ``override`` leaves the allow-list, as ``(path, problem)`` pairs."""
    problems: list[Problem] = []
    for key, value in override.items():
        if key not in POD_FIELDS:
            problems.append((key, _not_allowed(key, POD_FIELDS)))
        elif key in CONTAINER_LISTS:
            for index, container in enumerate(value or []):
                _container(f"{key}[{index}]", container, problems)
        elif key == "volumes":
            for index, volume in enumerate(value or []):
                fields = _keys(f"volumes[{index}]", volume, ("name",) + VOLUME_SOURCES, problems)
                if fields and sum(source in fields for source in VOLUME_SOURCES) != 1:
                    problems.append((f"volumes[{index}]", f"needs exactly one source of: {', '.join(VOLUME_SOURCES)}"))
        elif key == "securityContext":
            _security_context("securityContext", value, LOCKED_POD_SECURITY, POD_SECURITY_FIELDS, problems)
        elif key == "metadata":
            for part, items in _keys("metadata", value, METADATA_FIELDS, problems).items():
                if not (
                    isinstance(items, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in items.items())
                ):
                    problems.append((f"metadata.{part}", "must map strings to strings"))
    return problems


def lock_down(pod_spec: dict[str, Any], run_as_user: int | None) -> dict[str, Any]:
    """``pod_spec`` with the locked settings merged over the pod's and every container's
    securityContext (sidecars and init containers included), whatever an override set.
    ``run_as_user`` None sets no uid, gid or fsGroup (the platform assigns them)."""
    ids = {} if run_as_user is None else {"runAsUser": run_as_user, "runAsGroup": run_as_user, "fsGroup": run_as_user}
    pod_context = {**ids, **(pod_spec.get("securityContext") or {})}
    pod_spec["securityContext"] = {**pod_context, **LOCKED_POD_SECURITY}
    for kind in CONTAINER_LISTS:
        for container in pod_spec.get(kind) or []:
            container["securityContext"] = {**(container.get("securityContext") or {}), **LOCKED_CONTAINER_SECURITY}
    return pod_spec


# -- CEL for the ValidatingAdmissionPolicy ------------------------------------------------------
# Plain CEL (macros has/all/exists, `in` on lists) so that the expressions mean the same under the
# API server's cel-go and the cel-python the tests evaluate them with. The policy sees the object
# as untyped JSON, so the pod override's unknown fields are reachable (a CRD x-kubernetes-
# validations rule could not see them).


def _cel_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _only(var: str, allowed: tuple[str, ...]) -> str:
    return f"{var}.all(k, k in {_cel_list(allowed)})"


def _cel_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_cel_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_cel_value(v) for v in value) + "]"
    return json.dumps(value)


def _cel_security(var: str, locked: dict[str, Any], allowed: tuple[str, ...]) -> str:
    checks = [_only(var, allowed + tuple(locked)), f"(!has({var}.runAsUser) || {var}.runAsUser > 0)"]
    checks += [f"(!has({var}.{key}) || {var}.{key} == {_cel_value(value)})" for key, value in locked.items()]
    return " && ".join(checks)


def _cel_container(c: str) -> str:
    return " && ".join(
        (
            _only(c, CONTAINER_FIELDS),
            f"(!has({c}.env) || {c}.env.all(e, !has(e.valueFrom) || {_only('e.valueFrom', ENV_VALUE_SOURCES)}))",
            f"(!has({c}.envFrom) || {c}.envFrom.all(e, {_only('e', ENV_FROM_FIELDS)}))",
            f"(!has({c}.volumeMounts) || {c}.volumeMounts.all(m, {_only('m', VOLUME_MOUNT_FIELDS)}))",
            f"(!has({c}.ports) || {c}.ports.all(p, {_only('p', PORT_FIELDS)}))",
            f"(!has({c}.securityContext) || {_cel_security(c + '.securityContext', LOCKED_CONTAINER_SECURITY, CONTAINER_SECURITY_FIELDS)})",
        )
    )


def _for_each_template(body: str) -> str:
    """``body`` (over ``t``, one role's override) true for every role of every agent."""
    roles = " && ".join(
        f"(!has(a.podTemplate.{role}) || [a.podTemplate.{role}].all(t, {body}))" for role in ("rollout", "learner")
    )
    return f"!has(object.spec.agents) || object.spec.agents.all(a, !has(a.podTemplate) || ({roles}))"


def admission_rules() -> list[dict[str, str]]:
    """The allow-list as ValidatingAdmissionPolicy validations (``expression``, ``message``)."""
    containers = " && ".join(f"(!has(t.{kind}) || t.{kind}.all(c, {_cel_container('c')}))" for kind in CONTAINER_LISTS)
    volume = (
        f"{_only('v', ('name',) + VOLUME_SOURCES)} && {_cel_list(list(VOLUME_SOURCES))}.filter(s, s in v).size() == 1"
    )
    return [
        {
            "expression": _for_each_template(_only("t", POD_FIELDS)),
            "message": f"podTemplate.<role> may set only: {', '.join(POD_FIELDS)} (docs/security.md)",
        },
        {
            "expression": _for_each_template(containers),
            "message": "podTemplate containers: env only from values or ConfigMaps, no hostPort, no weaker securityContext; "
            f"{SECRETS_HINT} (docs/security.md)",
        },
        {
            "expression": _for_each_template(f"!has(t.volumes) || t.volumes.all(v, {volume})"),
            "message": f"podTemplate volumes: exactly one of {', '.join(VOLUME_SOURCES)} each (docs/security.md)",
        },
        {
            "expression": _for_each_template(f"!has(t.metadata) || {_only('t.metadata', METADATA_FIELDS)}"),
            "message": "podTemplate metadata: labels and annotations only (docs/security.md)",
        },
        {
            "expression": _for_each_template(
                f"!has(t.securityContext) || {_cel_security('t.securityContext', LOCKED_POD_SECURITY, POD_SECURITY_FIELDS)}"
            ),
            "message": "podTemplate securityContext: worker pods run as a non-root user with the RuntimeDefault seccomp profile (docs/security.md)",
        },
    ]
