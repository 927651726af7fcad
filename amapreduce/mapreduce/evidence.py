"""Checking a reply's quotes against what the attempt's tools fetched (`--verify`).

Why its own module: the engine opens a `table.evidence.recording` around each attempt and, when
the attempt settles, gives each projected row its evidence here; the rules of a match live in
`table.evidence`, the setting's meaning (`off`, `record`, `strict`) here and in the tables the
engine makes (`strict` tables count `unverified` cells as missing, so the batch's retries and
the delta-patch rounds ask for them again).
"""

from __future__ import annotations

from dataclasses import replace

from amapreduce.mapreduce.replies import ProjectedRow
from amapreduce.settings import VerifyMode
from amapreduce.table.evidence import FetchedPages, check_evidence, recording

__all__ = ["recording", "with_evidence"]


def with_evidence(row: ProjectedRow, pages: FetchedPages, mode: VerifyMode) -> ProjectedRow:
    """`row` with the evidence of each answered cell: its quote checked against the text fetched
    for the cell's URL (its own, else the row's `source`; none given: any page of the attempt).
    With `off` nothing is checked (every cell `no_evidence`; quotes are still kept)."""
    if mode == "off":
        return replace(row, evidence={})
    evidence = {
        column: check_evidence(value, row.quotes.get(column), row.cell_sources.get(column, row.source), pages)
        for column, value in row.values.items()
        if value
    }
    return replace(row, evidence=evidence)
