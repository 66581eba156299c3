"""``s3_clients.SharedS3Clients``: one boto3 client per endpoint, region, credentials and limits,
refcounted; stores that share one count their own retries and add no hook per store."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from hacrl_core.store import S3ObjectStore, StoreUnavailable
from hacrl_core.store.s3_clients import SharedS3Clients
from tests.support.seaweed import SeaweedS3, closed_port


def test_one_client_per_endpoint_and_credentials_closed_with_its_last_user(
    seaweed_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in seaweed_server.env().items():
        monkeypatch.setenv(key, value)
    clients = SharedS3Clients()
    key = clients.key(endpoint=seaweed_server.endpoint)
    first, second = clients.acquire(key), clients.acquire(clients.key(endpoint=seaweed_server.endpoint))
    assert first is second and (len(clients), clients.users()) == (1, 2)
    other_endpoint = clients.key(endpoint=f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")
    other_credentials = clients.key(endpoint=seaweed_server.endpoint)
    assert other_credentials != key and clients.acquire(other_credentials) is not first
    assert clients.acquire(other_endpoint) is not first and len(clients) == 3
    S3ObjectStore(seaweed_server.bucket, "shared", first, shared_client=True).put("a", b"1")
    pools = first._endpoint.http_session._manager.pools
    assert len(pools) == 1
    clients.release(key)
    assert len(pools) == 1  # one user left: still open
    clients.release(key)
    assert len(pools) == 0 and len(clients) == 2  # the last user closed it
    with pytest.raises(KeyError, match="no shared S3 client"):
        clients.release(key)


def test_stores_sharing_a_client_count_their_own_retries_through_one_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    clients = SharedS3Clients()
    key = clients.key(endpoint=f"http://127.0.0.1:{closed_port()}", connect_timeout=1, read_timeout=1, attempts=3)
    client = clients.acquire(key)
    stores = [S3ObjectStore("bucket", f"p{i}", client, attempts=3, shared_client=True) for i in range(50)]
    with pytest.raises(StoreUnavailable, match="unreachable"):
        stores[7].exists("x")
    assert [store.retries for store in stores[6:9]] == [0, 2, 0]  # only the store that asked
    handlers = client.meta.events._emitter._handlers.prefix_search("request-created.s3.HeadObject")
    counted = [h for h in handlers if getattr(h, "__name__", "") in ("_count_retry", "_count_retry_of_caller")]
    assert len(counted) == 1, f"{len(counted)} retry hooks on a client 50 stores share"
    clients.release(key)


def test_clients_of_other_endpoints_share_one_parsed_service_model_dropped_with_the_last(
    seaweed_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore parses the S3 service model and endpoint rules (about 11 MiB of Python objects)
    for every session: each client of another endpoint or credentials cost 12 MiB until the open
    clients shared one data loader."""
    for key, value in seaweed_server.env().items():
        monkeypatch.setenv(key, value)
    clients = SharedS3Clients()
    first_key = clients.key(endpoint=seaweed_server.endpoint)
    first = clients.acquire(first_key)
    others = [clients.key(endpoint=f"http://127.0.0.1:{closed_port()}", region=f"region-{i}") for i in range(3)]
    gc.collect()
    tracemalloc.start()
    try:
        for key in others:
            clients.acquire(key)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] / 2**20
    finally:
        tracemalloc.stop()
    assert grown < 3 * 2, f"three more clients took {grown:.1f} MiB (12 each with a loader apiece)"
    S3ObjectStore(seaweed_server.bucket, "loader", first, shared_client=True).put("a", b"1")  # the first still works
    assert first.meta.service_model is not None
    for key in [first_key, *others]:
        clients.release(key)
    assert clients._loader is None  # no client open: the parsed model goes with the last one
