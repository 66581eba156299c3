"""``hf://`` prompt sources: parsing, conversion through RowSource, and the offline error."""

from __future__ import annotations

import pytest

from hacrl_core.data import open_source
from hacrl_core.data.hub import open_hub_source, parse_hub_uri

VERL_ROWS = [
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6*7?"}],
        "reward_model": {"ground_truth": "42"},
    },
    {"prompt": [{"role": "user", "content": "What is 1+1?"}], "reward_model": {"ground_truth": None}},
    {"prompt": [{"role": "user", "content": "What is 2+2?"}], "reward_model": {"ground_truth": 4}},
]


def test_parse_hub_uri() -> None:
    assert parse_hub_uri("hf://HuggingFaceH4/MATH-500?split=test") == {
        "name": "HuggingFaceH4/MATH-500",
        "split": "test",
        "config": None,
        "revision": None,
    }
    assert parse_hub_uri("hf://org/name?config=main&revision=abc")["split"] == "train"
    with pytest.raises(ValueError, match="expected hf://<org>/<name>"):
        parse_hub_uri("hf://just-a-name")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) splt; valid: split, config, revision"):
        parse_hub_uri("hf://org/name?splt=test")


def test_verl_layout_through_an_injected_loader() -> None:
    calls = []

    def load_dataset(name, config, *, split, revision):
        calls.append((name, config, split, revision))
        return VERL_ROWS

    source = open_hub_source(
        "hf://org/verl-math?split=test&revision=r1",
        prompt_key="prompt",
        answer_key="reward_model.ground_truth",
        load_dataset=load_dataset,
    )
    assert calls == [("org/verl-math", None, "test", "r1")]
    assert [(p.question, p.answer) for p in (source[i] for i in range(len(source)))] == [
        ("What is 6*7?", "42"),
        ("What is 2+2?", "4"),
    ]
    assert source.skipped == {"missing_answer": 1}


def test_offline_error_names_the_dataset() -> None:
    def offline(name, config, *, split, revision):
        raise ConnectionError("hub unreachable")

    with pytest.raises(
        ValueError,
        match=r"cannot load dataset 'org/missing' \(split 'train'\).*ConnectionError: hub unreachable.*to_parquet",
    ):
        open_hub_source("hf://org/missing", load_dataset=offline)


def test_open_source_dispatches_hf_uris() -> None:
    """Without a hub (or without the datasets package) open_source still fails with the name."""
    with pytest.raises(ValueError, match="org/no-such-dataset"):
        open_source("hf://org/no-such-dataset?split=test", prompt_key="problem", answer_key="answer")
