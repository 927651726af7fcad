"""The enriched list: the user's rows, every input column and the row order kept, the new columns added.

Each input row is matched to the run's table by its key (`EnrichRequest.keys`), so a row the run
could not fill is still there: its input as given, its new cells blank (None) and its
`enrich_status` `failed`. With evidence, each new column `c` is followed by `c status` (`found`,
`missing`, `conflict`, `marker`), `c source` (the URL), `c quote` (the sub-agent's verbatim text) and
`c evidence` (`verified`, `unverified`, `no_evidence`: the quote checked against what was fetched).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amapreduce.enrichment.request import EVIDENCE_SUFFIXES, ROW_STATUS_COLUMN, EnrichRequest
from amapreduce.table.table import CellStatus, Table

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RowCounts", "enriched_frame", "row_counts"]

RowCounts = dict[str, int]
"""Rows by `enrich_status` (`complete`, `partial`, `failed`)."""


def enriched_frame(request: EnrichRequest, table: Table, *, evidence: bool = False) -> pd.DataFrame:
    """The input frame with the new columns (and `enrich_status`; with `evidence`, each new
    column's status, source, quote and evidence) added after its own, its rows in input order."""
    frame = request.frame.copy()
    by_key = {request_key: row for row in table.rows if (request_key := table.key_of(row.values())) is not None}
    values: dict[str, list[object]] = {c: [] for c in request.columns}
    extra: dict[str, list[object]] = {f"{c} {s}": [] for c in request.columns for s in EVIDENCE_SUFFIXES}
    statuses: list[str] = []
    for key in request.keys:
        row = by_key.get(key)
        found = 0
        for column in request.columns:
            cell = row.cells[column] if row is not None else None
            missing = cell is None or cell.status is CellStatus.MISSING
            found += not missing
            values[column].append(None if missing or cell is None else cell.value)
            extra[f"{column} status"].append(str(cell.status) if cell is not None else str(CellStatus.MISSING))
            extra[f"{column} source"].append(None if cell is None else cell.source)
            extra[f"{column} quote"].append(None if cell is None else cell.quote)
            extra[f"{column} evidence"].append(None if cell is None else str(cell.evidence))
        statuses.append("complete" if found == len(request.columns) else "partial" if found else "failed")
    for column in request.columns:
        frame[column] = values[column]
    frame[ROW_STATUS_COLUMN] = statuses
    if evidence:
        for name, cells in extra.items():
            frame[name] = cells
    return frame


def row_counts(frame: pd.DataFrame) -> RowCounts:
    """How many rows of an enriched frame are `complete`, `partial` and `failed`."""
    counts = frame[ROW_STATUS_COLUMN].value_counts()
    return {status: int(counts.get(status, 0)) for status in ("complete", "partial", "failed")}
