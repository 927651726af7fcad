"""Run folders for tests that need one without running anything: each `result.json` is a `RunRecord`.

Why one helper: a hand-made `result.json` that the run record would refuse tests nothing a user can
meet (every run writes a record `RunRecord.of` validated), so the fixtures are built through the
record too, with the fields a test does not care about at neutral values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amapreduce.session.record import RunRecord
from amapreduce.table.table import Cell, CellStatus

ZERO_COUNTS = {"rows": 0, "missing_cells": 0, "incomplete_tasks": 0, "complete": True, "executions": 0, "batches": 0,
               "patch_rounds": 0, "attempts": 0, "retries": 0, "timeouts": 0, "failures": 0, "backups": 0}


def role_usage(requests: int = 0, prompt: int = 0, completion: int = 0, cost: float | None = 0.0) -> dict[str, Any]:
    return {"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion, "cost_usd": cost}


def cell(value: str, status: str = "found", source: str | None = None, **fields: Any) -> dict[str, Any]:
    """A recorded cell as `Cell.to_json` writes it (its confidence by the table's rule)."""
    made = Cell(value=value, status=CellStatus(status), source=source, **fields)
    return made.to_json()


def record(*, completeness: dict[str, Any] | None = None, **fields: Any) -> RunRecord:
    """A record of an `ask` that found nothing, with `fields` set and `completeness` counts merged in."""
    data: dict[str, Any] = {"kind": "ask", "query": "q", "status": "complete",
                            "usage": {"by_role": {}, "total": role_usage()}, "timings": {"wall_s": 1.0}, **fields}
    data["completeness"] = {**ZERO_COUNTS, **(completeness or {})}
    return RunRecord.of(data)


def write_record(folder: Path, *, completeness: dict[str, Any] | None = None, **fields: Any) -> RunRecord:
    """`record(...)` written as `folder/result.json` (the folder made)."""
    made = record(completeness=completeness, **fields)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(made.to_json()), encoding="utf-8")
    return made
