"""What a standby replica serves while it waits for the Lease: ``/healthz`` and ``/metrics``.

kopf serves the liveness endpoint only once it runs, i.e. on the leader. Without these answers
the standby would fail its liveness probe and be restarted in a loop, fail its readiness probe
(a rolling update of the Deployment would then wait forever for a pod that can never become
leader while the old one holds the Lease), and its metrics target would be down. Both servers
close before kopf starts, which then binds the same ports.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator


def _handler(routes: dict[str, Callable[[], tuple[str, bytes]]]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                self.send_error(404)
                return
            content_type, body = route()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:  # probes every few seconds: no access log
            pass

    return Handler


@contextlib.contextmanager
def serve_standby(health_port: int, metrics_port: int, holder: Callable[[], str]) -> Iterator[None]:
    """Serve ``/healthz`` (200, the Lease's holder) and ``/metrics`` (``hacrl_operator_leader 0``)
    until the block ends; a port of 0 is not served."""
    health = {"/healthz": lambda: ("application/json", json.dumps({"leader": False, "holder": holder()}).encode())}
    metrics = {
        "/metrics": lambda: (
            "text/plain; version=0.0.4",
            b"# HELP hacrl_operator_leader 1 if this replica holds the "
            b"leader-election Lease.\n# TYPE hacrl_operator_leader gauge\nhacrl_operator_leader 0.0\n",
        )
    }
    servers = [
        http.server.ThreadingHTTPServer(("0.0.0.0", port), _handler(routes))
        for port, routes in ((health_port, health), (metrics_port, metrics))
        if port
    ]
    threads = [threading.Thread(target=server.serve_forever, name="standby-http", daemon=True) for server in servers]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
