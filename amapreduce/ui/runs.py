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
from amapreduce.session.record import UsageRecord
from amapreduce.session.rundir import RUN_STATES, StoredRun, list_runs, read_run
from amapreduce.table.evidence import Evidence
from amapreduce.table.render import to_jsonl
from amapreduce.table.table import Cell, Table
from amapreduce.trace import read_trace
from amapreduce.ui.timeline import Timeline, read_timeline

__all__ = ["DOWNLOADS", "CellView", "RunView", "as_dict", "as_list", "download", "own_file", "run_view", "runs_view"]

DOWNLOADS = {"csv": ("table.csv", "text/csv"), "md": ("table.md", "text/markdown"),
             "jsonl": ("table.jsonl", "application/x-ndjson")}
"""The table downloads: format → (file name, media type)."""

LIVE_STATE = "running"


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


def _cell(cell: Cell) -> CellView:
    value, status, source = cell.value, str(cell.status), cell.source or None
    css = [f"cell-{status}"]
    verified = {Evidence.VERIFIED: True, Evidence.UNVERIFIED: False}.get(cell.evidence)
    if verified is not None:
        css.append("cell-verified" if verified else "cell-unverified")
    title = [f"status: {status}" + (f", {cell.evidence}" if verified is not None else "")
             + (f", confidence {cell.confidence:g}" if value else "")]
    if source:
        title.append(f"source: {source}")
    if cell.quote:
        title.append(f"quote: {cell.quote}")
    if cell.alternatives:
        title.append("also seen: " + "; ".join(cell.alternatives))
    link = source if source and source.lower().startswith(("http://", "https://")) else None
    return CellView(value=value, status=status, css=" ".join(css), source=source, link=link, title="\n".join(title),
                    evidence=str(cell.evidence) if verified is not None else None, confidence=cell.confidence)


def _table(table: Table, *, order: str = "matrix", below: float | None = None) -> dict[str, Any]:
    """The table as the page draws it; `order` `confidence` puts the least sure rows first, `below`
    keeps only rows with an answered cell less sure than it (the counts are the whole table's)."""
    rows = [RowView(n=n, cells=[_cell(r.cells[c]) for c in table.columns]) for n, r in enumerate(table.rows, 1)]
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
    return {"columns": list(table.columns), "key_columns": list(table.key_columns),
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


def _usage(usage: UsageRecord) -> list[dict[str, Any]]:
    """Usage by role, then the total; the cost as recorded, so an unpriced run does not read as free."""
    parts = [*usage.by_role.items(), ("total", usage.total)]
    return [{"role": role, "requests": u.requests, "prompt_tokens": u.prompt_tokens,
             "completion_tokens": u.completion_tokens, "cached_tokens": u.cached_tokens, "abandoned": u.abandoned,
             "cost": format_recorded_cost(u.cost_usd, usage.unpriced_models if role == "total" else None)}
            for role, u in parts]


@dataclass(frozen=True)
class RunView:
    """Everything the Run page shows."""

    name: str
    run: StoredRun
    """The run folder as `read_run` reads it: its record (None while it has none) and journal state."""
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
        UserError: the folder holds no readable run (`read_run`).
    """
    run = read_run(path.parent, str(path))
    record = run.record
    recorded = record.table if record is not None else None
    downloads = [fmt for fmt, (name, _) in DOWNLOADS.items()
                 if ((path / name).is_file() and not (path / name).is_symlink()) or (fmt == "jsonl" and recorded)]
    return RunView(
        name=path.name, run=run,
        table=_table(recorded.to_table(), order=order, below=below) if recorded is not None else None,
        decisions=[_decision(d) for d in record.executed] if record is not None else [],
        plans=_plans(path / "trace.jsonl"), timeline=read_timeline(path / "trace.jsonl"),
        usage=_usage(record.usage) if record is not None else [], live=run.state == LIVE_STATE, downloads=downloads,
    )


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
    record = read_run(path.parent, str(path)).record
    if record is None or record.table is None:
        raise UserError(f"the run {path.name} recorded no table.")
    return name, media, to_jsonl(record.table.to_table(), with_status=True)
