"""Render a table as WideSearch-readable markdown, CSV or JSONL.

The markdown is one ```` ```markdown ```` fenced table written for the official WideSearch
parser (docs/scorer-rules.md §3), which splits lines on `|`, strips every cell and reads the
result with `pandas.read_csv(sep="|")`. So:

* a cell never holds a newline or a tab (collapsed to a space at projection time, and again
  here, by `amapreduce._text.one_line`); every other character is written as it is: a Unicode
  space (U+3000, U+2002, U+00A0 ...) inside a value is part of it, since the official
  normalisation deletes only ASCII spaces and a rewritten one would no longer match its key;
* a run of three or more backticks becomes two: the official regex would end the
  ```` ```markdown ```` block at it and lose the rest of the table;
* a cell holding `|` or starting with `"` is written CSV-quoted (`"a|b"`, inner `"` doubled),
  which `read_csv` reads back as the original text. White space next to a `|` inside a cell is
  the one thing the official parser cannot keep (it strips around every `|`); we write it
  stripped so what you see is what the scorer reads.
"""

from __future__ import annotations

import csv
import io
import json
import re

from amapreduce._text import one_line
from amapreduce.table.table import Table

__all__ = ["markdown_cell", "to_csv", "to_jsonl", "to_markdown"]

_SPACE_AROUND_PIPE = re.compile(r"\s*\|\s*")
_FENCE_BREAKER = re.compile(r"`{3,}")


def markdown_cell(value: str) -> str:
    """One value as a markdown table cell that the WideSearch parser reads back."""
    text = _FENCE_BREAKER.sub("``", one_line(value).strip())
    if "|" in text or text.startswith('"'):
        text = _SPACE_AROUND_PIPE.sub("|", text)
        text = '"' + text.replace('"', '""') + '"'
    return text


def to_markdown(table: Table, *, fenced: bool = True) -> str:
    """The table as a GitHub-style markdown table, by default inside a ```` ```markdown ```` fence."""
    lines = [
        "| " + " | ".join(markdown_cell(c) for c in table.columns) + " |",
        "|" + "|".join(" --- " for _ in table.columns) + "|",
    ]
    for row in table.rows:
        lines.append("| " + " | ".join(markdown_cell(row.cells[c].value) for c in table.columns) + " |")
    body = "\n".join(lines)
    return f"```markdown\n{body}\n```" if fenced else body


def to_csv(table: Table, *, evidence: bool = False) -> str:
    """The table as CSV text (header row first); with `evidence`, each column is followed by its
    cells' `<column> quote`, `<column> evidence` and `<column> confidence` columns (`--evidence`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if not evidence:
        writer.writerow(table.columns)
        writer.writerows([row.cells[c].value for c in table.columns] for row in table.rows)
        return buffer.getvalue()
    writer.writerow([name for c in table.columns for name in (c, f"{c} quote", f"{c} evidence", f"{c} confidence")])
    for row in table.rows:
        cells = [row.cells[c] for c in table.columns]
        writer.writerow([text for cell in cells
                         for text in (cell.value, cell.quote or "", str(cell.evidence), f"{cell.confidence:g}")])
    return buffer.getvalue()


def to_jsonl(table: Table, *, with_status: bool = False) -> str:
    """One JSON object per row; with `with_status`, also `_missing`, `_conflicts`, `_sources`, and
    each answered cell's `_quotes`, `_evidence` and `_confidence` (column → quote, evidence,
    confidence), and the
    row's `_origin` when it has one (a nested decision's row: `Row.origin`)."""
    out = []
    for row in table.rows:
        obj: dict[str, object] = dict(row.values())
        if with_status:
            obj["_missing"] = row.missing()
            obj["_conflicts"] = {c: cell.alternatives for c, cell in row.cells.items() if cell.alternatives}
            obj["_sources"] = sorted({cell.source for cell in row.cells.values() if cell.source})
            obj["_quotes"] = {c: cell.quote for c, cell in row.cells.items() if cell.quote}
            obj["_evidence"] = {c: str(cell.evidence) for c, cell in row.cells.items() if cell.value}
            obj["_confidence"] = {c: cell.confidence for c, cell in row.cells.items() if cell.value}
            if row.origin is not None:
                obj["_origin"] = row.origin
        out.append(json.dumps(obj, ensure_ascii=False))
    return "\n".join(out) + ("\n" if out else "")
