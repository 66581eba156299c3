"""Prompt templates, rendered per agent.

A template is text containing ``{question}``; the question is substituted with ``str.replace`` (not
``str.format``, so a literal ``\\boxed{}`` in a template stays as written). The result is the user
message; ``render_prompt`` then applies the agent tokenizer's own chat template
(``apply_chat_template(..., add_generation_prompt=True, tokenize=False)``) when it has one, and
uses the plain text otherwise. Each agent therefore sees the same question in its own format
(docs/architecture.md, "One step", step 1).

Named templates:

- ``math``: the paper's suffix, ``"{question} Let's think step by step and output the final answer
  within \\boxed{}."``;
- ``arithmetic``: ``"{question}"``: built-in questions already end in ``=`` (``"3+4*2="``) and the
  tiny models are warm-started to answer with the bare integer.
"""

from __future__ import annotations

from typing import Any

MATH_TEMPLATE = "{question} Let's think step by step and output the final answer within \\boxed{}."
ARITHMETIC_TEMPLATE = "{question}"
TEMPLATES = {"math": MATH_TEMPLATE, "arithmetic": ARITHMETIC_TEMPLATE}
PLACEHOLDER = "{question}"


def resolve_template(template: str) -> str:
    """A template's text: a name from ``TEMPLATES`` or a literal text containing ``{question}``."""
    if template in TEMPLATES:
        return TEMPLATES[template]
    if PLACEHOLDER not in template:
        raise ValueError(
            f"template must be one of {', '.join(sorted(TEMPLATES))} or contain {PLACEHOLDER!r}, got {template!r}"
        )
    return template


def default_template(source_uri: str) -> str:
    """``arithmetic`` for the built-in task, ``math`` for everything else."""
    return ARITHMETIC_TEMPLATE if source_uri.startswith("builtin://arithmetic") else MATH_TEMPLATE


def user_message(question: str, template: str = ARITHMETIC_TEMPLATE) -> str:
    """The user message: ``template`` with ``{question}`` replaced."""
    return resolve_template(template).replace(PLACEHOLDER, question)


def render_prompt(tokenizer: Any, question: str, template: str = ARITHMETIC_TEMPLATE) -> str:
    """Prompt text for ``tokenizer``'s model: chat-templated when it has a chat template.

    The text already holds any BOS the chat template writes; encode it with
    ``hacrl_core.models.encoding.encode_prompt`` (no special tokens added).
    """
    content = user_message(question, template)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
    return content
