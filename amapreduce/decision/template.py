"""Templates with `__0__ … __{K-1}__` placeholders, filled from one task-matrix row.

Filling is a single regex pass over the template: a cell value is never scanned again, so a
value that happens to contain `__1__` cannot inject text into another slot (the reference
replaced placeholders one after another and was open to exactly that).

A placeholder's index is ASCII digits only. Python's `\\d` also matches fullwidth (`０`) and
other scripts' digits, and `int()` reads them, so `__０__` used to fill like `__0__` while
looking like something else; `misspelt_placeholders` finds such look-alikes so the decision
validator can refuse them by name instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "MAX_PLACEHOLDER_DIGITS",
    "PARENT_PLACEHOLDER",
    "PLACEHOLDER",
    "misspelt_placeholders",
    "parent_placeholders",
    "placeholders",
    "render",
    "render_parent",
]

PLACEHOLDER = re.compile(r"__([0-9]+)__")
"""A placeholder: two underscores, a column index in ASCII digits, two underscores."""

PARENT_PLACEHOLDER = re.compile(r"__parent_([0-9]+)__")
"""A child decision's placeholder for cell k of its parent's task row (`__parent_0__`); it never
matches `PLACEHOLDER` (one underscore before the digits), so the two fillings cannot mix."""

_ANY_DIGITS = re.compile(r"__(\d+)__")
"""A placeholder-shaped run with any Unicode decimal digits (what `PLACEHOLDER` must not accept)."""

MAX_PLACEHOLDER_DIGITS = 6
"""Longest index `placeholders` reads as a number; a longer one (no matrix has a million columns)
is reported as the index 10**6, so a 5,000-digit placeholder never reaches `int()`'s digit limit."""


def placeholders(text: str) -> list[int]:
    """The placeholder indices used in `text`, sorted and without repeats."""
    return sorted({_index(m) for m in PLACEHOLDER.findall(text)})


def _index(digits: str) -> int:
    stripped = digits.lstrip("0") or "0"
    return int(stripped) if len(stripped) <= MAX_PLACEHOLDER_DIGITS else 10**MAX_PLACEHOLDER_DIGITS


def misspelt_placeholders(text: str) -> list[str]:
    """Placeholder-shaped runs in `text` whose digits are not ASCII (`__０__`, `__٣__`), in order."""
    return [m.group(0) for m in _ANY_DIGITS.finditer(text) if not m.group(1).isascii()]


def parent_placeholders(text: str) -> list[int]:
    """The `__parent_k__` indices used in `text`, sorted and without repeats."""
    return sorted({_index(m) for m in PARENT_PLACEHOLDER.findall(text)})


def render_parent(text: str, row: Sequence[str]) -> str:
    """Fill `__parent_k__` in `text` with the cells of the parent's task `row`, in one pass."""
    return _fill(PARENT_PLACEHOLDER, text, row)


def _fill(pattern: re.Pattern[str], text: str, row: Sequence[str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        index = _index(match.group(1))
        return row[index] if index < len(row) else match.group(0)

    return pattern.sub(substitute, text)


def render(template: str, row: Sequence[str]) -> str:
    """Fill `template` with the cells of `row` (`__i__` → `row[i]`) in one pass.

    Placeholders beyond the row stay as they are; the decision validator rejects such
    templates before any rendering happens.
    """
    return _fill(PLACEHOLDER, template, row)
