"""Offline tokenizers: round trips, specials, chat templates, save/load, fingerprints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_core.models.tokenizers import build_bpe_tokenizer, load_tokenizer, tokenizer_fingerprint

TEXTS = ["3+4*2=11", "Let's think step by step.\n\\boxed{-12}", "  spaces\tand\ttabs  ", "x"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_both_tokenizers(char_tokenizer, bpe_tokenizer, text: str) -> None:
    for tokenizer in (char_tokenizer, bpe_tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert len(char_tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]) == len(TEXTS[0])


def test_bpe_is_lossless_on_any_unicode(bpe_tokenizer) -> None:
    text = "π ≈ 3.14159, naïve café, 数学 🙂"
    assert bpe_tokenizer.decode(bpe_tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_specials_are_set_and_distinct(char_tokenizer, bpe_tokenizer) -> None:
    for tokenizer in (char_tokenizer, bpe_tokenizer):
        ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
        assert None not in ids and len(ids) == 3
        assert (
            tokenizer("12", add_special_tokens=True)["input_ids"]
            == tokenizer("12", add_special_tokens=False)["input_ids"]
        )
    assert char_tokenizer.eos_token == "</s>" and bpe_tokenizer.eos_token == "<|eos|>"
    assert char_tokenizer.chat_template != bpe_tokenizer.chat_template


def test_save_and_reload_keeps_ids_chat_template_and_fingerprint(tmp_path: Path, char_tokenizer, bpe_tokenizer) -> None:
    for name, tokenizer in (("char", char_tokenizer), ("bpe", bpe_tokenizer)):
        tokenizer.save_pretrained(tmp_path / name)
        reloaded = load_tokenizer(tmp_path / name)
        for text in TEXTS:
            assert (
                reloaded(text, add_special_tokens=False)["input_ids"]
                == tokenizer(text, add_special_tokens=False)["input_ids"]
            )
        assert reloaded.chat_template == tokenizer.chat_template
        assert reloaded.eos_token_id == tokenizer.eos_token_id
        assert tokenizer_fingerprint(reloaded) == tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(char_tokenizer) != tokenizer_fingerprint(bpe_tokenizer)


def test_bpe_training_is_deterministic_across_processes(bpe_tokenizer) -> None:
    """Rollout and learner pods each build the same tiny model: their tokenizers must agree."""
    script = (
        "from hacrl_core.data.arithmetic import ArithmeticTask\n"
        "from hacrl_core.models.tokenizers import build_bpe_tokenizer, tokenizer_fingerprint\n"
        "t = build_bpe_tokenizer([p.question + p.answer for p in ArithmeticTask(size=500)])\n"
        "print(tokenizer_fingerprint(t))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert result.stdout.strip() == tokenizer_fingerprint(bpe_tokenizer)
    assert tokenizer_fingerprint(build_bpe_tokenizer([p for p in ["1+1=2"] * 3])) != tokenizer_fingerprint(
        bpe_tokenizer
    )
