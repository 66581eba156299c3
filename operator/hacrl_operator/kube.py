"""A small dict-in, dict-out Kubernetes client for the few calls the operator makes.

It goes through the official client's ``ApiClient.call_api`` (auth, TLS, proxies) but keeps
manifests as plain dicts: the builders and the status planner work on dicts, and no model
(de)serialisation can drop a field the client's models do not know. kopf watches and patches
the experiments itself; this client is for the children and the status.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

from hacrl_core import __version__
from hacrl_core.spec import API_GROUP, API_VERSION, PLURAL
from hacrl_operator.concurrency import RECONCILE_THREADS
from hacrl_operator.config import OperatorConfig

_TIMEOUT = (5, 30)  # connect, read (seconds)
MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def load_configuration(config: OperatorConfig) -> kubernetes.client.Configuration:
    """A client configuration: the kubeconfig of ``$KUBECONFIG`` if set, else in-cluster, else ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    if config.kubeconfig:
        kubernetes.config.load_kube_config(config_file=config.kubeconfig, client_configuration=configuration)
        return configuration
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


class Kube:
    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        # A kept-alive connection per thread that reconciles (the default is 5 per CPU).
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, RECONCILE_THREADS)
        self.configuration = configuration
        self.api = kubernetes.client.ApiClient(configuration)
        # Says who is asking in API server audit logs (kopf's own requests say kopf/<version>).
        self.api.user_agent = f"hacrl-operator/{__version__}"

    def close(self) -> None:
        self.api.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            response = self.api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=_TIMEOUT,
            )
        except ApiException as error:
            raise KubeError(
                error.status or 0, f"{method} {path}: {error.status} {error.reason}: {_message(error)}"
            ) from None
        data = response.data
        return json.loads(data) if data else None

    # -- experiments ---------------------------------------------------------------------------

    @staticmethod
    def experiment_path(namespace: str, name: str) -> str:
        return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}"

    def get_experiment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(self.experiment_path(namespace, name))

    def patch_experiment_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.request(
            "PATCH",
            self.experiment_path(namespace, name) + "/status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )

    def delete_experiment(self, namespace: str, name: str) -> None:
        self.delete(self.experiment_path(namespace, name))

    # -- children -----------------------------------------------------------------------------

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        listing = (
            self.request("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": label_selector}) or {}
        )
        return list(listing.get("items") or [])

    @staticmethod
    def collection_path(api_version: str, kind: str, namespace: str) -> str:
        """The path of the namespaced collection of ``kind`` (one of the kinds the operator creates)."""
        plural = {"Pod": "pods", "ConfigMap": "configmaps", "Service": "services", "PodGroup": "podgroups"}[kind]
        root = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        return f"{root}/namespaces/{namespace}/{plural}"

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create a namespaced object; False if it exists already (idempotent)."""
        path = self.collection_path(
            manifest.get("apiVersion", "v1"), manifest["kind"], manifest["metadata"]["namespace"]
        )
        try:
            self.request("POST", path, body=manifest)
        except KubeError as error:
            if error.status == 409:
                return False
            raise
        return True

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    def delete(self, path: str) -> bool:
        """Delete an object; False if it was gone already."""
        try:
            self.request("DELETE", path, body={"propagationPolicy": "Background"})
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str) -> bool:
        return self.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def get_object(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """The stored object of ``manifest``'s kind, namespace and name, or None."""
        metadata = manifest["metadata"]
        return self.get(
            self.collection_path(manifest.get("apiVersion", "v1"), manifest["kind"], metadata["namespace"])
            + f"/{metadata['name']}"
        )

    def patch_spec(self, manifest: dict[str, Any]) -> None:
        """Merge-patch the stored object's spec to ``manifest``'s."""
        metadata = manifest["metadata"]
        path = (
            self.collection_path(manifest.get("apiVersion", "v1"), manifest["kind"], metadata["namespace"])
            + f"/{metadata['name']}"
        )
        self.request("PATCH", path, body={"spec": manifest["spec"]}, content_type=MERGE_PATCH)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    def patch_configmap_data(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.request(
            "PATCH", f"/api/v1/namespaces/{namespace}/configmaps/{name}", body={"data": data}, content_type=MERGE_PATCH
        )


def _message(error: ApiException) -> str:
    try:
        return json.loads(error.body).get("message") or ""
    except (TypeError, ValueError, AttributeError):
        return str(error.body or "")[:200]
