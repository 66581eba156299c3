"""End to end: delta weight publishes through `hacrl run --split` (docs/architecture.md, "Weight
publishes"), with the learner SIGKILLed mid-run: every version rebuilds and verifies, and every
step is sampled with the version its schedule names."""

from __future__ import annotations

from pathlib import Path

import pytest

from hacrl_core.store.weight_chain import fetch_policy, get_meta
from tests.integration.runs import tiny_spec, write_spec
from tests.integration.test_run_e2e import run_with_llama_learner_killed

pytestmark = pytest.mark.slow


def test_bf16_learners_publish_deltas_that_every_reader_rebuilds_after_a_killed_learner(
    tmp_path: Path, model_cache: Path
) -> None:
    store_uri = (tmp_path / "store").as_uri()
    document = tiny_spec("e2e-deltas", store_uri, steps=5, algorithm="naive", colocate=False)
    for agent in document["spec"]["agents"]:  # bf16 publishes at the paper's lr: few elements change per step
        agent["learner"].update(lr=1e-6, dtype="bfloat16", fullPublishEvery=3)
    # Killed mid-run, the learner's next publish has no local reference to take a delta from.
    store = run_with_llama_learner_killed(
        tmp_path, model_cache, write_spec(tmp_path, document), store_uri, "e2e-deltas", steps=5, timeout=900
    )
    for agent in ("llama", "qwen"):
        metas = [get_meta(store, agent, version) for version in range(6)]
        assert all(metas), (agent, metas)  # every version a chain's, none a plain directory
        metas_of = [meta for meta in metas if meta is not None]
        kinds = [meta.kind for meta in metas_of]
        assert kinds[0] == "full" and "delta" in kinds, (agent, kinds)
        assert all(len(meta.chain) <= 3 for meta in metas_of), (agent, [m.chain for m in metas_of])
        for version, meta in enumerate(metas_of):  # a new replica at each version: full + deltas, verified
            fetched = fetch_policy(store, agent, version, tmp_path / f"reader-{agent}-{version}")
            assert (fetched.version, fetched.full_read, fetched.deltas_applied) == (
                version,
                True,
                len(meta.chain) - 1,
            )
        for step in range(5):  # the rollout worker never fell back
            assert {row["policy_version"] for row in store.read_rollouts(step, agent)} == {step}, (agent, step)
        # the step metrics say what each publish cost: a delta's bytes are a share of a full publish's
        shares = {
            metas_of[step + 1].kind: store.read_metrics(step, agent)["learner/weights_publish_share"]
            for step in range(5)
        }
        # (over the tensors' bytes: a full publish also writes the config and tokenizer, a few % here)
        assert 0 < shares["delta"] < 0.2 and 1.0 <= shares.get("full", 1.0) < 1.2, (agent, shares)
