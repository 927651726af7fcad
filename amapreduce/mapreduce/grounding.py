"""Grounding: each value a small model wrote, tied by code to the line of the page that states it.

Why: measured with SmolLM2-135M on the sandbox atlas (`benchmarks/bench_real_model.py`), the model's
*values* were often right where its *quotes* were not: it copied the value itself, or the entity's
name, as the "quote", or a line of another column (the ISO code's line as the ISO3 code's quote, a
quote found on the page and holding the value: a wrong cell marked verified). And its values were
often a few letters off the page ("SKOPJEBULAN" for "Skopje"). So the read solver asks the model for
values, and code does what a quote is for:

1. The **column's lines**: the lines (long ones in sentences: `excerpts.page_units`) of the page
   read that name the column best: scored by the column's words (its name and description), each
   weighted by its rarity on the page, and kept when they score at least `COLUMN_LINE_SHARE` of
   the best. A line that holds only a word the column shares with others ("code" in "ISO code")
   is not the ISO3 code's line.
2. A value stated by one of those lines (`table.evidence.value_in_quote`) keeps it as its quote:
   the line, verbatim from the page, so the engine's check finds it.
3. A value stated by none is **snapped** to the closest span of a column line (word runs and table
   cells; `difflib`'s ratio at least `SNAP_RATIO`), quoted by that line; a value too far from
   every span keeps no quote, and the engine leaves it unverified.

So a cell is verified only when the page states its value on a line that names its column.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from amapreduce.mapreduce.excerpts import STOP_WORDS, Unit, page_units, query_terms, unit_scores
from amapreduce.mapreduce.excerpts import TABLE_SEPARATOR as _SEPARATOR
from amapreduce.table.evidence import normalize_quote, value_in_quote

if TYPE_CHECKING:
    from amapreduce.decision.columns import ColumnSpec

__all__ = ["COLUMN_LINE_SHARE", "MIN_COVERAGE", "SNAP_RATIO", "ColumnLine", "Grounded", "choices", "column_lines",
           "ground"]

COLUMN_LINE_SHARE = 0.6
"""A line is one of the column's when it scores at least this share of the best line's score..."""
MIN_COVERAGE = 0.5
"""... and at least this share of what a line holding every word of the column's name would score
(rarity weighted): on a page with no "ISO3 code" line, the "ISO code" line is not the ISO3 code's."""
MAX_CHOICES = 12
"""The most spans a cell's choice (`choices`) offers."""
SNAP_RATIO = 0.7
"""The least `difflib.SequenceMatcher` ratio (case folded) at which a value is snapped to a span."""
CODE_WORDS = frozenset({"code", "codes", "iso", "abbreviation", "symbol", "ticker", "acronym"})
"""A column whose name holds one of these asks for a code: of a value "Euro (EUR)", the "EUR"."""
_CELL_SPLIT = re.compile(r"\s*\|\s*")
_PIECE_SPLIT = re.compile(r"\s*[;()\[\]]\s*|\s*,\s+|:\s+|\s+[-–—]\s+")
_BRACKETED = re.compile(r"^(?P<name>[^()]+?)\s*\((?P<code>[^()]{1,12})\)$")
_NAME_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class ColumnLine:
    """A line of the page that names a column: its text, verbatim, and the cells where the column's
    value may stand (a table row under a header naming the column: that column's cell alone)."""

    text: str
    cells: tuple[str, ...]
    labelled: bool
    """A table row or a "Label: value" line: its cells are values by construction."""


@dataclass(frozen=True)
class Grounded:
    """A cell after grounding: its value, its quote ("" when no column line states it) and how."""

    value: str
    quote: str
    how: str
    """`stated` (a column line states the value), `snapped` (the value was moved to a span of a
    column line), `ungrounded` (no column line near it: no quote) or `empty`."""


def _cells(line: str) -> list[str]:
    return [c for c in (part.strip(" .*#>-") for part in _CELL_SPLIT.split(line.strip().strip("|"))) if c]


def column_lines(text: str, column: ColumnSpec) -> list[ColumnLine]:
    """The lines of `text` that name `column` best, best first (see the module doc). A table row
    is scored with its header's words, and under a header of three or more cells only the cell
    below the header cell that names the column is where its value stands."""
    units = page_units(text, long_line=0)
    terms = query_terms("", [column])
    named = query_terms("", [replace(column, description="")])
    header_of: dict[int, list[str]] = {}
    for i, unit in enumerate(units):
        heads = [units[j].text for j in unit.context if units[j].text.lstrip().startswith("|")
                 and not _SEPARATOR.match(units[j].text)]
        if heads and unit.text.lstrip().startswith("|"):
            header_of[i] = _cells(heads[0])
    scored = [replace(u, words=u.words | frozenset(w.lower() for h in header_of.get(i, []) for w in _NAME_WORD.findall(h)))
              for i, u in enumerate(units)]
    scores = unit_scores(scored, terms)
    coverage = unit_scores([*scored, Unit("", (), frozenset(named))], named)
    best = max(scores, default=0.0)
    if best <= 0 or not coverage[-1]:
        return []
    ranked = sorted((i for i, s in enumerate(scores) if s >= best * COLUMN_LINE_SHARE
                     and coverage[i] >= coverage[-1] * MIN_COVERAGE), key=lambda i: (-scores[i], i))
    found: list[ColumnLine] = []
    for i in ranked:
        line = units[i].text
        if line.lstrip().startswith("|"):
            cells = _cells(line)
            header = header_of.get(i, [])
            if len(header) >= 3 and len(header) == len(cells):
                weights = [sum(terms.get(w.lower(), 0.0) for w in _NAME_WORD.findall(h)) for h in header]
                if max(weights) > 0:
                    cells = [cells[weights.index(max(weights))]]
            found.append(ColumnLine(line, tuple(cells), labelled=True))
        elif ":" in line and len(line.partition(":")[0].split()) <= 6:
            found.append(ColumnLine(line, tuple(_cells(line.partition(":")[2])), labelled=True))
        else:
            found.append(ColumnLine(line, (line.strip(),), labelled=False))
    return found


def _pieces(cell: str) -> list[str]:
    """A cell and its pieces: split at brackets, commas, semicolons, colons and dashes."""
    return [p for p in dict.fromkeys([cell, *(q.strip(" .") for q in _PIECE_SPLIT.split(cell))]) if p]


def _values_of(text: str) -> set[str]:
    """Every value `text` states whole (normalised): its table cells and their pieces, its names
    and numbers."""
    found: set[str] = set()
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            found.update(normalize_quote(p) for cell in _cells(line) for p in _pieces(cell))
        found.update(normalize_quote(x.strip(" .,;:")) for x in _PROSE_SPAN.findall(line))
    return found


def _cuts_a_name(wanted: str, text: str) -> bool:
    """Whether the (normalised) value is a strict part of a name or number of `text` ("Vella" of
    "Andorra la Vella", "000" of "46,000,000")."""
    for span in _PROSE_SPAN.findall(text):
        key = normalize_quote(span.strip(" .,;:"))
        if key != wanted and _word_in(wanted, key):
            return True
    return False


def _word_in(value: str, text: str) -> bool:
    """`value` in `text` at word boundaries (both normalised)."""
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


def _trimmed(value: str) -> str:
    """`value` without the punctuation a sentence put after it ("Douglas." of "Its capital is
    Douglas."; "D.C." keeps its point)."""
    value = value.strip(" ,;:")
    return value[:-1] if value.endswith(".") and value.count(".") == 1 else value


def _names_column(value: str, column: ColumnSpec) -> bool:
    """Whether `value` is several words among which the column's name ("The capital of X is Y.")."""
    words = [w.lower() for w in _NAME_WORD.findall(value)]
    name = {w.lower() for w in _NAME_WORD.findall(column.name.replace("_", " "))} - STOP_WORDS
    return len(words) > 3 and bool(name & set(words))


def _asks_code(column: ColumnSpec) -> bool:
    return bool(CODE_WORDS & {w.lower() for w in _NAME_WORD.findall(column.name.replace("_", " "))})


def ground(value: str, text: str, column: ColumnSpec, *, entity: Sequence[str] = (),
           lines: Sequence[ColumnLine] | None = None) -> Grounded:
    """`value` (the model's, for `column`) grounded in the page `text` (`lines`: its column lines,
    when already known; `entity`: the names the sub-question is about, which a prose line does not
    ground as a value: a sentence about the entity names it whatever the column)."""
    value = _trimmed(" ".join(value.split()))
    if not value:
        return Grounded("", "", "empty")
    if _names_column(value, column):  # a sentence about the cell ("The capital of X is Y."), not its value
        return Grounded(value, "", "ungrounded")
    lines = column_lines(text, column) if lines is None else lines
    wanted = normalize_quote(value)
    own = {normalize_quote(e) for e in entity if e.strip()}
    for line in lines:
        for cell in line.cells:
            for piece in _pieces(cell):
                if normalize_quote(piece) == wanted and (line.labelled or wanted not in own):
                    return Grounded(_code_of(cell if _bracketed(cell) else piece, column), line.text, "stated")
        if not line.labelled and wanted not in own and _word_in(wanted, normalize_quote(line.text)) \
                and value_in_quote(value, line.text) and not _cuts_a_name(wanted, line.text):
            return Grounded(value, line.text, "stated")
    if wanted in own:  # the model named the entity: nothing near it is the cell's value
        return Grounded(value, "", "ungrounded")
    if wanted in _values_of(text):  # a value the page states on another line is another cell's
        return Grounded(value, "", "ungrounded")
    best: tuple[float, int, str, str, str] | None = None
    for rank, line in enumerate(lines):
        for cell in line.cells:
            for span in _pieces(cell) if line.labelled else [x.strip(" .,;:") for x in _PROSE_SPAN.findall(cell)]:
                key = normalize_quote(span)
                if key in own and not line.labelled:
                    continue
                ratio = difflib.SequenceMatcher(None, wanted, key, autojunk=False).ratio()
                if ratio >= SNAP_RATIO and (best is None or (ratio, -rank) > (best[0], best[1])):
                    best = (ratio, -rank, span, line.text, cell)
    if best is not None:
        span, cell = best[2], best[4]
        whole = cell if _bracketed(cell) and span in _pieces(cell) else span
        return Grounded(_code_of(whole, column), best[3], "snapped")
    return Grounded(value, "", "ungrounded")


def _bracketed(cell: str) -> bool:
    """Whether `cell` reads "Name (CODE)"."""
    return _BRACKETED.match(cell) is not None


def _code_of(value: str, column: ColumnSpec) -> str:
    """For a column that asks for a code, the code of a value "Name (CODE)"; else `value`."""
    match = _BRACKETED.match(value)
    return match.group("code").strip() if match and _asks_code(column) else value


_PROSE_SPAN = re.compile(r"[A-Z][\w'’./-]*(?: (?:of|la|le|de|del|da|do|and|the|el|al) [A-Z][\w'’./-]*| [A-Z][\w'’./-]*)*"
                         r"|[+-]?\d[\d,.]*\d|\d")
_CODE = re.compile(r"^[A-Z0-9]{2,8}$")


def choices(line: ColumnLine, column: ColumnSpec, entity: Sequence[str] = ()) -> list[str]:
    """The spans of `line` a cell of `column` may take (at most `MAX_CHOICES`): a labelled line's
    value cells and their pieces (not the label, the cell naming the column), a prose line's
    capitalised runs and numbers; never the entity's own name. For a column asking for a code, its
    codes alone where it holds any."""
    words = {w.lower() for w in _NAME_WORD.findall(f"{column.name.replace('_', ' ')}")}
    found: list[str] = []
    if line.labelled:
        for cell in line.cells:
            if words & {w.lower() for w in _NAME_WORD.findall(cell)} and len(line.cells) > 1:
                continue
            found += _pieces(cell)
    else:  # a prose line's names and numbers, not the words that open its sentences ("The", "Its")
        found += [x for x in _PROSE_SPAN.findall(line.text) if x.strip(" .,;:").lower() not in STOP_WORDS]
    own = {normalize_quote(e) for e in entity if e.strip()}
    found = [f for f in dict.fromkeys(x.strip(" .,;:") for x in found)
             if f and normalize_quote(f) not in own and normalize_quote(f) not in words]
    if _asks_code(column) and any(_CODE.match(f) for f in found):
        found = [f for f in found if _CODE.match(f)]
    return found[:MAX_CHOICES]
