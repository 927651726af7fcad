"""Work items: the atomic tasks a batch carries, where their rows go, and what is still missing.

A `WorkItem` is one numbered sub-question of a batch. Its rows merge into the table of the
task-matrix row it belongs to (`task_index`); `forced` cells (the matrix's own values, or the
key of the row a patch targets) always win over what a sub-agent wrote, because they define
which entity the row is about. Which item a reply row answers is decided by its `task` number,
else by the only item of the batch, else by matching its forced cells; a row that fits no item
is dropped (and traced), never guessed into place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from amapreduce.decision.columns import ColumnSpec
from amapreduce.mapreduce.batching import Batch
from amapreduce.mapreduce.replies import ProjectedRow
from amapreduce.table.keys import normalize_value
from amapreduce.table.table import MATRIX_SOURCE, Row, Table

__all__ = ["MATRIX_SOURCE", "WorkBatch", "WorkItem", "assign_rows", "item_gaps"]


@dataclass(frozen=True, kw_only=True)
class WorkItem:
    """One sub-question and where its answer goes."""

    task_index: int
    """Task-matrix row whose table receives the rows."""
    text: str
    """The sub-question as the sub-agent reads it."""
    forced: Mapping[str, str]
    """Cells fixed by the item (matrix values; for a patch, the target row's key)."""
    columns: tuple[str, ...]
    """Columns the sub-agent must fill for this item."""
    single_row: bool
    """True when the item is exactly one row (its key is fully forced)."""
    expected_rows: int | None = None
    """For multi-row items: rows required (None: at least one)."""


@dataclass(frozen=True, kw_only=True)
class WorkBatch:
    """A planned batch with its items (numbered 1.. in the prompt)."""

    batch: Batch
    items: tuple[WorkItem, ...]
    column_specs: tuple[ColumnSpec, ...]
    """Columns shown to the sub-agent (names, types, descriptions)."""
    phase: str = "map"
    """`map`, or `patch<k>` for delta-patch round k."""


def _matches(row: ProjectedRow, item: WorkItem) -> bool:
    compared = False
    for column, value in item.forced.items():
        got = row.values.get(column, "")
        if got:
            compared = True
            if normalize_value(got) != normalize_value(value):
                return False
    return compared


def assign_rows(rows: Sequence[ProjectedRow], items: Sequence[WorkItem]) -> tuple[dict[int, list[ProjectedRow]], int]:
    """Attribute reply rows to item numbers (1-based). Returns (rows by number, rows dropped)."""
    by_number: dict[int, list[ProjectedRow]] = {}
    dropped = 0
    for row in rows:
        number: int | None = None
        if row.task is not None and 1 <= row.task <= len(items):
            number = row.task
        elif len(items) == 1:
            number = 1
        else:
            hits = [k for k, item in enumerate(items, 1) if _matches(row, item)]
            if len(hits) == 1:
                number = hits[0]
        if number is None:
            dropped += 1
        else:
            by_number.setdefault(number, []).append(row)
    return by_number, dropped


def _target(table: Table, item: WorkItem) -> Row | None:
    return table.find(item.forced)


def item_gaps(table: Table, item: WorkItem) -> str | None:
    """What the item still lacks, in words for the continuation prompt (None: complete)."""
    if item.single_row:
        row = _target(table, item)
        if row is None:
            return "no row yet"
        lacking = [c for c in item.columns if c in row.to_ask()]
        return f"still missing {', '.join(lacking)}" if lacking else None
    rows = [r for r in table.rows if all(normalize_value(r.cells[c].value) == normalize_value(v) for c, v in item.forced.items())]
    gaps = []
    need = item.expected_rows or 1
    if len(rows) < need:
        gaps.append(f"{len(rows)} of {need} rows found" if rows else "no rows yet")
    for row in rows:
        lacking = [c for c in item.columns if c in row.to_ask()]
        if lacking:
            key = ", ".join(f"{k} = {row.cells[k].value}" for k in table.key_columns)
            gaps.append(f"row ({key}) is missing {', '.join(lacking)}")
    return "; ".join(gaps) or None
