"""One HTTP POST bounded in wall-clock time and in the size of its answer (the reward client's
transport, ``remote.py``).

A socket timeout bounds each read, not the request: a server that sends one byte a second never
trips it (a 2 s timeout took 39 s), and one that never stops sending holds the worker for good.
Here a timer shuts the request's sockets down at the deadline, which wakes any read blocked in
them, and the answer is read to at most ``limit + 1`` bytes. urllib still does the rest (proxies
from the environment, TLS, redirects).
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.error
import urllib.request


class Expired(TimeoutError):
    """The deadline passed before the whole answer arrived."""


class _Watch:
    """The connections of one request, shut down together once its deadline passes."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.expired = False
        self.lock = threading.Lock()

    def connection_class(self, http_class):
        """``http_class`` whose sockets are recorded as they connect: urllib drops the connection's
        reference once the headers are in, while the answer's body is still read from it."""
        watch = self

        class Watched(http_class):
            def connect(self) -> None:
                super().connect()
                with watch.lock:
                    watch.sockets.append(self.sock)
                    if watch.expired:  # connected just as the deadline passed
                        _shut(self.sock)

        return Watched

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        # socket.socket's own shutdown: an SSLSocket's would drop its TLS state under the thread
        # still reading from it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed: the request ended as the timer fired
        pass


def _handlers(watch: _Watch) -> list[urllib.request.BaseHandler]:
    class Http(urllib.request.HTTPHandler):
        def do_open(self, http_class, req, **kwargs):
            return super().do_open(watch.connection_class(http_class), req, **kwargs)

    class Https(urllib.request.HTTPSHandler):
        def do_open(self, http_class, req, **kwargs):
            return super().do_open(watch.connection_class(http_class), req, **kwargs)

    return [Http(), Https()]


def post(url: str, body: bytes, headers: dict[str, str], seconds: float, limit: int) -> tuple[int, bytes]:
    """``(status, answer)`` of ``POST url``, the whole exchange within ``seconds``; ``answer`` holds
    at most ``limit + 1`` bytes (more than ``limit``: the server sent too much). ``Expired`` when
    the deadline passed; ``OSError`` or ``http.client.HTTPException`` when the connection failed
    or broke off (a dropped connection, an incomplete or malformed answer)."""
    watch = _Watch()
    timer = threading.Timer(seconds, watch.expire)
    timer.daemon = True
    timer.start()
    try:
        status, answer = _exchange(
            watch, urllib.request.Request(url, data=body, headers=headers, method="POST"), seconds, limit
        )
    except (OSError, http.client.HTTPException):
        if watch.expired:
            raise Expired(f"no whole answer within {seconds:g} s") from None
        raise
    finally:
        timer.cancel()
    if watch.expired:  # an answer without a length ends at the shutdown as if complete: it may be cut
        raise Expired(f"no whole answer within {seconds:g} s")
    return status, answer


def _exchange(watch: _Watch, request: urllib.request.Request, seconds: float, limit: int) -> tuple[int, bytes]:
    try:
        with urllib.request.build_opener(*_handlers(watch)).open(request, timeout=seconds) as response:
            return response.status, _read(response, limit)
    except urllib.error.HTTPError as error:  # a status other than 2xx: its body says why
        with error:
            return error.code, _read(error, limit)


def _read(response, limit: int) -> bytes:
    """The body, up to ``limit + 1`` bytes. ``read(n)`` returns what came before the connection
    closed, even short of the length the headers promised: a cut answer raises ``IncompleteRead``
    here instead of passing for a whole one."""
    chunks, size = [], 0
    while size <= limit:
        chunk = response.read(min(1 << 16, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    promised = getattr(response, "length", None)  # bytes still owed under Content-Length
    if size <= limit and promised:
        raise http.client.IncompleteRead(data, promised)
    return data
