"""Excerpts: the lines of a page that state what a sub-question asks, cut to a character budget.

The read solver (`mapreduce.read_solver`) shows a small model only what it needs of each page read:
the lines (long ones split into sentences) that hold the sub-question's words, each after the heading
and table header it belongs under, verbatim, so a quote copied from an excerpt is found on the page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amapreduce.decision.columns import ColumnSpec

__all__ = ["COLUMN_WEIGHT", "ENTITY_WEIGHT", "STOP_WORDS", "TABLE_SEPARATOR", "Unit", "excerpt", "page_units",
           "query_terms", "unit_scores"]


_WORD = re.compile(r"\w+")
STOP_WORDS = frozenset(
    "a an and are as at be by can did do does for from has have how in is it its of on or the their this to was "
    "were what when where which who whom whose why with find give list name tell please about into than that "
    "there these those they all any each other also been being".split()
)
ENTITY_WEIGHT = 2.0
COLUMN_WEIGHT = 3.0
"""A page is found by its entity, so within it the lines that state the asked columns matter most
(measured with SmolLM2-135M on the atlas: excerpts of the column lines gave about four cells in five
right, excerpts led by the entity's lines about half)."""
TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
LONG_LINE = 400
"""Lines longer than this are split into sentences, so one long paragraph is not all or nothing."""


def query_terms(question: str, columns: Sequence[ColumnSpec]) -> dict[str, float]:
    """The words of a sub-question that locate its passages, with their weights: capitalised words
    and numbers (the entity) `ENTITY_WEIGHT`, the columns' words `COLUMN_WEIGHT`, others 1."""
    column_words = {w.lower() for c in columns
                    for w in _WORD.findall(f"{c.name.replace('_', ' ')} {c.description or ''}")}
    terms: dict[str, float] = {w: COLUMN_WEIGHT for w in column_words if w not in STOP_WORDS and len(w) > 1}
    for word in _WORD.findall(question):
        low = word.lower()
        if low in STOP_WORDS or (len(low) < 2 and not low.isdigit()):
            continue
        named = (word[0].isupper() or any(ch.isdigit() for ch in word)) and low not in column_words
        terms[low] = max(terms.get(low, 0.0), ENTITY_WEIGHT if named else 1.0)
    return terms


@dataclass(frozen=True)
class Unit:
    """A piece of a page that an excerpt keeps or leaves: a line or a sentence, verbatim."""

    text: str
    context: tuple[int, ...] = ()
    """Positions of the heading and table header lines it is read under."""
    words: frozenset[str] = frozenset()


def page_units(text: str, *, long_line: int = LONG_LINE) -> list[Unit]:
    """`text` in units (lines; lines longer than `long_line` in sentences), each with its heading
    and table header."""
    units: list[Unit] = []
    heading: tuple[int, ...] = ()
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [line.rstrip() for line in block.split("\n") if line.strip()]
        table = len(lines) >= 2 and all(line.lstrip().startswith("|") for line in lines)
        header: tuple[int, ...] = ()
        if table:
            size = 2 if TABLE_SEPARATOR.match(lines[1]) else 1
            header = tuple(range(len(units), len(units) + size))
        for line in lines:
            if line.lstrip().startswith("#"):
                heading = (len(units),)
                units.append(Unit(line, (), frozenset(_WORD.findall(line.lower()))))
            elif table:
                context = heading if len(units) in header else (*heading, *header)
                units.append(Unit(line, context, frozenset(_WORD.findall(line.lower()))))
            else:
                pieces = _SENTENCE_END.split(line) if len(line) > long_line else [line]
                units += [Unit(p, heading, frozenset(_WORD.findall(p.lower()))) for p in pieces if p.strip()]
    return units


def unit_scores(units: Sequence[Unit], terms: Mapping[str, float]) -> list[float]:
    """Each unit's score: the weights of the terms it holds, each times its rarity on the page."""
    count = len(units) or 1
    rarity = {t: math.log((count + 1) / (sum(t in u.words for u in units) + 0.5)) for t in terms}
    return [sum(w * max(rarity[t], 0.1) for t, w in terms.items() if t in u.words) for u in units]


def _cut(text: str, budget: int) -> str:
    """The start of `text` up to `budget` characters, ended at a word boundary (verbatim)."""
    if len(text) <= budget:
        return text
    head = text[:budget]
    space = head.rfind(" ")
    return head[:space] if space > budget // 2 else head


def excerpt(text: str, terms: Mapping[str, float], budget: int) -> str:
    """The passages of `text` that best match `terms`, up to `budget` characters, in page order,
    each after the heading and table header it belongs under; `…` marks a gap. Every passage is
    verbatim from `text`, so a quote copied from it is found in the page. With no passage matching,
    the page's start."""
    units = page_units(text)
    if budget <= 0 or not units:
        return ""
    scores = unit_scores(units, terms)
    order = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
    if not order:
        return _cut(text.strip(), budget)
    kept: set[int] = set()
    used = 0
    for i in order:
        new = [j for j in (*units[i].context, i) if j not in kept]
        cost = sum(len(units[j].text) + 2 for j in new)
        if used + cost <= budget:
            kept.update(new)
            used += cost
        elif not kept:  # the best passage alone is larger than the budget: its start
            return _cut(units[i].text, budget)
    lines: list[str] = []
    previous = -1
    for i in sorted(kept):
        if previous >= 0 and i != previous + 1:
            lines.append("…")
        lines.append(units[i].text)
        previous = i
    return "\n".join(lines)
