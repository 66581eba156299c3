"""A Kubernetes API for the operator tests: kmock 0.8's emulator, with its gaps covered.

``EmulatedCluster`` runs ``kmock.KubernetesEmulator`` on a local port in a background thread
(its own event loop) and writes a kubeconfig for it; the REAL kubectl (/usr/bin/kubectl) and the
operator (kopf via ``KopfRunner``, plus the kubernetes client) talk to it over HTTP.

kmock 0.8 gaps covered here, each in ``PatchedEmulator``:

- no uid / resourceVersion / creationTimestamp / generation, no ``generateName`` (kopf's finalizer
  patch and event posting need them): stamped on create, resourceVersion bumped on every write
  (merge and JSON patches), generation on spec changes; a JSON patch whose ``test`` of the
  resourceVersion fails answers 422 as Kubernetes does (kmock: 500, and kopf retries forever);
- ``/api/v1/namespaces[/name]`` is misparsed (namespaces as objects fail): served by the harness;
- ``?watch=True`` (capitalised, sent by kubernetes<37) is served as a list: the query is normalised;
- lists lack kind/apiVersion (kubectl needs them): added;
- core discovery ``/api/v1`` answers groupVersion "/v1" (kubectl cannot map Pod): fixed to "v1";
  resources are declared with their real kind/singular/verbs/subresources;
- ``/version/`` 404s: served;
- no PUT (``kubectl replace``): served, conditional on the resourceVersion as in Kubernetes;
- server-side apply is a merge patch, 404 on an absent object: it creates an absent object and
  merges into an existing one as where another manager co-owns every field (nothing removed);
- no label or field selectors: equality-based ``labelSelector`` (``k=v``, ``k!=v``, ``k``, ``!k``)
  and ``fieldSelector`` on metadata.name/namespace, in lists and watches;
- no controllers: the garbage collector is emulated (children whose ownerReferences point at a
  deleted object are deleted, also those created after their owner was deleted), new pods get ``status.phase: Pending``; nothing runs pods: tests
  play kubelet by patching pod status with kubectl;
- no schema validation: the CRD's ``maxLength``s are checked on status writes (422 as the API
  server answers), nothing else; no ``kubectl get -w``: tests poll (``wait_for``) and never sleep-and-hope;
- no admission: OwnerReferencesPermissionEnforcement's permission checks on writes that set
  ownerReferences are recorded with the operator's requests and checked against its RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import itertools
import json
import logging
import os
import re
import secrets
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonpatch
import kmock
import yaml
from kmock._internal import enums

KUBECTL = os.environ.get("HACRL_TEST_KUBECTL", "/usr/bin/kubectl")
REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts/hacrl-operator/crds/hacrlexperiments.hacrl.io.yaml"

T = TypeVar("T")

# Numbers measured by the tests (printed in the pytest summary by conftest.py).
MEASUREMENTS: dict[str, list[float]] = {}


def measure(name: str, seconds: float) -> None:
    MEASUREMENTS.setdefault(name, []).append(seconds)


_ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
CORE_RESOURCES = {
    "v1/pods": dict(kind="Pod", singular="pod", namespaced=True, shortnames={"po"}, subresources={"status"}),
    "v1/configmaps": dict(kind="ConfigMap", singular="configmap", namespaced=True, shortnames={"cm"}),
    "v1/services": dict(kind="Service", singular="service", namespaced=True, shortnames={"svc"}),
    "v1/events": dict(kind="Event", singular="event", namespaced=True, shortnames={"ev"}),
    "v1/secrets": dict(kind="Secret", singular="secret", namespaced=True),
    # The operators' leader-election Lease (hacrl_operator/leader.py).
    "coordination.k8s.io/v1/leases": dict(kind="Lease", singular="lease", namespaced=True),
    "v1/namespaces": dict(
        kind="Namespace", singular="namespace", namespaced=False, shortnames={"ns"}, subresources={"status"}
    ),
    # Volcano's PodGroup (spec.scheduling.gang volcano), as if Volcano's CRDs were installed.
    "scheduling.volcano.sh/v1beta1/podgroups": dict(
        kind="PodGroup", singular="podgroup", namespaced=True, shortnames={"pg"}
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(
        kind="CustomResourceDefinition",
        singular="customresourcedefinition",
        namespaced=False,
        shortnames={"crd", "crds"},
    ),
}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(selector: str | None, obj: dict[str, Any]) -> bool:
    metadata = obj.get("metadata") or {}
    fields = {"metadata.name": metadata.get("name"), "metadata.namespace": metadata.get("namespace")}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        negate = "!=" in term
        key, value = term.split("!=" if negate else ("==" if "==" in term else "="), 1)
        if key.strip() in fields and (fields[key.strip()] == value.strip()) == negate:
            return False
    return True


REQUEST_HISTORY = 20


OPERATOR_USER_AGENTS = ("kopf/", "hacrl-operator/")


def rbac_access(method: str, path: str, query: Any) -> tuple[str, str, str] | None:
    """The (verb, apiGroup, resource) RBAC checks for an API request; None for non-resource URLs
    (discovery, /version), which every authenticated client may read."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if len(rest) >= 2 and rest[0] == "namespaces" and (len(rest) > 2 or method != "GET"):
        rest = rest[2:]  # /namespaces/<ns>/<resource>...; /namespaces/<ns> itself is the namespace
    if not rest:
        return None
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if method == "GET":
        verb = "get" if named else ("watch" if query.get("watch") in ("true", "True", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    return (verb, group, resource) if verb else None


class PatchedEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with the gaps listed in the module docstring covered."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version
        self._versions = itertools.count(1)
        self._namespaces: dict[str, str] = {}
        self._gone_uids: set[str] = set()  # of deleted objects, for the garbage collector
        # (verb, apiGroup, resource) of every request the operator sends (kopf's and its own
        # client's, told apart from kubectl and test drivers by User-Agent), checked against the
        # RBAC the chart grants (``rbac_problems``).
        self.access: set[tuple[str, str, str]] = set()
        # (path, query) of every watch request the operator opened.
        self.watches: list[tuple[str, dict[str, str]]] = []
        # The CRD's status schema by ("apis", group): status writes are checked against its maxLengths.
        self.status_schemas: dict[tuple[str, str], dict[str, Any]] = {}
        # (method, path) of every write, by the bearer token that sent it: operators started with
        # kubeconfigs of their own tokens (``EmulatedCluster.kubeconfig_for``) are told apart.
        self.writes_by_token: dict[str, list[tuple[str, str]]] = {}
        # Serialises writes that carry a resourceVersion precondition with their check (below).
        self._conditional = asyncio.Lock()

    async def _refuse_too_long_status(self, raw_request: Any, schema: dict[str, Any]) -> Any:
        """422 for a status write with a string longer than the CRD's maxLength, as the API server
        answers (it counts characters); kmock checks no schema."""
        from aiohttp import web

        try:
            body = json.loads(await raw_request.read() or b"null")
        except ValueError:
            return None
        status = body.get("status") if isinstance(body, dict) else None
        problems = _too_long(schema, status, "status")
        if not problems:
            return None
        message = f"HACRLExperiment is invalid: {problems[0]}"
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Invalid",
                "code": 422,
                "message": message,
            },
            status=422,
        )

    def _owner_reference_checks(self, access: tuple[str, str, str], raw_body: bytes) -> set[tuple[str, str, str]]:
        """The permissions that the OwnerReferencesPermissionEnforcement admission plugin (on by
        default in OpenShift) checks on a write that sets ownerReferences: ``delete`` on the object
        written, and ``update`` on the ``finalizers`` subresource of each owner referenced with
        ``blockOwnerDeletion: true``. kubernetes/kubernetes plugin/pkg/admission/gc/gc_admission.go;
        https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#ownerreferencespermissionenforcement"""
        try:
            body = json.loads(raw_body or b"null")
        except ValueError:
            return set()
        metadata = body.get("metadata") if isinstance(body, dict) else None
        owners = (metadata or {}).get("ownerReferences") or []
        if not owners:
            return set()
        _verb, group, resource = access
        checks = {("delete", group, resource.split("/")[0])}
        for owner in owners:
            if not owner.get("blockOwnerDeletion"):
                continue
            owner_group = owner["apiVersion"].rpartition("/")[0]
            plural = next(
                r.plural for r, info in self.resources.items() if r.group == owner_group and info.kind == owner["kind"]
            )
            checks.add(("update", owner_group, f"{plural}/finalizers"))
        return checks

    async def __call__(self, raw_request: Any) -> Any:
        if raw_request.headers.get("User-Agent", "").startswith(OPERATOR_USER_AGENTS):
            access = rbac_access(raw_request.method, raw_request.path, raw_request.rel_url.query)
            if access:
                self.access.add(access)
                if raw_request.method in ("POST", "PUT", "PATCH") and raw_request.can_read_body:
                    self.access.update(self._owner_reference_checks(access, await raw_request.read()))
            if raw_request.method == "GET" and raw_request.rel_url.query.get("watch") in ("true", "True", "1"):
                self.watches.append((raw_request.path, dict(raw_request.rel_url.query)))
        # kmock keeps every request ever served and matches each new one by scanning that history
        # (quadratic: with 50 experiments the emulator alone saturated a CPU and the operator
        # benchmark never finished). Nothing here reads old requests: keep a short tail.
        if len(self._requests) > 2 * REQUEST_HISTORY:
            del self._requests[:-REQUEST_HISTORY]
        parts = raw_request.path.strip("/").split("/")
        if raw_request.method == "PUT" and parts[-1] != "status":
            return await self._replace(raw_request, parts)
        if raw_request.method == "PATCH" and raw_request.content_type == "application/apply-patch+yaml":
            return await self._server_side_apply(raw_request, parts)
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
            return await self._serve_namespaces(raw_request, parts[3] if len(parts) == 4 else None)
        if (
            parts[-1:] == ["status"]
            and raw_request.method in ("PATCH", "PUT")
            and self.status_schemas.get(tuple(parts[:2]))
        ):
            refused = await self._refuse_too_long_status(raw_request, self.status_schemas[tuple(parts[:2])])
            if refused is not None:
                return refused
        token = raw_request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if token and raw_request.method in ("POST", "PUT", "PATCH", "DELETE"):
            self.writes_by_token.setdefault(token, []).append((raw_request.method, raw_request.path))
        query = raw_request.rel_url.query
        if query.get("watch") in ("True", "1"):
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.update_query(watch="true"))
        return await super().__call__(raw_request)

    def _live_key(self, parts: list[str]) -> tuple[tuple[str, str, str | None, str], Any]:
        """((group, plural, namespace, name), the live object's key in kmock or None) of an object's path."""
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        namespace = rest[1] if len(rest) == 4 and rest[0] == "namespaces" else None
        wanted = (group, rest[-2], namespace, rest[-1])
        key = next(
            (
                k
                for k, o in list(self._objects.items())
                if (k[0].group, k[0].plural, k[1], k[2]) == wanted and not o.deleted
            ),
            None,
        )
        return wanted, key

    async def _server_side_apply(self, raw_request: Any, parts: list[str]) -> Any:
        """A server-side apply (kmock: a merge patch, and 404 on an absent object). An absent object
        is created. An existing one gets the applied fields merged in as server-side apply merges
        them where another manager co-owns every field (Helm, which created it, or an earlier
        apply): nothing is ever removed; lists of named items (CRD versions) merge by name, and
        CEL rules by rule, as their API types declare (listType map); other lists are replaced."""
        from aiohttp import web

        (group, plural, namespace, name), key = self._live_key(parts)
        body = yaml.safe_load(await raw_request.read() or b"{}")
        async with self._lock:
            if key is not None:
                current = self._objects[key]
                merged = _apply_merge(current.raw, body)
                merged["metadata"]["resourceVersion"] = str(next(self._versions))
                current.clear()
                current.update(merged)
                await self._buses[key[0]].put({"type": "MODIFIED", "object": current.raw})
                return web.json_response(merged)
            resource = next(r for r in self._get_resources() if (r.group, r.plural) == (group, plural))
            metadata = body.setdefault("metadata", {})
            metadata.update(
                name=name,
                uid=str(uuid.uuid4()),
                resourceVersion=str(next(self._versions)),
                creationTimestamp=_now(),
                generation=1,
            )
            if namespace:
                metadata["namespace"] = namespace
            key = (resource, namespace, name)
            if key in self._objects:
                self._objects[key].create(body)
            else:
                self._objects[key] = body
            await self._buses[resource].put({"type": "ADDED", "object": body})
        return web.json_response(body, status=201)

    async def _replace(self, raw_request: Any, parts: list[str]) -> Any:
        """PUT of a whole object (``kubectl replace``), which kmock does not serve: the object becomes
        the body, keeping its uid and creationTimestamp, if the body's resourceVersion is current
        (409 otherwise, as Kubernetes answers); fields the body leaves out are gone."""
        from aiohttp import web

        def failure(code: int, reason: str, message: str) -> Any:
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "code": code,
                    "message": message,
                },
                status=code,
            )

        body = json.loads(await raw_request.read() or b"{}")
        async with self._lock:
            (_, plural, _, name), key = self._live_key(parts)
            if key is None:
                return failure(404, "NotFound", f"{plural} {name!r} not found")
            current = self._objects[key]
            metadata, now = body.setdefault("metadata", {}), current.get("metadata") or {}
            if str(metadata.get("resourceVersion")) != str(now.get("resourceVersion")):
                return failure(
                    409, "Conflict", f"Operation cannot be fulfilled on {plural} {name!r}: the object has been modified"
                )
            metadata.update({k: now[k] for k in ("uid", "creationTimestamp", "namespace") if k in now})
            metadata["resourceVersion"] = str(next(self._versions))
            metadata["generation"] = int(now.get("generation", 1)) + (body.get("spec") != current.get("spec"))
            current.clear()
            current.update(body)
            await self._buses[key[0]].put({"type": "MODIFIED", "object": current.raw})
        return web.json_response(body)

    async def _serve_namespaces(self, raw_request: Any, name: str | None) -> Any:
        """Namespaces as objects (kmock parses `/api/v1/namespaces[/x]` as a namespace prefix and fails)."""
        from aiohttp import web

        def namespace(n: str) -> dict[str, Any]:
            return {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": n, "uid": self._namespaces.get(n, "")},
                "status": {"phase": "Active"},
            }

        if raw_request.method == "POST":
            try:
                body = await raw_request.json()
            except ValueError:  # e.g. protobuf from typed kubectl commands; use `kubectl apply`
                return web.json_response(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "UnsupportedMediaType",
                        "code": 415,
                        "message": "send JSON (kubectl apply -f)",
                    },
                    status=415,
                )
            n = body.get("metadata", {}).get("name")
            if n in self._namespaces:
                return web.json_response(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "AlreadyExists",
                        "code": 409,
                        "message": f"namespaces {n!r} already exists",
                    },
                    status=409,
                )
            self._namespaces[n] = str(uuid.uuid4())
            return web.json_response(namespace(n), status=201)
        if name is None and raw_request.query.get("watch") in ("true", "True", "1"):
            # A watch: the known namespaces as ADDED, then an idle stream (namespaces never change here).
            for (_r, ns, _n), obj in list(self._objects.items()):
                if ns and not obj.deleted:
                    self._namespaces.setdefault(ns, str(uuid.uuid4()))
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(raw_request)
            for n in sorted(self._namespaces):
                await response.write(json.dumps({"type": "ADDED", "object": namespace(n)}).encode() + b"\n")
            await asyncio.sleep(float(raw_request.query.get("timeoutSeconds") or 3600))
            await response.write_eof()
            return response
        if name is None:
            for (_r, ns, _n), obj in list(self._objects.items()):
                if ns and not obj.deleted:
                    self._namespaces.setdefault(ns, str(uuid.uuid4()))
            names = set(self._namespaces)
            return web.json_response(
                {
                    "kind": "NamespaceList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "1"},
                    "items": [namespace(n) for n in sorted(names)],
                }
            )
        if name not in self._namespaces:
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                    "message": f"namespaces {name!r} not found",
                },
                status=404,
            )
        if raw_request.method == "DELETE":  # forgets the namespace; its objects stay (no namespace controller)
            found = namespace(name)
            del self._namespaces[name]
            return web.json_response(found)
        return web.json_response(namespace(name))  # GET, and PATCH (accepted, not applied)

    async def _handle(self, request: Any) -> Any:
        precondition = None
        if request.resource is not None and request.action == enums.action.UPDATE and isinstance(request.data, dict):
            precondition = (request.data.get("metadata") or {}).get("resourceVersion")
        if precondition is None:
            return await self._handle_write(request)
        # A merge patch that carries a resourceVersion is conditional in Kubernetes: 409 Conflict if
        # the object has changed since (leader election relies on it; kmock ignores it). The check
        # and the write hold one lock, so of two patches from the same version only one succeeds.
        async with self._conditional:
            key = (request.resource, request.namespace, request.name)
            current = self._objects[key] if key in self._objects and not self._objects[key].deleted else None
            if current is not None and str(current.get("metadata", {}).get("resourceVersion")) != str(precondition):
                raise kmock.KubernetesError(
                    status=409,
                    reason="Conflict",
                    message=(
                        f"Operation cannot be fulfilled on {request.resource.plural} {request.name!r}: "
                        "the object has been modified; please apply your changes to the latest version and try again"
                    ),
                )
            return await self._handle_write(request)

    async def _handle_write(self, request: Any) -> Any:
        deleted_uids: list[str] = []
        key = None
        if request.resource is not None and isinstance(request.data, dict):
            if request.action == enums.action.CREATE:
                self._stamp_new(request)
            elif request.action == enums.action.UPDATE and request.name is not None:
                metadata = request.data.setdefault("metadata", {})
                metadata["resourceVersion"] = str(next(self._versions))
                key = (request.resource, request.namespace, request.name)
                current = self._objects[key] if key in self._objects and not self._objects[key].deleted else None
                if current is not None and request.subresource is None and "spec" in request.data:
                    metadata["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1
        elif request.resource is not None and request.action == enums.action.UPDATE and isinstance(request.data, list):
            # A JSON patch (kopf's finalizer patches, with a `test` of resourceVersion): bump it too.
            request.data.append(
                {"op": "replace", "path": "/metadata/resourceVersion", "value": str(next(self._versions))}
            )
        if (
            request.resource is not None
            and request.name is not None
            and request.action in (enums.action.DELETE, enums.action.UPDATE)
        ):
            key = (request.resource, request.namespace, request.name)
        live_before = key is not None and key in self._objects and not self._objects[key].deleted
        uid = self._objects[key].get("metadata", {}).get("uid") if live_before else None
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchException as error:
            # A failed `test` op (stale resourceVersion) is 422 in Kubernetes; kopf retries on it.
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(error)) from None
        finally:
            if live_before and uid and self._objects[key].deleted:
                deleted_uids.append(uid)
                self._gone_uids.add(uid)
            elif request.action == enums.action.CREATE and isinstance(request.data, dict):
                # Created with an owner already deleted (a reconcile that read it just before):
                # the real garbage collector deletes it too, only later.
                owners = (request.data.get("metadata") or {}).get("ownerReferences") or []
                deleted_uids.extend(o["uid"] for o in owners if o.get("uid") in self._gone_uids)
            if deleted_uids:
                await self._collect_garbage(deleted_uids)

    def _stamp_new(self, request: Any) -> None:
        data = request.data
        metadata = data.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)
        if request.namespace and not metadata.get("namespace"):
            metadata["namespace"] = request.namespace
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata["resourceVersion"] = str(next(self._versions))
        metadata.setdefault("creationTimestamp", _now())
        metadata.setdefault("generation", 1)
        if request.resource.plural == "pods" and request.resource.group == "":
            data.setdefault("status", {"phase": "Pending"})

    async def _collect_garbage(self, uids: list[str]) -> None:
        """The garbage collector: delete, transitively, objects owned by a deleted uid."""
        pending = list(uids)
        while pending:
            uid = pending.pop()
            async with self._lock:
                for (resource, _ns, _name), obj in list(self._objects.items()):
                    if obj.deleted:
                        continue
                    owners = obj.get("metadata", {}).get("ownerReferences") or []
                    if any(o.get("uid") == uid for o in owners):
                        raw = obj.raw
                        obj.delete()
                        await self._buses[resource].put({"type": "DELETED", "object": raw})
                        if raw.get("metadata", {}).get("uid"):
                            pending.append(raw["metadata"]["uid"])

    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        resource = request.resource
        info = self._resources.get(resource)
        kind = (info.kind if info and info.kind else resource.plural.capitalize()) + "List"
        labels = request.params.get("labelSelector")
        fields = request.params.get("fieldSelector")
        items = [
            item
            for item in result["items"]
            if _selector_matches(labels, (item.get("metadata") or {}).get("labels") or {})
            and _fields_match(fields, item)
        ]
        return {
            "kind": kind,
            "apiVersion": "v1" if resource.group == "" else f"{resource.group}/{resource.version}",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "items": items,
        }

    async def _serve_watch(self, request: Any) -> Any:
        labels = request.params.get("labelSelector")
        fields = request.params.get("fieldSelector")
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and "object" in event:
                obj = event["object"]
                if not (
                    _selector_matches(labels, (obj.get("metadata") or {}).get("labels") or {})
                    and _fields_match(fields, obj)
                ):
                    continue
            yield event

    async def _serve_version(self, request: Any) -> Any:
        result = await super()._serve_version(request)
        if request.resource.group == "":
            result["groupVersion"] = request.resource.version
        for entry in result["resources"]:
            if "/" in entry["name"]:  # subresources carry no short names (kubectl warns otherwise)
                entry["shortNames"] = []
                entry["categories"] = []
            if not entry["verbs"]:
                entry["verbs"] = list(_ALL_VERBS)
            if entry["namespaced"] is None:
                entry["namespaced"] = True
        return result


def _apply_merge(current: Any, applied: Any) -> Any:
    """``applied`` merged into ``current`` keeping every field ``applied`` leaves out
    (``PatchedEmulator._server_side_apply``)."""
    if isinstance(current, dict) and isinstance(applied, dict):
        return {**current, **{k: _apply_merge(current.get(k), v) for k, v in applied.items()}}
    if isinstance(current, list) and isinstance(applied, list):
        for identity in ("name", "rule"):
            if all(isinstance(i, dict) and identity in i for i in [*current, *applied]) and (current or applied):
                merged = {i[identity]: i for i in current}
                for item in applied:
                    merged[item[identity]] = _apply_merge(merged.get(item[identity]), item)
                return list(merged.values())
    return copy.deepcopy(applied)


def _too_long(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    """Where ``value`` breaks a ``maxLength`` of ``schema`` (an OpenAPI v3 schema of the CRD)."""
    if isinstance(value, str):
        limit = schema.get("maxLength")
        return (
            [f"{path}: Too long: may not be more than {limit} bytes"]
            if limit is not None and len(value) > limit
            else []
        )
    if isinstance(value, dict):
        return [
            problem
            for key, item in value.items()
            if key in (schema.get("properties") or {})
            for problem in _too_long(schema["properties"][key], item, f"{path}.{key}")
        ]
    if isinstance(value, list) and "items" in schema:
        return [
            problem
            for index, item in enumerate(value)
            for problem in _too_long(schema["items"], item, f"{path}[{index}]")
        ]
    return []


def register_resources(emulator: PatchedEmulator, crd_file: Path = CRD_FILE) -> dict[str, Any]:
    """Declare the core resources and the CRD's resource (from the CRD file) for discovery."""
    for key, info in CORE_RESOURCES.items():
        emulator.resources[key] = kmock.ResourceInfo(verbs=set(_ALL_VERBS), **info)
    crd = yaml.safe_load(crd_file.read_text(encoding="utf-8"))
    spec = crd["spec"]
    for version in spec["versions"]:
        emulator.resources[f"{spec['group']}/{version['name']}/{spec['names']['plural']}"] = kmock.ResourceInfo(
            kind=spec["names"]["kind"],
            singular=spec["names"]["singular"],
            shortnames=set(spec["names"].get("shortNames", [])),
            namespaced=spec["scope"] == "Namespaced",
            verbs=set(_ALL_VERBS),
            subresources=set(version.get("subresources") or {}),
        )
        status_schema = version.get("schema", {}).get("openAPIV3Schema", {}).get("properties", {}).get("status")
        if status_schema:
            emulator.status_schemas["apis", spec["group"]] = status_schema
    return crd


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(
    predicate: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
        except AssertionError as error:
            last = error
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


class EmulatedCluster:
    """kmock in a background thread + a kubeconfig + a kubectl runner."""

    emulator_class: type[PatchedEmulator] = PatchedEmulator  # subclasses swap in fault injection

    def __init__(self, workdir: Path, crd_file: Path = CRD_FILE) -> None:
        self.workdir = workdir
        self.crd_file = crd_file
        self.kubeconfig = workdir / "kubeconfig"
        self.cache_dir = workdir / "kube-cache"
        self.emulator: PatchedEmulator | None = None
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> EmulatedCluster:
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error:
            raise RuntimeError(f"kmock did not start: {self._error!r}")
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "kmock", "user": {}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"}}
                    ],
                    "current-context": "kmock",
                }
            )
        )
        self.kubectl("apply", "-f", str(self.crd_file))
        return self

    def kubeconfig_for(self, token: str) -> Path:
        """A kubeconfig whose user sends bearer ``token``: the emulator records each client's writes
        under it (``PatchedEmulator.writes_by_token``); it checks no credentials."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"] = [{"name": "kmock", "user": {"token": token}}]
        path = self.workdir / f"kubeconfig-{token}"
        path.write_text(yaml.safe_dump(config))
        return path

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as error:  # reported by start()
            self._error = error
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        emulator = self.emulator_class()
        register_resources(emulator, self.crd_file)
        async with emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.port = server.port
            self._ready.set()
            await self._stopping.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    def server_errors(self) -> list[Exception]:
        """Errors kmock itself hit while serving (a harness bug if not empty)."""
        if self.emulator is None:
            return []
        return [e for e in self.emulator.errors if not isinstance(e, kmock.KubernetesError) or e.status >= 500]

    # -- kubectl ----------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        command = [
            KUBECTL,
            "--kubeconfig",
            str(self.kubeconfig),
            "--cache-dir",
            str(self.cache_dir),
            "--request-timeout=10s",
            *args,
        ]
        if args and args[0] in ("apply", "create", "replace"):
            command.append("--validate=false")  # kmock serves no OpenAPI schema
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def get(self, kind: str, name: str | None = None, namespace: str | None = None, selector: str | None = None) -> Any:
        """`kubectl get -o json`: one object (None when absent) or the list of items."""
        args = (
            ["get", kind]
            + ([name] if name else [])
            + (["-n", namespace] if namespace else [])
            + (["-l", selector] if selector else [])
            + ["-o", "json"]
        )
        result = self.kubectl(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        data = json.loads(result.stdout)
        return data if name else data.get("items", [])

    def patch_status(self, kind: str, name: str, namespace: str, status: dict[str, Any]) -> None:
        self.kubectl(
            "patch",
            kind,
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )

    def set_pod_phase(self, name: str, namespace: str, phase: str, **extra: Any) -> None:
        """Play kubelet: set a pod's phase (and any other status fields)."""
        self.patch_status("pod", name, namespace, {"phase": phase, **extra})

    def fail_pod(self, name: str, namespace: str, container: str, exit_code: int = 1, reason: str = "Error") -> None:
        """Play kubelet: the pod Failed, its one container terminated with ``exit_code``."""
        terminated = {"exitCode": exit_code, "reason": reason}
        status = {"name": container, "ready": False, "restartCount": 0, "image": "x", "imageID": ""}
        self.set_pod_phase(
            name, namespace, "Failed", containerStatuses=[{**status, "state": {"terminated": terminated}}]
        )


class LogCapture(logging.Handler):
    """Collects the operator's and kopf's log records to assert that no handler raised."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self, allowed: tuple[str, ...] = ()) -> list[str]:
        messages = []
        for record in self.records:
            if record.levelno < logging.ERROR:
                continue
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
            if not any(a in text for a in allowed):
                messages.append(f"{record.name}: {text}")
        return messages

    def messages(self, contains: str) -> list[str]:
        return [r.getMessage() for r in self.records if contains in r.getMessage()]


@contextlib.contextmanager
def capture_logs(*names: str) -> Iterator[LogCapture]:
    capture = LogCapture()
    loggers = [logging.getLogger(n) for n in names]
    for logger in loggers:
        logger.addHandler(capture)
    try:
        yield capture
    finally:
        for logger in loggers:
            logger.removeHandler(capture)


class OperatorHandle:
    """A running operator: its KopfRunner, Reconciler, config and captured logs."""

    def __init__(self, runner: Any, reconciler: Any, config: Any, logs: LogCapture, cluster: EmulatedCluster) -> None:
        self.runner = runner
        self.reconciler = reconciler
        self.config = config
        self.logs = logs
        self.cluster = cluster
        self.allowed_errors: tuple[str, ...] = ()

    def expect_errors(self, *fragments: str) -> None:
        """Log records at ERROR level containing one of ``fragments`` are expected (e.g. an invalid spec)."""
        self.allowed_errors += fragments

    def reconciles(self, trigger: str | None = None) -> float:
        """Reconciles this operator has run to the end so far (of ``trigger``, or of every trigger);
        a coalesced request is not one: another reconcile runs for it."""
        return sum(
            sample.value
            for metric in self.reconciler.metrics.registry.collect()
            for sample in metric.samples
            if sample.name == "hacrl_operator_reconciles_total"
            and sample.labels["outcome"] != "coalesced"
            and trigger in (None, sample.labels["trigger"])
        )

    def wait_for_reconciles(self, count: int, *, trigger: str | None = None, timeout: float = 10.0) -> None:
        """Until ``count`` more reconciles have run: what a negative check waits for, so that the
        operator has had its chances to (wrongly) act however slow the machine."""
        target = self.reconciles(trigger) + count
        wait_for(
            lambda: self.reconciles(trigger) >= target,
            timeout=timeout,
            what=f"{count} more {trigger or 'any'} reconciles",
        )

    def handled_events(self, handler: str, name: str) -> int:
        """Events of object ``name`` that the kopf handler function ``handler`` has returned from: kopf
        logs each with the object's reference, naming the handler by its qualified name."""
        done = re.compile(rf"Handler '(?:.+\.)?{re.escape(handler)}' succeeded\.")
        return sum(
            1
            for record in self.logs.records
            if getattr(record, "k8s_ref", {}).get("name") == name and done.fullmatch(record.getMessage())
        )


def operator_config(cluster: EmulatedCluster, **env: str) -> Any:
    """The ``OperatorConfig`` that ``run_operator`` runs with (the tests' settings, then ``env``);
    bench/operator.py builds the same pods from it without an operator."""
    from hacrl_operator.config import OperatorConfig

    return OperatorConfig.from_env(
        {
            "KUBECONFIG": str(cluster.kubeconfig),
            "HACRL_RECONCILE_INTERVAL": "0.2",
            "HACRL_OPERATOR_METRICS_PORT": str(free_port()),
            "HACRL_OPERATOR_HEALTH_PORT": str(free_port()),
            "HACRL_ROLLOUT_IMAGE": "registry.test/hacrl-rollout:test",
            "HACRL_LEARNER_IMAGE": "registry.test/hacrl-learner:test",
            # The Secrets the tests' experiments name, approved as a cluster admin would.
            "HACRL_EXPERIMENT_SECRETS": "s3-creds,store-creds",
            **env,
        }
    )


@contextlib.contextmanager
def run_operator(cluster: EmulatedCluster, **env: str) -> Iterator[OperatorHandle]:
    """The operator (all handlers of hacrl_operator) under ``kopf.testing.KopfRunner`` against ``cluster``.

    On exit, asserts that kopf exited 0 with no exception, that no handler or reconcile logged an
    error (except those declared with ``expect_errors``) and that kmock hit no internal error.
    """
    import kopf
    from kopf.testing import KopfRunner

    from hacrl_operator.handlers import register

    config = operator_config(cluster, **env)
    registry = kopf.OperatorRegistry()
    reconciler = register(registry, config)
    scope = ["--all-namespaces"] if config.clusterwide else [f"--namespace={n}" for n in config.namespaces]
    args = ["run", "--standalone", *scope, f"--liveness=http://127.0.0.1:{config.health_port}/healthz"]
    with capture_logs("kopf", "hacrl_operator") as logs:
        runner = KopfRunner(args, registry=registry, timeout=30)
        handle = OperatorHandle(runner, reconciler, config, logs, cluster)
        with runner:
            wait_for(
                lambda: reconciler.kube is not None and _healthy(config.health_port),
                timeout=15,
                what="operator start-up",
            )
            yield handle
    assert runner.exit_code == 0, runner.output[-3000:]
    assert runner.exception is None, runner.exception
    assert not rbac_problems(cluster, config.clusterwide), rbac_problems(cluster, config.clusterwide)
    errors = logs.errors(handle.allowed_errors)
    assert not errors, "operator logged errors:\n" + "\n".join(errors)
    assert not cluster.server_errors(), cluster.server_errors()


def rbac_problems(cluster: EmulatedCluster, clusterwide: bool = True) -> list[str]:
    """Requests the operator made that hacrl_operator.rbac does not grant (to an operator limited
    to listed namespaces: the "namespace" rules only). The chart renders exactly those rules
    (tests/chart/test_rbac.py), so this is the check that the chart's RBAC is enough for
    everything the operator did in the test."""
    from hacrl_operator.rbac import RULES

    granted = {
        (verb, rule.api_group, rule.resource)
        for rule in RULES
        for verb in rule.verbs
        if clusterwide or rule.scope in ("namespace", "lease")
    }
    emulator = cluster.emulator
    return sorted(
        f"{verb} {group or 'core'}/{resource}"
        for verb, group, resource in (emulator.access if emulator else ())
        if (verb, group, resource) not in granted
    )


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False
