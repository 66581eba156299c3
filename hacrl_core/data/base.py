"""The record every prompt source yields, and the interface sources implement.

A ``Problem`` is tokenizer-neutral: the question is plain text that each agent renders with its own
template and chat template (``hacrl_core.data.templates``), and ``uid`` is the same for every
agent, so trajectory rows of different agents for one prompt share the key (docs/architecture.md, "The trajectory store").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from hacrl_core.skipped_rows import SKIP_REASONS


@dataclass(frozen=True)
class Problem:
    """One prompt with its verifiable gold answer.

    ``uid`` is stable across processes and machines (no ``hash()``, no wall clock); ``question``
    is the raw question before any template; ``answer`` is the gold answer as text, checked by a
    reward function (``hacrl_core.rewards``); ``difficulty`` is 0 when the source does not grade;
    ``solution`` is a worked solution ending in the answer where the source has one (what a
    supervised warm start imitates), else empty.
    """

    uid: str
    question: str
    answer: str
    difficulty: int = 0
    solution: str = ""


class PromptSource(ABC):
    """A finite, indexable, deterministic list of problems.

    Readers load eagerly and drop malformed rows, counting each drop under a reason in
    ``skipped`` (for example ``{"missing_answer": 3}``); they never raise on a bad row. Batching,
    shuffling and resumption live in ``hacrl_core.data.datasets.iter_batches``, not here.
    """

    #: A short name for logs and metrics (a file name, or the ``builtin://`` URI).
    name: str

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}
        self.first_skipped: dict[str, int] = {}  # reason -> 0-based position of its first row

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, index: int) -> Problem: ...

    def __iter__(self) -> Iterator[Problem]:
        for index in range(len(self)):
            yield self[index]

    def _skip(self, reason: str, position: int | None = None) -> None:
        if reason not in SKIP_REASONS:  # every reason must reach users with an explanation
            raise ValueError(f"unknown skip reason {reason!r}; add it to SKIP_REASONS")
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if position is not None:
            self.first_skipped.setdefault(reason, position)
