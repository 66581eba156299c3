"""Final-answer extraction and normalisation shared by the ``exact`` and ``numeric`` rewards.

Extraction rule (``extract_answer``), first that applies:

1. the content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; ``\\boxed 5``
   (no braces) takes the next whitespace-delimited token;
2. the text after the LAST ``####`` (GSM8K's final-answer marker), up to the end of that line;
3. the text after the LAST ``answer is`` (case-insensitive, optional ``:``), up to the end of that
   line;
4. the LAST number-like token (``-12``, ``1,000``, ``3.5``, ``2/3``, ``1e-3``);
5. otherwise the whole response.

``normalize_answer`` then makes formatting differences vanish: strips whitespace everywhere,
``$``/``\\(``/``\\)`` delimiters, ``\\left``/``\\right``, LaTeX spacing commands, ``\\text{..}``
wrappers (keeping their content), a trailing ``.``; maps ``\\dfrac``/``\\tfrac`` to ``\\frac`` and
the Unicode minus to ``-``; drops thousands separators (``1,000`` -> ``1000``); lowercases.

Everything here is linear-time regular expressions and scans; nothing evaluates text.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?", re.IGNORECASE)
_GSM8K_MARKER = re.compile(r"####")
# A number: digits with optional thousands groups, decimals, exponent; or a bare fraction a/b.
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d{1,3})?|[-+]?\.\d+"
_NUMBER_TOKEN = re.compile(rf"(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_FRAC = re.compile(r"(-?)\\[dt]?frac\s*\{\s*(" + _NUMBER + r")\s*\}\s*\{\s*(" + _NUMBER + r")\s*\}")
_SHORT_FRAC = re.compile(r"(-?)\\[dt]?frac\s*(\d)(\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|\\quad|\\qquad|\\left|\\right")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` in ``text``, or None.

    Braces are matched with a counter; an unclosed box yields everything after its ``{``.
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    if start >= len(text):
        return None
    if text[start] != "{":
        token = text[start:].split(maxsplit=1)
        return token[0].rstrip("$.") if token else None
    depth = 0
    for position in range(start, len(text)):
        char = text[position]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : position]
    return text[start + 1 :]


def extract_answer(text: str) -> str:
    """The final answer of a response by the rule in the module docstring (Unicode minus -> ``-``)."""
    text = text.replace("\u2212", "-")
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for marker in (_GSM8K_MARKER, _ANSWER_IS):
        matches = list(marker.finditer(text))
        if matches:
            line = text[matches[-1].end() :].strip().split("\n", 1)[0].strip()
            if line:
                return line
    numbers = list(_NUMBER_TOKEN.finditer(text))
    if numbers:
        return numbers[-1].group(0)
    return text


def normalize_answer(answer: str) -> str:
    """Canonical text form of an extracted answer (rules in the module docstring)."""
    text = answer.replace("\u2212", "-")
    text = _SPACING.sub("", text)
    text = _TEXT.sub(r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    text = "".join(text.split())
    text = text.strip("$")
    text = text.rstrip(".")
    text = _THOUSANDS.sub("", text)
    return text.lower()


def parse_number(text: str, *, strict: bool = False) -> Fraction | None:
    """Exact value of the last number in ``text`` (after ``normalize_answer``), or None.

    Understands integers, decimals, exponents (at most 3 digits, so ``1e99999999`` cannot make a
    huge integer), thousands commas, ``a/b`` and ``\\frac{a}{b}`` (also ``\\dfrac``,
    ``\\tfrac``, ``\\frac12``) and a leading sign. Surrounding words or units are ignored
    (``"12 apples"`` -> 12) unless ``strict``, where the whole normalised text must be one number
    (used to validate gold answers). ``x/0`` is not a number.
    """
    normalized = normalize_answer(text)
    if strict:
        whole = _FRAC.fullmatch(normalized) or _SHORT_FRAC.fullmatch(normalized) or _NUMBER_TOKEN.fullmatch(normalized)
        if whole is None:
            return None
    candidates: list[tuple[int, Fraction | None]] = []
    covered: list[tuple[int, int]] = []
    for pattern in (_FRAC, _SHORT_FRAC):
        for match in pattern.finditer(normalized):
            sign, numerator, denominator = match.groups()
            value = _fraction(numerator, denominator)
            if value is not None and sign:
                value = -value
            candidates.append((match.start(), value))
            covered.append(match.span())
    for match in _NUMBER_TOKEN.finditer(normalized):
        if any(start <= match.start() < end for start, end in covered):
            continue
        token = match.group(0)
        if "/" in token:
            numerator, denominator = token.split("/", 1)
            candidates.append((match.start(), _fraction(numerator, denominator)))
        else:
            candidates.append((match.start(), _fraction(token, "1")))
    if not candidates:
        return None
    return max(candidates, key=lambda item: item[0])[1]


def _fraction(numerator: str, denominator: str) -> Fraction | None:
    try:
        top = Fraction(numerator.replace(",", "").strip())
        bottom = Fraction(denominator.replace(",", "").strip())
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    if bottom == 0:
        return None
    return top / bottom
