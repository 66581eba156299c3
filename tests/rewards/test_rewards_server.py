"""The reward-server protocol, client against real HTTP servers on loopback: `hacrl reward-server`
(the reference) and small servers that misbehave in one way each."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hacrl_core.rewards.remote import MAX_ANSWER_BYTES, RemoteReward, RewardServerError, take_retries
from hacrl_core.rewards.scoring import RewardItem
from hacrl_core.rewards.server import serve
from hacrl_core.spec import DataSpec
from tests.rewards.servers import raw, running, send


def items(n: int, right: int = 0) -> list[RewardItem]:
    """``n`` items whose first ``right`` responses answer 7 (the gold), the rest 8."""
    return [
        RewardItem(
            "2+5=?", f"#### {7 if i < right else 8}", "7", {"question": "2+5"}, f"prompt p{i // 4} sample {i % 4}"
        )
        for i in range(n)
    ]


@contextmanager
def misbehaving(answer: Callable[[int, list], tuple[int, object]]) -> Iterator[str]:
    """A server answering ``answer(request number, items) -> (status, body)``."""
    calls = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            batch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
            calls[0] += 1
            status, body = answer(calls[0], batch)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    with running(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield url


@pytest.fixture(autouse=True)
def no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWARD_SERVER_TOKEN", raising=False)
    take_retries()


def test_the_reference_server_scores_batches_in_order_with_concurrency() -> None:
    with running(serve("exact", "127.0.0.1", 0)) as url:
        scores = RemoteReward(url, batch_size=3, concurrency=2).score(items(10, right=4))
    assert scores == [1.0] * 4 + [0.0] * 6


def test_a_bearer_token_is_required_when_the_server_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_SERVER_TOKEN", "s3cret")
    server = serve("exact", "127.0.0.1", 0)
    with running(server) as url:
        assert RemoteReward(url).score(items(2, right=1)) == [1.0, 0.0]
        monkeypatch.setenv("REWARD_SERVER_TOKEN", "wrong")
        with pytest.raises(RewardServerError, match="refused the batch: HTTP 401"):
            RemoteReward(url, retries=3, backoff_seconds=0).score(items(1))
    assert take_retries() == {}, "a refusal is not retried"


def test_unavailable_then_back_is_retried_and_counted() -> None:
    with misbehaving(
        lambda n, batch: (503, {"error": "busy"}) if n <= 2 else (200, {"scores": [0.5] * len(batch)})
    ) as url:
        assert RemoteReward(url, retries=3, backoff_seconds=0.01).score(items(3)) == [0.5] * 3
    assert take_retries() == {"rollout/reward_retries/http_503": 2}


def test_a_server_that_stays_down_stops_the_worker_with_the_reason() -> None:
    server = serve("exact", "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    server.server_close()  # nothing listens there any more
    with pytest.raises(RewardServerError, match=r"no answer after 3 tries \(last: connection\)"):
        RemoteReward(url, retries=2, backoff_seconds=0.01).score(items(2))
    assert take_retries() == {"rollout/reward_retries/connection": 2}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"scores": [0.5, float("nan")]},
            r"scored prompt p0 sample 1 nan: a score must be a finite number in \[0, 1\]",
        ),
        ({"scores": [0.5, 1.5]}, r"scored prompt p0 sample 1 1.5"),
        ({"scores": [0.5, True]}, r"scored prompt p0 sample 1 True"),
        ({"scores": [0.5, "1"]}, r"scored prompt p0 sample 1 '1'"),
        ({"scores": [0.5]}, r"answered 1 scores for 2 items"),
        ({"rewards": [0.5, 0.5]}, r"expected \{\"scores\": \[...\]\}"),
    ],
)
def test_an_answer_that_is_not_a_score_per_item_is_refused_naming_the_item(body: dict, expected: str) -> None:
    with misbehaving(lambda n, batch: (200, body)) as url, pytest.raises(RewardServerError, match=expected):
        RemoteReward(url, retries=0).score(items(2))


def test_the_spec_takes_a_reward_name_or_a_server_url() -> None:
    data = DataSpec.model_validate(
        {"train": {"source": "x"}, "reward": "https://rewards.example/score", "rewardServer": {"retries": 2}}
    )
    assert data.reward_server.retries == 2 and data.reward_server.batch_size == 256
    for bad in ("nosuch", "ftp://x/score", "http://", "https://a b"):
        with pytest.raises(ValueError, match="neither a reward"):
            DataSpec.model_validate({"train": {"source": "x"}, "reward": bad})


def test_the_kubernetes_example_runs_the_command_the_experiment_names() -> None:
    """examples/reward-server: the Deployment's command is a valid `hacrl reward-server`, its
    Service forwards the port the experiment's data.reward calls, and both read the same token."""
    from pathlib import Path

    import yaml

    from hacrl_core.cli import build_parser
    from hacrl_core.spec import load_experiment

    folder = Path(__file__).resolve().parents[2] / "examples" / "reward-server"
    deployment, service = yaml.safe_load_all((folder / "server.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert (args.command, args.host) == ("reward-server", "0.0.0.0")
    assert container["ports"][0]["containerPort"] == args.port == service["spec"]["ports"][0]["port"]
    experiment = load_experiment(folder / "experiment.yaml")
    assert (
        experiment.spec.data.reward
        == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/score"
    )
    server_token = next(e for e in container["env"] if e["name"] == "REWARD_SERVER_TOKEN")["valueFrom"]
    client_token = next(e for e in experiment.spec.env if e.name == "REWARD_SERVER_TOKEN").value_from
    assert client_token.secret_key_ref.name == server_token["secretKeyRef"]["name"]


def head(handler: BaseHTTPRequestHandler, length: int | None) -> None:
    handler.send_response(200)
    if length is not None:
        handler.send_header("Content-Length", str(length))
    handler.end_headers()
    handler.wfile.flush()


def trickle(handler: BaseHTTPRequestHandler) -> None:
    """A valid answer, one byte every 0.3 s: each read succeeds, the whole takes 6 s."""
    body = b'{"scores": [0.5, 0.5]}'
    head(handler, len(body))
    for byte in body:
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()
        time.sleep(0.3)


def endless(handler: BaseHTTPRequestHandler, pause: float = 0.01) -> None:
    """An answer that never ends (no length, closed by nobody): 1 KiB every ``pause`` seconds."""
    head(handler, None)
    handler.close_connection = True
    while True:
        handler.wfile.write(b" " * 1024)
        handler.wfile.flush()
        time.sleep(pause)


def dropped(handler: BaseHTTPRequestHandler) -> None:
    """Half the promised body, then the connection closes (``IncompleteRead`` in the client)."""
    head(handler, 40)
    handler.wfile.write(b'{"scores": [0.5,')
    handler.close_connection = True


def garbage(handler: BaseHTTPRequestHandler) -> None:
    """Not HTTP at all."""
    handler.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    handler.close_connection = True


@pytest.mark.parametrize(
    ("respond", "last"), [(trickle, "timeout"), (endless, "timeout"), (dropped, "connection"), (garbage, "connection")]
)
def test_timeout_seconds_bounds_the_whole_request_and_a_broken_answer_is_retried(respond, last: str) -> None:
    with raw(respond) as url:
        began = time.monotonic()
        with pytest.raises(
            RewardServerError, match=rf"no answer after 2 tries \(last: {last}\).*data.rewardServer.timeoutSeconds"
        ):
            RemoteReward(url, timeout_seconds=1.0, retries=1, backoff_seconds=0.01).score(items(2))
        took = time.monotonic() - began
    assert took < 4.0, f"two tries of a 1 s deadline took {took:.1f} s"
    assert take_retries() == {f"rollout/reward_retries/{last}": 1}


def test_an_answer_that_floods_is_refused_at_the_limit() -> None:
    with (
        raw(lambda handler: endless(handler, pause=0)) as url,
        pytest.raises(RewardServerError, match=f"answered over {MAX_ANSWER_BYTES} bytes for 2 items"),
    ):
        RemoteReward(url, timeout_seconds=60, retries=0).score(items(2))


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": "bad items"}, r"refused the batch: HTTP 400 \{\"error\": \"bad items\"\}"),
        (404, {"error": "no /score"}, "refused the batch: HTTP 404"),
        (200, {"scores": "[" * 100_000}, r"answered .*expected \{\"scores\": \[...\]\}"),
    ],
)
def test_a_refusal_or_an_answer_nested_too_deep_is_a_reward_server_error(
    status: int, body: dict, expected: str
) -> None:
    nested = json.dumps(body).replace('"' + "[" * 100_000 + '"', "[" * 100_000)  # JSON nested 100,000 deep
    with (
        raw(lambda handler: send(handler, status, nested.encode())) as url,
        pytest.raises(RewardServerError, match=expected),
    ):
        RemoteReward(url, retries=2, backoff_seconds=0).score(items(2))
    assert take_retries() == {}, "a refusal is not retried"
