"""Real HTTP servers on loopback for the reward client's and server's tests: ``running`` serves one
in a thread, ``raw`` answers each POST with whatever bytes a test writes (``send`` a status and a body)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def running(server: ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/score"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def raw(respond: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A server whose ``respond(handler)`` writes whatever bytes it likes once the request is read."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            try:
                respond(self)
            except OSError:  # the client hung up, as it should
                pass

        def log_message(self, *args) -> None:
            pass

    with running(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield url


def send(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
