"""Prompt data: the built-in arithmetic task, jsonl/parquet readers, batching and templates."""

from hacrl_core.data.arithmetic import ArithmeticTask
from hacrl_core.data.base import Problem, PromptSource
from hacrl_core.data.datasets import Batch, RowSource, iter_batches, open_source
from hacrl_core.data.templates import (
    ARITHMETIC_TEMPLATE,
    MATH_TEMPLATE,
    TEMPLATES,
    default_template,
    render_prompt,
    resolve_template,
    user_message,
)

__all__ = [
    "ARITHMETIC_TEMPLATE",
    "ArithmeticTask",
    "Batch",
    "MATH_TEMPLATE",
    "Problem",
    "PromptSource",
    "RowSource",
    "TEMPLATES",
    "default_template",
    "iter_batches",
    "open_source",
    "render_prompt",
    "resolve_template",
    "user_message",
]
