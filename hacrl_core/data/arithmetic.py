"""Built-in verifiable task: multi-step integer arithmetic with graded difficulty.

A problem of difficulty ``d`` has ``d`` operations and ``d + 1`` single-digit operands (0-9), the
operators drawn from ``+``, ``-`` and ``*`` with the usual precedence (``*`` before ``+``/``-``,
left to right otherwise). The question is the expression followed by ``=`` (``"3+4*2="``) and the
gold answer is the exact integer (``"11"``, possibly negative).

Two answer formats (``format``): ``answer``, the bare integer (a response of 2-3 tokens), and
``chain``, a worked solution that reduces the expression one operation at a time, every
multiplication first, then left to right, and ends with the answer after GSM8K's ``####`` marker:
``3+4*2-5=`` -> ``4*2=8; 3+8=11; 11-5=6 #### 6`` (``worked_solution``). The gold answer is the
integer either way and rewards check only the final answer (``hacrl_core.rewards.extract``
takes the text after the last ``####``); the chain is the ``solution`` tiny models warm-start on,
so their responses are 15-40 tokens long at difficulty 2-4, long enough for the per-token mean
ratios HACPO clips to settle (docs/algorithm.md, "When does sharing help?").

Everything is a pure function of ``(seed, difficulty range, split, index)``: problem ``i`` is drawn
from ``random.Random`` seeded with a string of those values (string seeds are hashed with SHA-512
by ``random``, independent of ``PYTHONHASHSEED``), so every agent, process and machine sees the
same problem and ``uid`` for an index.

Splits are disjoint by construction: an expression belongs to the held-out ``eval`` split when the
first byte of the SHA-256 of its text is below ``EVAL_FRACTION * 256``, otherwise to ``train``;
each split redraws until it gets one of its own expressions. No training problem is ever an
evaluation problem, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random

from hacrl_core.data.base import Problem, PromptSource

OPERATORS = ("+", "-", "*")
#: Share of all expressions reserved for the held-out split (by hash of the expression text).
EVAL_FRACTION = 0.2
SPLITS = ("train", "eval")
FORMATS = ("answer", "chain")
#: GSM8K's final-answer marker, which ``chain`` solutions end with.
ANSWER_MARKER = "####"
#: Default number of problems of a split when used as a finite ``PromptSource``.
DEFAULT_SIZE = {"train": 10_000, "eval": 200}
MAX_DIFFICULTY = 8


def evaluate(operands: list[int], operators: list[str]) -> int:
    """Exact value of ``operands[0] op0 operands[1] op1 ...`` with ``*`` binding tighter.

    Computed from the generated parts, never by parsing or ``eval`` of text.
    """
    if len(operands) != len(operators) + 1:
        raise ValueError(f"need one more operand than operators, got {len(operands)} and {len(operators)}")
    terms: list[int] = [operands[0]]
    signs: list[int] = [1]
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= value
        elif op in ("+", "-"):
            terms.append(value)
            signs.append(1 if op == "+" else -1)
        else:
            raise ValueError(f"unknown operator {op!r}; valid: {', '.join(OPERATORS)}")
    return sum(sign * term for sign, term in zip(signs, terms, strict=True))


def worked_solution(operands: list[int], operators: list[str]) -> str:
    """``"4*2=8; 3+8=11; 11-5=6 #### 6"`` for ``3+4*2-5``: one operation per step, every ``*``
    first (left to right), then ``+``/``-`` left to right; the answer after ``ANSWER_MARKER``."""
    values, ops, steps = list(operands), list(operators), []
    while "*" in ops:
        i = ops.index("*")
        product = values[i] * values[i + 1]
        steps.append(f"{values[i]}*{values[i + 1]}={product}")
        values[i : i + 2] = [product]
        del ops[i]
    total = values[0]
    for op, value in zip(ops, values[1:], strict=True):
        result = total + value if op == "+" else total - value
        steps.append(f"{total}{op}{value}={result}")
        total = result
    if total != evaluate(operands, operators):  # the chain must end where the expression does
        raise AssertionError(f"worked solution of {operands} {operators} ends at {total}")
    return "; ".join(steps) + f" {ANSWER_MARKER} {total}"


def split_of(expression: str) -> str:
    """``"eval"`` or ``"train"``: the split an expression text belongs to (hash-based, stable)."""
    first_byte = hashlib.sha256(expression.encode("utf-8")).digest()[0]
    return "eval" if first_byte < int(EVAL_FRACTION * 256) else "train"


class ArithmeticTask(PromptSource):
    """Problems ``0 .. size-1`` of one split of the arithmetic family.

    Args:
        difficulty: inclusive range ``(lo, hi)`` of operation counts, or one int; each problem's
            difficulty is drawn uniformly from the range. ``1 <= lo <= hi <= MAX_DIFFICULTY``.
        seed: selects the problem sequence; the same seed gives the same problems everywhere.
        split: ``"train"`` or ``"eval"`` (held-out, disjoint from train by expression).
        size: number of problems when used as a finite source (``len``); ``problem(i)`` works for
            any ``i >= 0``. Defaults to ``DEFAULT_SIZE[split]``.
        format: ``"answer"`` (``solution`` is the bare answer) or ``"chain"`` (a worked solution
            ending in ``#### <answer>``). The problems themselves do not depend on it.
    """

    def __init__(
        self,
        difficulty: tuple[int, int] | int = (1, 3),
        seed: int = 0,
        split: str = "train",
        size: int | None = None,
        format: str = "answer",
    ) -> None:
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        lo, hi = (difficulty, difficulty) if isinstance(difficulty, int) else tuple(difficulty)
        if not 1 <= lo <= hi <= MAX_DIFFICULTY:
            raise ValueError(f"difficulty must satisfy 1 <= lo <= hi <= {MAX_DIFFICULTY}, got {difficulty!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        size = DEFAULT_SIZE[split] if size is None else size
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.difficulty = (int(lo), int(hi))
        self.seed = int(seed)
        self.split = split
        self.size = int(size)
        self.format = format
        self.name = f"builtin://arithmetic?difficulty={lo}-{hi}&seed={seed}&split={split}&size={size}" + (
            f"&format={format}" if format != "answer" else ""
        )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Problem:
        if not 0 <= index < self.size:
            raise IndexError(f"problem index {index} out of range 0..{self.size - 1}")
        return self.problem(index)

    def problem(self, index: int) -> Problem:
        """Problem ``index`` (any ``index >= 0``), a pure function of the task's parameters."""
        if index < 0:
            raise IndexError(f"problem index must be >= 0, got {index}")
        lo, hi = self.difficulty
        rng = random.Random(f"hacrl-arithmetic/{self.seed}/{lo}-{hi}/{self.split}/{index}")
        while True:
            d = rng.randint(lo, hi)
            operands = [rng.randint(0, 9) for _ in range(d + 1)]
            operators = [rng.choice(OPERATORS) for _ in range(d)]
            expression = "".join(f"{a}{op}" for a, op in zip(operands, operators, strict=False)) + str(operands[-1])
            if split_of(expression) == self.split:
                break
        answer = str(evaluate(operands, operators))
        return Problem(
            uid=f"arith-s{self.seed}-d{lo}-{hi}-{self.split}-{index}",
            question=f"{expression}=",
            answer=answer,
            difficulty=d,
            solution=worked_solution(operands, operators) if self.format == "chain" else answer,
        )
