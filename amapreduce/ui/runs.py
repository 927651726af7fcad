"""What the Runs and Run pages show, read through the run directory code (`session.rundir`).

Why a view layer between the files and the templates: `result.json` is a contract of its own
(`session.lifecycle`), and a run still going has only its journal; turning both into plain rows
and cells here keeps the templates free of guesses and lets the tests check the numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException

from amapreduce.errors import UserError
from amapreduce.llm.meter import format_recorded_cost
from amapreduce.llm.usage import Usage
from amapreduce.session.rundir import RUN_STATES, list_runs, load_run
from amapreduce.table.evidence import Evidence
from amapreduce.table.render import to_jsonl
from amapreduce.table.table import Cell, CellStatus, Row, Table
from amapreduce.trace import read_trace
from amapreduce.ui.timeline import Timeline, read_timeline

__all__ = ["DOWNLOADS", "CellView", "RunView", "as_dict", "as_list", "download", "own_file", "run_view", "runs_view"]

DOWNLOADS = {"csv": ("table.csv", "text/csv"), "md": ("table.md", "text/markdown"),
             "jsonl": ("table.jsonl", "application/x-ndjson")}
"""The table downloads: format → (file name, media type)."""

LIVE_STATE = "running"
_STATUSES = frozenset(s.value for s in CellStatus)


def as_dict(value: object) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one: run files are read, not trusted."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    """`value` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def runs_view(runs_dir: Path, state: str | None) -> dict[str, Any]:
    """The Runs page: one row per run (`list_runs`, which reads each run's files once, its wall time included).

    Raises:
        UserError: `state` is not one of `RUN_STATES`.
    """
    if state is not None and state not in RUN_STATES:
        raise UserError(f"unknown status {state!r}: use one of {', '.join(RUN_STATES)}.")
    rows = list_runs(runs_dir, state=state)
    for row in rows:
        for key in ("kind", "query", "rows", "missing_cells", "wall_s"):  # an unreadable run has only its name and why
            row.setdefault(key, None)
        row["cost"] = format_recorded_cost(row.get("cost_usd"), row.get("unpriced_models"))
        row["live"] = row.get("state") == LIVE_STATE
    return {"runs": rows, "states": RUN_STATES, "state": state, "live": any(r["live"] for r in rows),
            "runs_dir": str(runs_dir)}


@dataclass(frozen=True)
class CellView:
    """One table cell as the page draws it."""

    value: str
    status: str
    css: str
    source: str | None
    link: str | None
    """The source as a link, only for http(s) URLs (never `javascript:` or a local scheme)."""
    title: str
    evidence: str | None = None
    """`verified` or `unverified` when the cell's quote was checked (the left marker), else None."""
    confidence: float | None = None
    """The cell's confidence in [0, 1] (`table.cell_confidence`) as `result.json` records it; None for
    a run recorded before confidences were."""


@dataclass(frozen=True)
class RowView:
    """One table row as the page draws it: its number in the table (matrix order) and its cells."""

    n: int
    cells: list[CellView]

    @property
    def least_confidence(self) -> float:
        """The lowest confidence among the row's answered cells (1.0 when none is recorded)."""
        return min((c.confidence for c in self.cells if c.confidence is not None and c.value), default=1.0)


TABLE_ORDERS = ("matrix", "confidence")
"""How the Run page may order the table: matrix order, or least sure rows first (`?order=`)."""


def _cell(raw: object) -> CellView:
    cell = raw if isinstance(raw, dict) else {}
    value = str(cell.get("value") or "")
    status = str(cell.get("status") or CellStatus.MISSING.value)
    source = cell.get("source")
    source = str(source) if source else None
    alternatives = [str(a) for a in cell.get("alternatives") or []]
    css = [f"cell-{status if status in _STATUSES else 'other'}"]
    evidence = cell.get("evidence")
    verified = {Evidence.VERIFIED.value: True, Evidence.UNVERIFIED.value: False}.get(str(evidence))
    if verified is not None:
        css.append("cell-verified" if verified else "cell-unverified")
    confidence = cell.get("confidence")
    confidence = float(confidence) if isinstance(confidence, int | float) and not isinstance(confidence, bool) else None
    title = [f"status: {status}" + (f", {evidence}" if verified is not None else "")
             + (f", confidence {confidence:g}" if confidence is not None and value else "")]
    if source:
        title.append(f"source: {source}")
    if cell.get("quote"):
        title.append(f"quote: {cell['quote']}")
    if alternatives:
        title.append("also seen: " + "; ".join(alternatives))
    link = source if source and source.lower().startswith(("http://", "https://")) else None
    return CellView(value=value, status=status, css=" ".join(css), source=source, link=link, title="\n".join(title),
                    evidence=str(evidence) if verified is not None else None, confidence=confidence)


def _table(recorded: object, *, order: str = "matrix", below: float | None = None) -> dict[str, Any] | None:
    """The table as the page draws it; `order` `confidence` puts the least sure rows first, `below`
    keeps only rows with an answered cell less sure than it (the counts are the whole table's)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("columns"), list):
        return None
    columns = [str(c) for c in recorded["columns"]]
    rows = [RowView(n=n, cells=[_cell((r.get("cells") or {}).get(c)) for c in columns])
            for n, r in enumerate((r for r in recorded.get("rows") or [] if isinstance(r, dict)), 1)]
    counts: dict[str, int] = {}
    checked: dict[str, int] = {}
    for row in rows:
        for cell in row.cells:
            counts[cell.status] = counts.get(cell.status, 0) + 1
            if cell.evidence is not None:
                checked[cell.evidence] = checked.get(cell.evidence, 0) + 1
    shown = [row for row in rows if below is None or row.least_confidence < below]
    if order == "confidence":
        shown.sort(key=lambda row: (row.least_confidence, row.n))
    return {"columns": columns, "key_columns": [str(k) for k in recorded.get("key_columns") or []],
            "rows": shown, "total_rows": len(rows), "counts": counts, "evidence": checked,
            "order": order, "below": below}


def _decision(raw: dict[str, Any]) -> dict[str, Any]:
    """One decision Θ: its template, columns, strategy and the head of its task matrix."""
    properties = as_dict(as_dict(raw.get("json_schema")).get("properties"))
    matrix = as_list(raw.get("task_matrix"))
    strategy = as_dict(raw.get("batch_strategy"))
    return {
        "template": raw.get("template"),
        "columns": [{"name": name, "type": as_dict(spec).get("type"), "description": as_dict(spec).get("description")}
                    for name, spec in properties.items()],
        "strategy": strategy.get("type"),
        "rationale": strategy.get("rationale"),
        "batch_size": raw.get("batch_size"),
        "key_columns": raw.get("key_columns"),
        "matrix_rows": len(matrix),
        "matrix_head": [[str(v) for v in row] if isinstance(row, list) else [str(row)] for row in matrix[:50]],
        "json": json.dumps(raw, ensure_ascii=False, indent=2)[:20000],
    }


def _plans(trace: Path) -> list[list[dict[str, Any]]]:
    """The batch plan of each execution (`run_start` events of the trace)."""
    return [[{"batch_id": b.get("batch_id"), "size": b.get("size"),
              "rows": ", ".join(str(i) for i in b.get("source_indices") or []), "rationale": b.get("rationale")}
             for b in event.get("batches") or [] if isinstance(b, dict)]
            for event in read_trace(trace, event="run_start")]


def _usage(usage: object) -> list[dict[str, Any]]:
    """Usage by role, then the total, read with `Usage.from_json` (either spelling of the token
    counts); the cost as recorded, so an unpriced run does not read as free."""
    if not isinstance(usage, dict):
        return []
    unpriced = usage.get("unpriced_models")
    parts = [(role, u) for role, u in as_dict(usage.get("by_role")).items() if isinstance(u, dict)]
    if isinstance(usage.get("total"), dict):
        parts.append(("total", usage["total"]))
    rows = []
    for role, raw in parts:
        counted = Usage.from_json(raw)
        rows.append({"role": role, "requests": counted.requests, "prompt_tokens": counted.input_tokens,
                     "completion_tokens": counted.output_tokens, "cached_tokens": counted.cached_tokens,
                     "cost": format_recorded_cost(raw.get("cost_usd"), unpriced if role == "total" else None)})
    return rows


@dataclass(frozen=True)
class RunView:
    """Everything the Run page shows."""

    name: str
    data: dict[str, Any]
    table: dict[str, Any] | None
    decisions: list[dict[str, Any]]
    plans: list[list[dict[str, Any]]]
    timeline: Timeline | None
    usage: list[dict[str, Any]]
    live: bool
    downloads: list[str]


def run_view(path: Path, *, order: str = "matrix", below: float | None = None) -> RunView:
    """The Run page of the run folder `path` (already checked to lie inside a served folder).

    Raises:
        UserError: the folder holds no readable run (`load_run`).
    """
    data = load_run(path.parent, str(path))
    has_table = isinstance(data.get("table"), dict)
    downloads = [fmt for fmt, (name, _) in DOWNLOADS.items()
                 if ((path / name).is_file() and not (path / name).is_symlink()) or (fmt == "jsonl" and has_table)]
    return RunView(
        name=path.name, data=data, table=_table(data.get("table"), order=order, below=below),
        decisions=[_decision(d) for d in data.get("decisions") or [] if isinstance(d, dict)],
        plans=_plans(path / "trace.jsonl"), timeline=read_timeline(path / "trace.jsonl"),
        usage=_usage(data.get("usage")), live=data.get("state") == LIVE_STATE, downloads=downloads,
    )


def _recorded_cell(raw: object) -> Cell:
    """The `Cell` a `result.json` cell records (`Cell.to_json`); an unknown status counts as missing,
    an unknown evidence as `no_evidence`."""
    cell = as_dict(raw)
    status, evidence = str(cell.get("status")), str(cell.get("evidence"))
    source, quote = cell.get("source"), cell.get("quote")
    return Cell(
        value=str(cell.get("value") or ""),
        status=CellStatus(status) if status in _STATUSES else CellStatus.MISSING,
        source=str(source) if source else None,
        alternatives=[str(a) for a in cell.get("alternatives") or []],
        quote=str(quote) if quote else None,
        evidence=Evidence(evidence) if evidence in set(Evidence) else Evidence.NO_EVIDENCE,
        agreements=int(cell.get("agreements") or 0),
    )


def _as_table(recorded: dict[str, Any]) -> Table:
    """The `Table` a `result.json` records (values, statuses, sources, conflicts, quotes, evidence)."""
    columns = [str(c) for c in recorded.get("columns") or []]
    table = Table(columns, [str(k) for k in recorded.get("key_columns") or [] if k in columns])
    for raw in recorded.get("rows") or []:
        cells = raw.get("cells") or {}
        origin = raw.get("origin")
        table.rows.append(Row(cells={c: _recorded_cell(cells.get(c)) for c in columns},
                              task_index=int(raw.get("task_index") or 0), origin=str(origin) if origin else None))
    return table


def own_file(folder: Path, name: str) -> Path:
    """The file `name` of the run folder `folder`, refused (404, as a missing one) when it is a
    symbolic link: a run's files are written by amapreduce, never linked, and a `table.csv` linked to
    a file outside `runs/` used to be served (the folder routes already refused linked folders).

    Raises:
        HTTPException: 404 for a link (wherever it points) or a file that resolves out of `folder`.
    """
    file = folder / name
    if file.is_symlink() or file.resolve().parent != folder.resolve():
        raise HTTPException(404, f"no such file: {name!r} in the run {folder.name}.")
    return file


def download(path: Path, fmt: str) -> tuple[str, str, str]:
    """The table of the run folder `path` as (file name, media type, text) in `fmt` (csv, md, jsonl).

    CSV and markdown are the run's own files; JSONL is rendered from `result.json` with each
    row's missing cells, conflicts and sources (`table.render.to_jsonl`).

    Raises:
        UserError: unknown format, or the run has no such table.
        HTTPException: 404 when the file (or `result.json`, for JSONL) is a symbolic link (`own_file`).
    """
    if fmt not in DOWNLOADS:
        raise UserError(f"unknown download format {fmt!r}: use csv, md or jsonl.")
    name, media = DOWNLOADS[fmt]
    if fmt != "jsonl":
        file = path / name
        if not file.is_file():
            raise UserError(f"the run {path.name} has no {name}.")
        return name, media, own_file(path, name).read_text(encoding="utf-8")
    own_file(path, "result.json")
    recorded = load_run(path.parent, str(path)).get("table")
    if not isinstance(recorded, dict):
        raise UserError(f"the run {path.name} recorded no table.")
    return name, media, to_jsonl(_as_table(recorded), with_status=True)
