"""`hacrl reward-server` against hostile requests and start-ups, and `hacrl run` against a reward
server that fails: each answered by a status or one line naming what to fix, never a traceback.

The requests are raw bytes on a socket to the real server (``serve``): a client library would
refuse to send most of them.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from hacrl_core.rewards.server import serve
from tests.hostile.harness import check, run_cli
from tests.rewards.servers import raw, send

FAMILY = "reward-server"
GOOD = json.dumps({"items": [{"prompt": "2+5", "response": "#### 7", "gold": "7", "extra": {}}]}).encode()


@pytest.fixture
def address(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    monkeypatch.delenv("REWARD_SERVER_TOKEN", raising=False)
    server = serve("exact", "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[:2]
    finally:
        server.shutdown()
        server.server_close()


def exchange(address: tuple[str, int], raw: bytes, *, half_close: bool = False) -> tuple[int, str]:
    """(status, body) of the server's answer to ``raw``; 0 when it sent none within 10 s."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            return 0, answer.decode(errors="replace")
    if not answer:
        return 0, ""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def post(body: bytes, *headers: str) -> bytes:
    return b"\r\n".join([b"POST /score HTTP/1.1", b"Host: x", *(h.encode() for h in headers), b"", body])


NESTED = b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
REQUESTS = [
    ("length-not-a-number", post(GOOD, "Content-Length: abc"), 400, "Content-Length 'abc'"),
    ("length-negative", post(GOOD, "Content-Length: -1"), 400, "Content-Length '-1'"),
    ("length-unicode-digit", post(GOOD, "Content-Length: \u00b2"), 400, "not a non-negative integer"),
    ("length-missing", post(GOOD), 411, "Content-Length is required"),
    ("length-over-limit", post(b"", f"Content-Length: {10**12}"), 413, "data.rewardServer.batchSize"),
    ("chunked", post(b"%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD), GOOD), "Transfer-Encoding: chunked"), 411, "not chunked"),
    ("nested-100000-deep", post(NESTED, f"Content-Length: {len(NESTED)}"), 400, "nested too deep"),
    (
        "null-response-and-gold",
        post(b'{"items": [{"response": null, "gold": null}]}', "Content-Length: 45"),
        400,
        "items[0].response is NoneType, not a string",
    ),
    (
        "gold-a-number",
        post(b'{"items": [{"response": "7", "gold": 7}]}', "Content-Length: 41"),
        400,
        "items[0].gold is int",
    ),
    ("items-not-a-list", post(b'{"items": {"a": 1}}', "Content-Length: 19"), 400, "items is dict, not a list"),
    ("item-not-an-object", post(b'{"items": [7]}', "Content-Length: 14"), 400, "items[0] is int, not an object"),
    ("not-json", post(b"\xff\xfe", "Content-Length: 2"), 400, "expected"),
]


@pytest.mark.parametrize("case, raw, status, names", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_a_malformed_request_is_answered_with_its_status_and_the_server_serves_on(case, raw, status, names, address):
    got, body = exchange(address, raw)
    assert (got, names in body) == (status, True), body[:300]
    assert exchange(address, post(GOOD, f"Content-Length: {len(GOOD)}")) == (200, '{"scores": [1.0]}')


def test_a_body_shorter_than_its_length_is_refused_once_the_client_stops_sending(address):
    got, body = exchange(address, post(GOOD[:10], f"Content-Length: {len(GOOD)}"), half_close=True)
    assert got == 400, body
    assert exchange(address, post(GOOD, f"Content-Length: {len(GOOD)}"))[0] == 200


def test_start_up_errors_are_one_line_naming_the_option():
    check(FAMILY, run_cli(["reward-server", "--port", "70000"]), 2, "--port", "70000 is not a port number (0-65535)")
    check(FAMILY, run_cli(["reward-server", "--port", "http"]), 2, "--port", "'http' is not a port number")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        check(
            FAMILY,
            run_cli(["reward-server", "--reward", "exact", "--port", str(port)]),
            1,
            f"cannot listen on 127.0.0.1:{port}",
            "Address already in use",
            "--port",
        )
    # 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of this machine
    check(
        FAMILY,
        run_cli(["reward-server", "--reward", "exact", "--host", "192.0.2.1", "--port", "0"]),
        1,
        "cannot listen on 192.0.2.1:0",
        "--host",
    )


FAILING = [
    (
        "http-500-for-good",
        500,
        b'{"error": "down"}',
        [
            "no answer after 1 tries (last: http_500)",
            "data.rewardServer.timeoutSeconds",
            "after 1 restarts, spec.restartLimit",
        ],
    ),
    ("nested-too-deep", 200, b"[" * 100_000, ['expected {"scores": [...]}']),
]


@pytest.mark.parametrize("case, status, body, names", FAILING, ids=[f[0] for f in FAILING])
def test_a_failing_reward_server_ends_hacrl_run_with_its_reward_server_error(
    case, status, body, names, tmp_path, model_cache, monkeypatch
):
    """Issue 43, 1: each of these ended in the worker's traceback and the last-resort line."""
    from tests.integration.runs import tiny_spec, write_spec

    with raw(lambda handler: send(handler, status, body)) as url:
        document = tiny_spec("reward-fails", (tmp_path / "store").as_uri(), steps=1, algorithm="grpo")
        document["spec"]["data"].update(reward=url, rewardServer={"retries": 0})
        document["spec"]["restartLimit"] = 1
        document["spec"]["agents"] = document["spec"]["agents"][:1]
        spec = write_spec(tmp_path, document)
        monkeypatch.setenv("HACRL_CACHE", str(model_cache))
        outcome = run_cli(["run", str(spec), "--quiet", "--workdir", str(tmp_path / "work")], cwd=tmp_path)
    check(FAMILY, outcome, 1, f"reward server {url}", "worker of llama stopped", *names)
