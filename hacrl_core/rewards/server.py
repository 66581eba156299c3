"""`hacrl reward-server`: the built-in rewards behind the reward-server protocol (docs/rewards.md).

    hacrl reward-server --reward math --host 0.0.0.0 --port 8000

``POST /score`` takes ``{"items": [{"prompt", "response", "gold", "extra"}, ...]}`` and answers
``{"scores": [...]}``; ``GET /healthz`` answers ``ok``. With ``REWARD_SERVER_TOKEN`` set, a request
must carry ``Authorization: Bearer <token>`` (401 otherwise). It is also the reference for a
server of your own: any scorer that speaks this protocol can stand behind ``data.reward``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hacrl_core.rewards.registry import get_reward, reward_names
from hacrl_core.rewards.remote import TOKEN_ENV

log = logging.getLogger("hacrl.reward_server")
MAX_BODY_BYTES = 64 * 1024 * 1024


def make_handler(reward_name: str, token: str | None) -> type[BaseHTTPRequestHandler]:
    reward = get_reward(reward_name)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413, {"error": f"body over {MAX_BODY_BYTES} bytes: send smaller batches (data.rewardServer.batchSize)"})
                return
            try:
                items = json.loads(self.rfile.read(length))["items"]
                scores = [float(reward(str(item["response"]), str(item["gold"]))) for item in items]
            except (ValueError, KeyError, TypeError) as error:
                self._answer(400, {"error": f"expected {{\"items\": [{{\"response\": ..., \"gold\": ...}}, ...]}}: {error}"})
                return
            self._answer(200, {"scores": scores})

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
            log.debug(format, *args)

    return Handler


def serve(reward_name: str, host: str, port: int) -> ThreadingHTTPServer:
    """The server, bound and ready (``serve_forever`` runs it)."""
    server = ThreadingHTTPServer((host, port), make_handler(reward_name, os.environ.get(TOKEN_ENV) or None))
    server.daemon_threads = True
    return server


def cmd_reward_server(args: argparse.Namespace) -> int:
    server = serve(args.reward, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"reward server: {args.reward} on http://{host}:{port}/score"
          + (" (bearer token required)" if os.environ.get(TOKEN_ENV) else ""), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("reward server stopped", file=sys.stderr)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("reward-server", help="serve a built-in reward over HTTP (the reward-server protocol)")
    parser.add_argument("--reward", choices=reward_names(), default="math", help="the reward to serve (default: math)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free one, printed)")
    parser.set_defaults(func=cmd_reward_server)
