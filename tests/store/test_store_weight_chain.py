"""Weight chains (hacrl_core/store/weight_chain.py) on both backends: full publishes every K
versions and deltas between, every version rebuilt bit-identical whatever the reader held, at most
one full publish read, and a corrupt or missing delta detected and fallen back from."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hacrl_core.store import ObjectStore, TrajectoryStore
from hacrl_core.store.layout import weights_prefix
from hacrl_core.store.weight_chain import DELTA, META, committed_versions, fetch_policy, get_meta, publish_policy
from hacrl_core.store.weight_deltas import state_sha256

AGENT = "a"


def states(versions: int, *, changed: float = 0.02, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Successive bf16 states: each changes about ``changed`` of the previous one's elements."""
    generator = torch.Generator().manual_seed(seed)
    state = {
        "model.embed.weight": torch.randn(64, 32, generator=generator).to(torch.bfloat16),
        "model.layers.0.mlp.weight": torch.randn(96, 32, generator=generator).to(torch.bfloat16),
        "model.norm.weight": torch.ones(32, dtype=torch.bfloat16),
    }
    out = [state]
    for _ in range(versions - 1):
        state = {name: t.clone() for name, t in state.items()}
        for t in state.values():
            flat = t.view(-1)
            where = torch.rand(flat.numel(), generator=generator) < changed
            flat[where] = (flat[where].float() + 0.5).to(torch.bfloat16)
        out.append(state)
    return out


def model_dir(path: Path, state: dict[str, torch.Tensor]) -> Path:
    """A model directory as save_policy writes one: two safetensors shards, config, tokenizer."""
    path.mkdir(parents=True)
    names = sorted(state)
    save_file(
        {n: state[n] for n in names[:1]}, str(path / "model-00001-of-00002.safetensors"), metadata={"format": "pt"}
    )
    save_file(
        {n: state[n] for n in names[1:]}, str(path / "model-00002-of-00002.safetensors"), metadata={"format": "pt"}
    )
    (path / "config.json").write_text('{"model_type": "tiny"}')
    (path / "tokenizer.json").write_text("{}")
    return path


def held_state(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def publish_all(ts: TrajectoryStore, tmp: Path, chain: list[dict], full_every: int) -> list:
    return [
        publish_policy(ts, AGENT, v, model_dir(tmp / f"out-{v}", s), tmp / "reference", full_every=full_every)
        for v, s in enumerate(chain)
    ]


@pytest.fixture
def ts(store: ObjectStore) -> TrajectoryStore:
    return TrajectoryStore(store, "chains")


def test_every_version_rebuilds_bit_identical_from_any_start(ts: TrajectoryStore, tmp_path: Path) -> None:
    chain = states(8)
    published = publish_all(ts, tmp_path, chain, full_every=3)
    assert [p.kind for p in published] == ["full", "delta", "delta", "full", "delta", "delta", "full", "delta"]
    full = published[0].bytes_written
    for p in published[1:]:
        assert 0.01 < p.changed_fraction < 0.04
        if p.kind == "delta":
            assert p.bytes_written < 0.2 * full
    follower = tmp_path / "follower"  # a replica that fetched every version in turn
    for version, expected in enumerate(chain):
        fresh = fetch_policy(ts, AGENT, version, tmp_path / f"fresh-{version}")  # a new replica: full + its deltas
        assert state_sha256(held_state(tmp_path / f"fresh-{version}")) == state_sha256(expected)
        assert fresh.full_read and fresh.deltas_applied == version % 3 and fresh.version == version
        assert (tmp_path / f"fresh-{version}" / "config.json").is_file() and not (
            tmp_path / f"fresh-{version}" / DELTA
        ).exists()
        step = fetch_policy(ts, AGENT, version, follower)
        assert state_sha256(held_state(follower)) == state_sha256(expected) == get_meta(ts, AGENT, version).state_sha256
        if version:  # steady state: the delta only, also at a full version (its delta beside it)
            assert not step.full_read and step.deltas_applied == 1 and step.bytes_read < 0.2 * full


def test_a_replica_that_missed_versions_applies_only_the_deltas_after_what_it_holds(
    ts: TrajectoryStore, tmp_path: Path
) -> None:
    chain = states(5)
    publish_all(ts, tmp_path, chain, full_every=10)
    fetch_policy(ts, AGENT, 1, tmp_path / "r")
    got = fetch_policy(ts, AGENT, 4, tmp_path / "r")
    assert (got.full_read, got.deltas_applied) == (False, 3)
    assert state_sha256(held_state(tmp_path / "r")) == state_sha256(chain[4])


def test_deltas_that_add_up_to_a_full_publish_start_a_new_chain(ts: TrajectoryStore, tmp_path: Path) -> None:
    published = publish_all(ts, tmp_path, states(6, changed=0.2), full_every=100)
    # 20% of bf16 elements changed: a bit-mask delta of 1/16 + 0.2 of the model, ~0.26: a fourth would pass 1
    assert [p.kind for p in published] == ["full", "delta", "delta", "delta", "full", "delta"]
    assert published[4].bytes_written > published[0].bytes_written  # the full publish carries its delta beside it


def test_full_publish_every_1_publishes_every_version_whole(ts: TrajectoryStore, tmp_path: Path) -> None:
    published = publish_all(ts, tmp_path, states(3), full_every=1)
    assert [p.kind for p in published] == ["full"] * 3
    assert not any(DELTA in key for key in ts.objects.list("chains/weights/"))


def corrupt(ts: TrajectoryStore, version: int, name: str = DELTA) -> None:
    """Flip bytes of a committed object in place, as a failing disk or a bad write would."""
    key = f"{weights_prefix(ts.experiment, AGENT, version)}/{name}"
    data = bytearray(ts.objects.get(key))
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    ts.objects.put(key, bytes(data))


def test_a_corrupt_delta_falls_back_to_the_newest_verified_version(
    ts: TrajectoryStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chain = states(7)
    publish_all(ts, tmp_path, chain, full_every=4)  # full 0, deltas 1-3, full 4, deltas 5-6
    corrupt(ts, 2)
    with caplog.at_level(logging.WARNING, logger="hacrl"):
        got = fetch_policy(ts, AGENT, 3, tmp_path / "new")  # a new replica: full 0, delta 1, delta 2 corrupt
    assert (got.version, got.requested, got.fell_back) == (1, 3, True)
    assert state_sha256(held_state(tmp_path / "new")) == state_sha256(chain[1])
    assert "delta of version 2 is unusable" in caplog.text and "does not match manifest" in caplog.text
    # the held version-1 state is kept and the next full publish ends the fallback
    got = fetch_policy(ts, AGENT, 5, tmp_path / "new")
    assert (got.version, got.fell_back) == (5, False)
    assert state_sha256(held_state(tmp_path / "new")) == state_sha256(chain[5])


def test_a_missing_delta_falls_back_to_the_full_publish(
    ts: TrajectoryStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chain = states(4)
    publish_all(ts, tmp_path, chain, full_every=10)
    ts.objects.delete(f"{weights_prefix(ts.experiment, AGENT, 1)}/{DELTA}")
    with caplog.at_level(logging.WARNING, logger="hacrl"):
        got = fetch_policy(ts, AGENT, 3, tmp_path / "new")
    assert (got.version, got.fell_back) == (0, True) and "delta of version 1 is unusable" in caplog.text
    assert state_sha256(held_state(tmp_path / "new")) == state_sha256(chain[0])


def test_a_delta_whose_result_misses_its_checksum_is_refused(
    ts: TrajectoryStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A delta that verifies against its manifest but rebuilds another state (a learner that published
    a wrong delta) is caught by the state checksum, not applied."""
    chain = states(3)
    publish_all(ts, tmp_path, chain, full_every=10)
    prefix = weights_prefix(ts.experiment, AGENT, 2)
    meta_dir = tmp_path / "v2"
    ts.fetch_weights(AGENT, 2, meta_dir)
    meta = json.loads((meta_dir / META).read_text())
    meta["state_sha256"] = "0" * 64
    (meta_dir / META).write_text(json.dumps(meta))
    ts.publish_weights(AGENT, 2, meta_dir)
    with caplog.at_level(logging.WARNING, logger="hacrl"):
        got = fetch_policy(ts, AGENT, 2, tmp_path / "new")
    assert got.version == 1 and "the rebuilt state has sha256" in caplog.text, prefix


def test_a_republished_parent_is_not_mixed_with_the_old_deltas(ts: TrajectoryStore, tmp_path: Path) -> None:
    """A learner killed after publishing 1 and 2 republishes 1 with other weights: the old delta 2
    names the old 1's checksum, so a reader stops at the new 1 rather than rebuild a state that never was."""
    chain = states(3)
    publish_all(ts, tmp_path, chain, full_every=10)
    other = states(2, seed=7)[1]
    publish_policy(ts, AGENT, 1, model_dir(tmp_path / "again-1", other), tmp_path / "reference", full_every=10)
    got = fetch_policy(ts, AGENT, 2, tmp_path / "new")
    assert got.version == 1 and state_sha256(held_state(tmp_path / "new")) == state_sha256(other)


def test_a_learner_without_its_reference_rebuilds_it_from_the_store(ts: TrajectoryStore, tmp_path: Path) -> None:
    """A restarted learner pod (no local files): the previous version is rebuilt from the chain and
    the next publish is still a delta; if it cannot be rebuilt, the publish is full."""
    chain = states(5)
    for version in range(3):
        publish_policy(
            ts,
            AGENT,
            version,
            model_dir(tmp_path / f"out-{version}", chain[version]),
            tmp_path / "reference",
            full_every=10,
        )
    shutil.rmtree(tmp_path / "reference")
    third = publish_policy(ts, AGENT, 3, model_dir(tmp_path / "out-3", chain[3]), tmp_path / "new-pod", full_every=10)
    assert third.kind == "delta"
    assert state_sha256(held_state(tmp_path / "new-pod")) == state_sha256(chain[3])
    shutil.rmtree(tmp_path / "new-pod")
    corrupt(ts, 3)
    fourth = publish_policy(ts, AGENT, 4, model_dir(tmp_path / "out-4", chain[4]), tmp_path / "new-pod", full_every=10)
    assert fourth.kind == "full"
    assert fetch_policy(ts, AGENT, 4, tmp_path / "reader").version == 4
    assert committed_versions(ts, AGENT) == [0, 1, 2, 3, 4]


def test_a_plain_directory_is_fetched_whole(ts: TrajectoryStore, tmp_path: Path) -> None:
    """A publish without META (a LoRA adapter, or weights of a store written before chains)."""
    plain = tmp_path / "adapter"
    plain.mkdir()
    (plain / "adapter_config.json").write_text("{}")
    save_file({"w": torch.ones(3)}, str(plain / "adapter_model.safetensors"))
    ts.publish_weights(AGENT, 0, plain)
    got = fetch_policy(ts, AGENT, 0, tmp_path / "got")
    assert got.plain and (tmp_path / "got" / "adapter_config.json").is_file()
    assert torch.equal(load_file(str(tmp_path / "got" / "adapter_model.safetensors"))["w"], torch.ones(3))
