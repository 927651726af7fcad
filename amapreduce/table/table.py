"""The reduced table: rows keyed by the key columns, each cell with a status, a source and evidence.

This is the reducer of Agentic MapReduce, done in code (the reference let the manager LLM
re-type the table). Rows are merged by normalised key: a later answer to the same sub-question
(a retry, a patch round, a follow-up decision) fills cells the earlier one lacked; a different
non-empty value for a filled cell keeps the first value and records the conflict, so nothing is
silently overwritten or lost. Where two sub-questions of one decision yield the same key, the
first row (matrix order) is kept as it is (`merge_row(..., fill=False)`, the engine's reduce):
the official scorer keeps the first row of a duplicate key, so a table built from a gold table
scores what the gold scores.

A value is stored as written (`amapreduce._text.one_line`: only tabs and line breaks become a
space), except in a typed column (`normalizers`, from the decision's column types,
`decision.column_types`): there it is stored in the type's canonical form, so `1,234` and `1234` in
an integer column are one value (agreeing replies, one key), and a value the type cannot read stays
as written. What counts as no answer: an empty or invisible value (the sub-agent's explicit "not
found": a JSON null or `""`, what the prompt tells it to write). A value that merely reads like
a marker (`Unknown`, `N/A`, ...: `DEFAULT_MISSING_MARKERS`) is held with the status `marker`:
the engine asks for it again like a missing cell (`Row.to_ask`), a real value replaces it, and
if the re-asks keep returning it, it stays the cell's value and the run is not incomplete for it. A cell also keeps the quote its
sub-agent gave and that quote's `Evidence` (`table.evidence`); in a table made with
`strict_evidence`, an `unverified` cell counts as missing, so a better-supported value replaces it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from amapreduce._text import one_line
from amapreduce.table.evidence import Evidence
from amapreduce.table.keys import is_blank, normalize_key, normalize_value

__all__ = ["DEFAULT_MISSING_MARKERS", "EVIDENCE_CONFIDENCE", "MATRIX_SOURCE", "Cell", "CellStatus", "Row", "Table",
           "cell_confidence"]

DEFAULT_MISSING_MARKERS = frozenset({"", "n/a", "unknown", "not found", "not available", "null", "?"})
"""Values that read like "nothing found". A cell holding one has the status `marker`: it is asked
again like a missing cell, and kept as the answer when the re-asks return it again (the true
value of a cell can be `Unknown` or `N/A`). A key cell holding one cannot place its row."""
MATRIX_SOURCE = "task_matrix"
"""The source of a cell the task matrix fixed (not a sub-agent's answer)."""


class CellStatus(StrEnum):
    """What we know about a cell."""

    FOUND = "found"
    MISSING = "missing"
    CONFLICT = "conflict"
    MARKER = "marker"
    """The value reads like a marker (`Unknown`, `N/A`): asked again, and kept if it comes back."""


@dataclass(kw_only=True)
class Cell:
    """One table cell."""

    value: str = ""
    status: CellStatus = CellStatus.MISSING
    source: str | None = None
    """Where the value came from: a URL, `task_matrix`, or None."""
    alternatives: list[str] = field(default_factory=list)
    """Other values seen for this cell (conflicts), in arrival order."""
    quote: str | None = None
    """The short verbatim text of `source` the sub-agent quoted for the value, if any."""
    evidence: Evidence = Evidence.NO_EVIDENCE
    """Whether the quote was found in what the tools fetched and holds the value."""
    agreements: int = 0
    """How many later replies (a retry, a patch round, another sub-question) gave the same value."""

    @property
    def confidence(self) -> float:
        """How sure the table is of the value, in [0, 1] (`cell_confidence`)."""
        return cell_confidence(self)

    def to_json(self) -> dict[str, Any]:
        """`value`, `status`, `source`, `quote`, `evidence`, `confidence` (and `alternatives` and
        `agreements` when any)."""
        return ({"value": self.value, "status": str(self.status), "source": self.source, "quote": self.quote,
                 "evidence": str(self.evidence), "confidence": self.confidence}
                | ({"alternatives": self.alternatives} if self.alternatives else {})
                | ({"agreements": self.agreements} if self.agreements else {}))


EVIDENCE_CONFIDENCE = {Evidence.VERIFIED: 0.9, Evidence.NO_EVIDENCE: 0.6, Evidence.UNVERIFIED: 0.3}
"""A sub-agent's value before anything else is known of it, by what the check of its quote found."""


def cell_confidence(cell: Cell) -> float:
    """A cell's confidence in [0, 1], by one documented rule (docs/guides/ask.md, "Confidence"):

    * no value: 0; a value the task matrix fixed (not searched): 1;
    * else by its quote's evidence: `verified` 0.9, no quote 0.6, `unverified` 0.3 (the quote is not
      in what the tools fetched, or does not hold the value);
    * other values seen for the cell (`conflict`): halved; a marker-looking value (`Unknown`): at most 0.5;
    * each later reply that gave the same value (up to two) closes half the remaining gap to 1.

    Rounded to two decimals, so equal evidence gives equal confidence on every run.
    """
    if cell.status is CellStatus.MISSING or not cell.value:
        return 0.0
    if cell.source == MATRIX_SOURCE:
        return 1.0
    score = EVIDENCE_CONFIDENCE[cell.evidence]
    if cell.status is CellStatus.CONFLICT or cell.alternatives:
        score /= 2
    if cell.status is CellStatus.MARKER:
        score = min(score, 0.5)
    for _ in range(min(cell.agreements, 2)):
        score += (1 - score) / 2
    return round(score, 2)


@dataclass(kw_only=True)
class Row:
    """One table row: its cells by column, and the atomic task that produced it."""

    cells: dict[str, Cell]
    task_index: int
    """Task-matrix row that produced this row (rows sort by it: matrix order)."""
    strict_evidence: bool = False
    """`unverified` cells count as missing (`--verify strict`)."""
    origin: str | None = None
    """Provenance of a row a nested decision found: the path of child runs that produced it, e.g.
    `top10[2019]` or `top10[2019]/fill[Paris]` (child, then the parent task's cells); None for a
    row of the decision's own sub-agents."""

    def values(self) -> dict[str, str]:
        """Column → value."""
        return {c: cell.value for c, cell in self.cells.items()}

    def missing(self) -> list[str]:
        """Columns whose cell is still missing (with `strict_evidence`, or `unverified`)."""
        return [c for c, cell in self.cells.items() if _counts_missing(cell, self.strict_evidence)]

    def to_ask(self) -> list[str]:
        """Columns a re-ask asks for: the missing cells and those holding a marker-looking value."""
        return [c for c, cell in self.cells.items() if _is_open(cell, self.strict_evidence)]


def _counts_missing(cell: Cell, strict_evidence: bool) -> bool:
    return cell.status is CellStatus.MISSING or (
        strict_evidence and cell.status is not CellStatus.MARKER and cell.evidence is Evidence.UNVERIFIED
    )


def _is_open(cell: Cell, strict_evidence: bool) -> bool:
    """Whether a later answer may still take the cell's place (missing, or a marker value)."""
    return cell.status is CellStatus.MARKER or _counts_missing(cell, strict_evidence)


class Table:
    """An ordered, keyed table with per-cell status."""

    def __init__(
        self,
        columns: Sequence[str],
        key_columns: Sequence[str],
        *,
        missing_markers: Iterable[str] = DEFAULT_MISSING_MARKERS,
        strict_evidence: bool = False,
        normalizers: Mapping[str, Callable[[str], str]] | None = None,
    ) -> None:
        self.columns: tuple[str, ...] = tuple(columns)
        self.key_columns: tuple[str, ...] = tuple(key_columns)
        unknown = [k for k in self.key_columns if k not in self.columns]
        if unknown:
            raise ValueError(f"key columns {unknown} are not table columns {list(self.columns)}")
        self.missing_markers = frozenset(m.casefold() for m in missing_markers)
        self.strict_evidence = strict_evidence
        self.normalizers: dict[str, Callable[[str], str]] = {
            c: f for c, f in (normalizers or {}).items() if c in self.columns
        }
        """Column → the canonical form its values are stored in (a typed column's `ColumnType.normalize`)."""
        self.rows: list[Row] = []
        self._by_key: dict[tuple[str, ...], Row] = {}

    def empty_like(self) -> Table:
        """A table of the same shape and rules (columns, key, missing markers, strict evidence, the
        columns' canonical forms), no rows."""
        return Table(self.columns, self.key_columns, missing_markers=self.missing_markers,
                     strict_evidence=self.strict_evidence, normalizers=self.normalizers)

    def canonical(self, column: str, value: str) -> str:
        """`value` as `column` stores it: its canonical form in a typed column, else as given."""
        normalize = self.normalizers.get(column)
        return value if normalize is None else normalize(value)

    def is_missing(self, value: str) -> bool:
        """Whether `value` is no answer: no visible character at all (empty, a JSON null made
        `""`, a zero-width space: it names no entity and answers nothing)."""
        return is_blank(value)

    def is_marker(self, value: str) -> bool:
        """Whether `value` reads like a not-found marker (`Unknown`, `N/A`: `missing_markers`)."""
        return value.strip().casefold() in self.missing_markers

    def key_of(self, values: Mapping[str, str]) -> tuple[str, ...] | None:
        """The normalised key of `values`, or None when a key cell is empty or a marker."""
        raw = tuple(self.canonical(k, values.get(k, "")) for k in self.key_columns)
        if any(self.is_missing(v) or self.is_marker(v) for v in raw):
            return None
        return normalize_key(raw)

    def find(self, values: Mapping[str, str]) -> Row | None:
        """The row with the same key as `values`, if any."""
        key = self.key_of(values)
        return None if key is None else self._by_key.get(key)

    def upsert(
        self,
        values: Mapping[str, str],
        *,
        task_index: int,
        source: str | None = None,
        sources: Mapping[str, str | None] | None = None,
        quotes: Mapping[str, str | None] | None = None,
        evidence: Mapping[str, Evidence] | None = None,
        origin: str | None = None,
        fill: bool = True,
    ) -> Row | None:
        """Add a row or merge it into the row with the same key.

        Args:
            values: column → value; absent columns count as missing.
            task_index: the atomic task that produced the values.
            source: the row's source URL (used for every cell it fills).
            sources: per-column source overriding `source` (e.g. `task_matrix` for forced cells).
            quotes: per-column quote the sub-agent gave for the value.
            evidence: per-column result of checking that quote (default `no_evidence`).
            origin: the provenance of a new row (`Row.origin`); a merged row keeps its own.
            fill: the values may fill the cells an existing row with the same key lacks (a later
                answer to its sub-question). False: an existing row is kept as it is, a differing
                value of a filled cell only recorded as a conflict (a duplicate key of another
                sub-question: the first row wins, as in the official scorer).

        Returns:
            The row, or None when a key cell is empty (such a row cannot be placed).
        """
        key = self.key_of(values)
        if key is None:
            return None
        row = self._by_key.get(key)
        if row is None:
            fill = True
            row = Row(cells={c: Cell() for c in self.columns}, task_index=task_index, strict_evidence=self.strict_evidence,
                      origin=origin)
            self._by_key[key] = row
            self.rows.append(row)
        for column in self.columns:
            value = self.canonical(column, one_line(values.get(column, "")))
            cell = row.cells[column]
            if self.is_missing(value) or (not fill and _is_open(cell, self.strict_evidence)):
                continue
            cell_source = (sources or {}).get(column, source)
            proof = (evidence or {}).get(column, Evidence.NO_EVIDENCE)
            if self.is_marker(value):
                if cell.status is CellStatus.MISSING:  # held, and asked again (`Row.to_ask`)
                    cell.value, cell.status, cell.source = value, CellStatus.MARKER, cell_source
                    cell.quote, cell.evidence = (quotes or {}).get(column), proof
                continue  # a marker never replaces or contradicts a value
            if cell.status is CellStatus.MARKER:
                cell.status = CellStatus.MISSING  # a real value takes the marker's place
            self._merge_cell(cell, value, cell_source, (quotes or {}).get(column), proof)
        return row

    def _merge_cell(
        self, cell: Cell, value: str, source: str | None, quote: str | None = None,
        evidence: Evidence = Evidence.NO_EVIDENCE,
    ) -> None:
        if cell.status is CellStatus.MISSING:
            cell.value, cell.status, cell.source, cell.quote, cell.evidence = value, CellStatus.FOUND, source, quote, evidence
        elif _counts_missing(cell, self.strict_evidence) and evidence is not Evidence.UNVERIFIED:
            # An unverified value counts as missing: a better-supported one takes its place; the
            # old value is kept among the alternatives (a conflict), never lost.
            if normalize_value(value) != normalize_value(cell.value):
                if cell.value not in cell.alternatives:
                    cell.alternatives.append(cell.value)
                cell.status = CellStatus.CONFLICT
            cell.value, cell.source, cell.quote, cell.evidence = value, source, quote, evidence
        elif normalize_value(value) != normalize_value(cell.value):
            if value not in cell.alternatives:
                cell.alternatives.append(value)
            cell.status = CellStatus.CONFLICT
        elif evidence is not Evidence.UNVERIFIED:
            cell.agreements += 1  # another reply, with a quote that holds up or none, says the same

    def merge_row(self, row: Row, *, fill: bool = True) -> Row | None:
        """Merge a row of another table, keeping its statuses, conflicts and origin.

        Columns this table lacks are ignored, so a delta follow-up with fewer columns merges too.
        `fill=False` keeps a row already holding the key as it is (see `upsert`): the reduce of
        one decision's sub-questions, where a duplicate key keeps its first row.
        """
        merged = self.upsert(
            {c: cell.value for c, cell in row.cells.items() if cell.status is not CellStatus.MISSING},
            task_index=row.task_index,
            sources={c: cell.source for c, cell in row.cells.items()},
            quotes={c: cell.quote for c, cell in row.cells.items()},
            evidence={c: cell.evidence for c, cell in row.cells.items()},
            origin=row.origin,
            fill=fill,
        )
        if merged is not None:
            for column, cell in row.cells.items():
                if column not in merged.cells:
                    continue
                target = merged.cells[column]
                if not fill and _is_open(target, self.strict_evidence):
                    continue
                for alt in cell.alternatives:  # values seen but not kept: never evidence for the cell
                    self._merge_cell(target, self.canonical(column, alt), cell.source, evidence=Evidence.UNVERIFIED)
                same = normalize_value(target.value) == normalize_value(self.canonical(column, cell.value))
                if cell.agreements and same:
                    target.agreements += cell.agreements  # the replies that agreed in the merged table
        return merged

    def sort_by_task(self) -> None:
        """Order rows by their task (matrix order), keeping arrival order within a task."""
        self.rows.sort(key=lambda r: r.task_index)

    def missing_cells(self) -> list[tuple[int, str]]:
        """(row position, column) of every missing cell."""
        return [(i, c) for i, row in enumerate(self.rows) for c in row.missing()]

    def records(self) -> list[dict[str, str]]:
        """The table as a list of column → value dicts, in row order."""
        return [row.values() for row in self.rows]

    def to_json(self) -> dict[str, Any]:
        """Values, statuses, sources, quotes, evidence and conflicts, for result files and traces;
        a row's `origin` when it has one (rows of nested decisions)."""
        return {
            "columns": list(self.columns),
            "key_columns": list(self.key_columns),
            "rows": [
                {
                    "task_index": row.task_index,
                    "cells": {c: cell.to_json() for c, cell in row.cells.items()},
                } | ({"origin": row.origin} if row.origin is not None else {})
                for row in self.rows
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        """The table `to_json` wrote (a run's `result.json` `table`), cells as they were recorded:
        values, statuses, sources, quotes, evidence, conflicts and agreements; rows in their order.

        Raises:
            ValueError: not a table object (a key column outside the columns, a row without cells,
                an unknown status or evidence).
        """
        table = cls(list(data["columns"]), list(data["key_columns"]))
        for raw in data["rows"]:
            cells = {c: Cell() for c in table.columns}
            for column, cell in dict(raw["cells"]).items():
                if column not in cells:
                    raise ValueError(f"a row has a cell of column {column!r}, which the table does not have")
                cells[column] = Cell(value=str(cell.get("value") or ""), status=CellStatus(cell.get("status", "missing")),
                                     source=cell.get("source"), alternatives=list(cell.get("alternatives") or []),
                                     quote=cell.get("quote"), evidence=Evidence(cell.get("evidence", "no_evidence")),
                                     agreements=int(cell.get("agreements") or 0))
            row = Row(cells=cells, task_index=int(raw["task_index"]), origin=raw.get("origin"))
            table.rows.append(row)
            key = table.key_of(row.values())
            if key is not None:
                table._by_key.setdefault(key, row)
        return table

    def evidence_counts(self) -> dict[str, int]:
        """How many cells answered by sub-agents (a value, not from the task matrix) are
        `verified`, `unverified` and `no_evidence`."""
        counts = dict.fromkeys((str(e) for e in Evidence), 0)
        for row in self.rows:
            for cell in row.cells.values():
                if cell.status is not CellStatus.MISSING and cell.source != MATRIX_SOURCE:
                    counts[str(cell.evidence)] += 1
        return counts

    def __len__(self) -> int:
        return len(self.rows)
