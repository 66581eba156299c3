"""`hacrl reward-server`: the built-in rewards behind the reward-server protocol (docs/rewards.md).

    hacrl reward-server --reward math --host 0.0.0.0 --port 8000

``POST /score`` takes ``{"items": [{"prompt", "response", "gold", "extra"}, ...]}`` and answers
``{"scores": [...]}``; ``GET /healthz`` answers ``ok``. With ``REWARD_SERVER_TOKEN`` set, a request
must carry ``Authorization: Bearer <token>`` (401 otherwise). A request it cannot read is answered,
never dropped: 411 without a Content-Length (or chunked), 413 over ``MAX_BODY_BYTES``, 400 for a
length or body that is malformed (items whose response or gold is not a string included), 500
when the reward itself fails. It is also the reference for a
server of your own: any scorer that speaks this protocol can stand behind ``data.reward``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hacrl_core.rewards.registry import get_reward, reward_names
from hacrl_core.rewards.remote import TOKEN_ENV

log = logging.getLogger("hacrl.reward_server")
MAX_BODY_BYTES = 64 * 1024 * 1024


class RequestRefused(ValueError):
    """A request that is not ``{"items": [{"response": str, "gold": str, ...}, ...]}``."""


def body_refusal(headers) -> tuple[int, dict] | None:
    """(status, answer) for a request whose body cannot be read as sent, None for one that can.
    A chunked body is refused (411) rather than read as empty JSON; a length that is not a
    non-negative integer (``-1`` made ``read`` wait for the client to close) is refused (400)."""
    if headers.get("Transfer-Encoding"):
        return 411, {"error": "send the body with a Content-Length, not chunked"}
    length = headers.get("Content-Length")
    if length is None:
        return 411, {"error": "a Content-Length is required"}
    if not re.fullmatch(r"[0-9]{1,20}", length.strip()):
        return 400, {"error": f"Content-Length {length[:40]!r} is not a non-negative integer"}
    if int(length) > MAX_BODY_BYTES:
        return 413, {"error": f"body over {MAX_BODY_BYTES} bytes: send smaller batches (data.rewardServer.batchSize)"}
    return None


def score_request(reward, body: bytes) -> list[float]:
    """The scores of one request's items; ``RequestRefused`` says what is wrong with it."""
    try:
        items = json.loads(body)["items"]
    except RecursionError:
        raise RequestRefused("the body is nested too deep") from None
    except (ValueError, KeyError, TypeError) as error:
        raise RequestRefused(f"{type(error).__name__}: {error}") from None
    if not isinstance(items, list):
        raise RequestRefused(f"items is {type(items).__name__}, not a list")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise RequestRefused(f"items[{index}] is {type(item).__name__}, not an object")
        for key in ("response", "gold"):
            if not isinstance(item.get(key), str):  # null would be scored as the text "None"
                raise RequestRefused(f"items[{index}].{key} is {type(item.get(key)).__name__}, not a string")
    return [float(reward(item["response"], item["gold"])) for item in items]


def make_handler(reward_name: str, token: str | None) -> type[BaseHTTPRequestHandler]:
    reward = get_reward(reward_name)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds per read: a client that stops sending mid-request frees its thread

        def _answer(self, status: int, body: dict | str) -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/healthz":
                self._answer(200, "ok")
            else:
                self._answer(404, {"error": f"no {self.path}: POST /score, GET /healthz"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/score":
                self._answer(404, {"error": f"no {self.path}: POST /score"})
                return
            if token is not None and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {token}"):
                self._answer(401, {"error": "missing or wrong bearer token"})
                return
            refusal = body_refusal(self.headers)
            if refusal is not None:
                self.close_connection = True  # what follows the headers is not a body we can skip
                self._answer(*refusal)
                return
            try:
                scores = score_request(reward, self.rfile.read(int(self.headers["Content-Length"])))
            except RequestRefused as error:
                self._answer(400, {"error": f'expected {{"items": [{{"response": str, "gold": str}}, ...]}}: {error}'})
                return
            except Exception as error:  # the reward itself failed: say so, and keep serving
                log.error("the reward failed on a request: %s: %s", type(error).__name__, error)
                self._answer(500, {"error": f"the reward failed: {type(error).__name__}: {error}"})
                return
            self._answer(200, {"scores": scores})

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
            log.debug(format, *args)

    return Handler


class RewardServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """One line for a request that broke off (a client gone or silent past the timeout): the
        default printed a traceback per request and went on serving anyway."""
        error = sys.exc_info()[1]
        log.warning("request from %s ended early: %s: %s", client_address[0], type(error).__name__, error)


def serve(reward_name: str, host: str, port: int) -> ThreadingHTTPServer:
    """The server, bound and ready (``serve_forever`` runs it); ``OSError`` when it cannot bind."""
    return RewardServer((host, port), make_handler(reward_name, os.environ.get(TOKEN_ENV) or None))


def cmd_reward_server(args: argparse.Namespace) -> int:
    try:
        server = serve(args.reward, args.host, args.port)
    except OSError as error:  # in use, not an address of this machine, not a host name at all
        print(
            f"hacrl reward-server: cannot listen on {args.host}:{args.port}: {error.strerror or error} "
            "(choose a free --port, 0 for any, and a --host of this machine: 127.0.0.1, or 0.0.0.0 for all)",
            file=sys.stderr,
        )
        return 1
    host, port = server.server_address[:2]
    host = host.decode() if isinstance(host, bytes) else host
    print(
        f"reward server: {args.reward} on http://{host}:{port}/score"
        + (" (bearer token required)" if os.environ.get(TOKEN_ENV) else ""),
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("reward server stopped", file=sys.stderr)
    return 0


def port_number(text: str) -> int:
    """``--port``: 0-65535 (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("reward-server", help="serve a built-in reward over HTTP (the reward-server protocol)")
    parser.add_argument("--reward", choices=reward_names(), default="math", help="the reward to serve (default: math)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=port_number, default=8000, help="port (0: any free one, printed)")
    parser.set_defaults(func=cmd_reward_server)
