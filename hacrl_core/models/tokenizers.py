"""Tokenizers built offline with the ``tokenizers`` library, wrapped for ``transformers``.

Two kinds, deliberately different so that cross-encoding between agents is exercised:

- ``build_char_tokenizer()``: one token per character (printable ASCII, tab and newline), unknown
  characters map to ``<unk>``; specials ``<pad> <s> </s> <unk>``; chat template
  ``<s>Q:{user}\\nA:{assistant}</s>\\n``.
- ``build_bpe_tokenizer(corpus, vocab_size)``: byte-level BPE trained on ``corpus`` (lossless for
  any text); specials ``<|pad|> <|bos|> <|eos|>`` plus role markers; chat template
  ``<|bos|><|user|>{user}<|end|><|assistant|>{assistant}<|end|>``.

Neither adds special tokens on encode (no post-processor): the chat template writes the BOS,
and EOS is appended explicitly where a sequence ends (``hacrl_core.models.encoding``).

Reload saved tokenizers with ``load_tokenizer`` (``PreTrainedTokenizerFast.from_pretrained``):
``AutoTokenizer`` may pick a different tokenizer class from the model config under
transformers 5.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CHAR_SPECIALS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
CHAR_ALPHABET = [chr(code) for code in range(32, 127)] + ["\t", "\n"]
CHAR_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}Q:{{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}A:{{ message['content'] }}{{ eos_token }}\n"
    "{% else %}{{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)

BPE_SPECIALS = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>"}
BPE_ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
BPE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: Always part of the BPE training text, so common words of math prompts get tokens.
BPE_BASE_CORPUS = [
    "Let's think step by step and output the final answer within \\boxed{}.",
    "The answer is \\boxed{42}. So the final answer is 7.",
    "What is 12 + 30? First compute the product, then the sum: 3 * 4 = 12, 12 + 30 = 42.",
]


def _wrap(tokenizer: Tokenizer, specials: dict[str, str], chat_template: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        **specials,
    )


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer (specials first: ids 0-3 are pad, bos, eos, unk)."""
    specials = list(CHAR_SPECIALS.values())
    vocab = {token: index for index, token in enumerate(specials + CHAR_ALPHABET)}
    # BPE with no merges splits text into single characters; Fuse joins them back without spaces.
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=CHAR_SPECIALS["unk_token"]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(specials)
    return _wrap(tokenizer, CHAR_SPECIALS, CHAR_CHAT_TEMPLATE)


def build_bpe_tokenizer(corpus: Iterable[str], vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``corpus`` plus ``BPE_BASE_CORPUS`` (deterministic for a corpus)."""
    specials = list(BPE_SPECIALS.values()) + BPE_ROLE_TOKENS
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(BPE_BASE_CORPUS) + list(corpus), trainer=trainer)
    return _wrap(tokenizer, BPE_SPECIALS, BPE_CHAT_TEMPLATE)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Reload a saved tokenizer as ``PreTrainedTokenizerFast`` (not ``AutoTokenizer``; see module doc)."""
    return PreTrainedTokenizerFast.from_pretrained(str(path))


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Short stable id of a tokenizer: SHA-256 of its serialised model and its chat template.

    Two tokenizers with the same fingerprint encode every text to the same ids, so rows can be
    reused without re-encoding; it is the ``tokenizer id`` of trajectory rows (docs/architecture.md, "The trajectory store").
    """
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8"))
    digest.update(b"\0" + (getattr(tokenizer, "chat_template", None) or "").encode("utf-8"))
    return digest.hexdigest()[:16]
