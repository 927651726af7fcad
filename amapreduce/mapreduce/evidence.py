"""Checking a reply's quotes against what the attempt's tools fetched (`--verify`).

Why its own module: the engine opens a `table.evidence.recording` around each attempt and, when
the attempt settles, gives each projected row its evidence here; the rules of a match live in
`table.evidence`, the setting's meaning (`off`, `record`, `strict`) here and in the tables the
engine makes (`strict` tables count `unverified` cells as missing, so the batch's retries and
the delta-patch rounds ask for them again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from amapreduce.mapreduce.replies import ProjectedRow
from amapreduce.settings import VerifyMode
from amapreduce.table.evidence import Evidence, FetchedPages, check_evidence, normalize_quote, recording

__all__ = ["recording", "with_evidence"]


def with_evidence(row: ProjectedRow, pages: FetchedPages, mode: VerifyMode,
                  entities: Mapping[str, str] | None = None) -> ProjectedRow:
    """`row` with the evidence of each answered cell: its quote checked against the text fetched
    for the cell's URL (its own, else the row's `source`; none given: any page of the attempt).
    With `off` nothing is checked (every cell `no_evidence`; quotes are still kept).

    `entities` (a value the task matrix fixes → its column: what the batch's sub-questions are about):
    a quote of another column that says nothing but one of these names the entity, not the cell's
    value, and verifies nothing (`unverified`). Measured: SmolLM2-135M filled "capital" with the
    country's own name and quoted it from the country's page, a quote found on the page."""
    if mode == "off":
        return replace(row, evidence={})
    named = {normalize_quote(v): c for v, c in (entities or {}).items() if v and v.strip()}
    evidence = {}
    for column, value in row.values.items():
        if not value:
            continue
        quote = row.quotes.get(column)
        found = check_evidence(value, quote, row.cell_sources.get(column, row.source), pages)
        if found is Evidence.VERIFIED and named.get(normalize_quote(quote or ""), column) != column:
            found = Evidence.UNVERIFIED
        evidence[column] = found
    return replace(row, evidence=evidence)
