"""Operator-wide activities: settings, login, metrics server, periodic ticker, liveness probe."""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf
import kubernetes.client

from hacrl_operator.builders import LABEL_EXPERIMENT
from hacrl_operator.concurrency import HANDLER_THREADS
from hacrl_operator.config import FINALIZER, OperatorConfig
from hacrl_operator.handlers.reconcile import Reconciler
from hacrl_operator.handlers.ticker import Ticker
from hacrl_operator.kube import Kube, load_configuration

logger = logging.getLogger("hacrl_operator")

API_CONNECT_TIMEOUT = 10.0  # seconds; kopf's settings.networking, see configure_settings
API_REQUEST_TIMEOUT = 60.0


def configure_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """The kopf settings, each with the reason it is set."""
    # Watch timeouts: without them a watch stream whose connection died silently (a load
    # balancer or NAT dropping idle TCP) is never re-opened and the operator stops seeing events
    # while looking healthy. https://kopf.readthedocs.io/en/stable/configuration/#api-timeouts
    settings.watching.server_timeout = config.watch_server_timeout
    settings.watching.client_timeout = config.watch_client_timeout
    settings.watching.connect_timeout = config.watch_connect_timeout
    # Timeouts of kopf's other requests (finalizer and annotation patches, Events, the initial
    # lists): kopf's defaults are 5 minutes for a request and no connect timeout, so an API server
    # that accepts and stalls held an object's handling that long, retried 8 times. The API server
    # answers these in well under a second; the operator's own client allows 5 s and 30 s (kube.py).
    settings.networking.connect_timeout = API_CONNECT_TIMEOUT
    settings.networking.request_timeout = API_REQUEST_TIMEOUT
    # Threads for the synchronous handlers: enough that experiments whose store hangs, each
    # holding up to two until its deadline, leave the rest for the others (concurrency.py).
    settings.execution.max_workers = HANDLER_THREADS
    # Our own finalizer name (added only to experiments whose cleanup deletes the store).
    settings.persistence.finalizer = FINALIZER
    # kopf's bookkeeping in annotations of our group, so `status` holds only what the CRD
    # declares and the operator writes (kopf's default also writes status.kopf).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="hacrl.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="hacrl.io", key="last-handled-configuration"
    )
    # Limited to listed namespaces (exact names, no globs), the operator has nothing to discover:
    # kopf's scanning would list and watch every namespace and CRD of the cluster, which needs a
    # ClusterRole (hacrl_operator.rbac); without it such an install needs no cluster-wide right.
    settings.scanning.disabled = not config.clusterwide
    # Only our pods, filtered by the API server: without a selector kopf's pod watch streams
    # every pod event of the cluster (or namespace) to the operator, to drop all but ours.
    settings.watching.label_selectors["", "v1", "pods"] = LABEL_EXPERIMENT
    # No kopf peering: it pauses operators of lower priority but lets equals both act. Replicas
    # elect a leader on a Lease before kopf starts (leader.py, __main__.py); only it runs this.
    settings.peering.standalone = True
    # The operator posts its own Events for every transition; kopf adds only warnings and errors
    # (e.g. a handler that failed permanently on an invalid spec).
    settings.posting.level = logging.WARNING


def connection_info(
    configuration: kubernetes.client.Configuration, settings: kopf.OperatorSettings
) -> kopf.ConnectionInfo:
    """kopf's credentials from the client configuration the operator's own client uses, read as
    ``kopf.login_via_client`` reads it. That function itself cannot be used: it loads the
    configuration anew, in-cluster first and then the ``KUBECONFIG`` the process had when the
    kubernetes package was imported, whereas ``OperatorConfig.kubeconfig`` (``KUBECONFIG``, also
    set per operator by in-process tests) must win over the service account (docs/operator.md)."""
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=settings.networking.trust_env,
    )


def register_lifecycle(registry: kopf.OperatorRegistry, config: OperatorConfig, reconciler: Reconciler) -> None:
    ticker = Ticker(reconciler, config.reconcile_interval)
    started = {"at": 0.0}

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        configuration = load_configuration(config)
        if reconciler.kube is not None:
            reconciler.kube.close()
        reconciler.kube = Kube(configuration)
        return connection_info(configuration, settings)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings, config)
        if config.metrics_port:
            port = reconciler.metrics.serve(config.metrics_port)
            logger.info("operator metrics on :%d/metrics", port)
        ticker.start()
        started["at"] = time.time()
        scope = "all namespaces" if config.clusterwide else ", ".join(config.namespaces)
        logger.info("hacrl operator started: watching %s, reconcile every %ss", scope, config.reconcile_interval)

    @kopf.on.cleanup(registry=registry)
    def cleanup(**_: Any) -> None:
        ticker.stop()
        reconciler.metrics.stop()
        if reconciler.kube is not None:
            reconciler.kube.close()

    @kopf.on.probe(id="experiments", registry=registry)
    def probe(**_: Any) -> dict[str, Any]:
        return {
            "known": len(reconciler.known),
            "uptime_s": round(time.time() - started["at"], 1) if started["at"] else 0,
        }
