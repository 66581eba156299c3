"""Prompt templates: placeholder substitution and per-tokenizer chat rendering."""

from __future__ import annotations

import pytest

from hacrl_core.data.templates import MATH_TEMPLATE, default_template, render_prompt, resolve_template, user_message
from hacrl_core.models.tokenizers import build_bpe_tokenizer, build_char_tokenizer


def test_math_template_keeps_boxed_braces_literal() -> None:
    assert user_message("What is 1+1?", "math") == (
        "What is 1+1? Let's think step by step and output the final answer within \\boxed{}."
    )
    assert resolve_template("Solve: {question}\nAnswer in \\boxed{}") == "Solve: {question}\nAnswer in \\boxed{}"
    assert user_message("2*3", "Solve {question} {x}") == "Solve 2*3 {x}"


def test_template_without_placeholder_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"contain '\{question\}'"):
        resolve_template("no placeholder")


def test_default_template_by_source() -> None:
    assert default_template("builtin://arithmetic?difficulty=1-3") == "{question}"
    assert default_template("/data/train.parquet") == MATH_TEMPLATE


def test_each_tokenizer_renders_its_own_chat_format() -> None:
    char = build_char_tokenizer()
    bpe = build_bpe_tokenizer(["1+2=3", "4*5=20"])
    assert render_prompt(char, "3+4=") == "<s>Q:3+4=\nA:"
    assert render_prompt(bpe, "3+4=") == "<|bos|><|user|>3+4=<|end|><|assistant|>"


def test_plain_text_without_a_chat_template() -> None:
    char = build_char_tokenizer()
    char.chat_template = None
    assert render_prompt(char, "3+4=", "Q: {question}?\nA:") == "Q: 3+4=?\nA:"
