"""Run directories: every run leaves `runs/<timestamp>-<slug>/` to inspect afterwards.

Contents: `table.md` (the WideSearch-readable table), `table.csv`, `result.json` (the table with
cell statuses, completeness, the decision Θ, usage, cost, timings) and `trace.jsonl` (every model
call, tool call and batch attempt, credentials redacted). Files are written atomically (a
temporary file, then `os.replace`), so a crash never leaves half a result behind.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from amapreduce._atomic import atomic_write
from amapreduce.errors import UserError
from amapreduce.trace import TraceWriter, redact

__all__ = ["RunDir", "atomic_write", "list_runs", "load_run", "slugify"]


def slugify(text: str, *, max_len: int = 40) -> str:
    """A short, filesystem-safe slug of `text` (`"Top 10 billionaires?"` → `top-10-billionaires`)."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", ascii_text).strip("-").lower()
    return slug[:max_len].rstrip("-") or "run"


class RunDir:
    """One run's folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self.trace = TraceWriter(self.path / "trace.jsonl")

    @classmethod
    def create(cls, runs_dir: Path, label: str, *, now: float | None = None) -> RunDir:
        """A new, uniquely named run folder under `runs_dir`."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        base = runs_dir / f"{stamp}-{slugify(label)}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        return cls(path)

    def write_table(self, markdown: str, csv_text: str) -> None:
        """Write `table.md` and `table.csv`."""
        atomic_write(self.path / "table.md", markdown + "\n")
        atomic_write(self.path / "table.csv", csv_text)

    def write_result(self, result: Mapping[str, Any]) -> None:
        """Write `result.json` (credentials redacted)."""
        atomic_write(self.path / "result.json", json.dumps(redact(dict(result)), ensure_ascii=False, indent=2, default=str))

    def close(self) -> None:
        """Close the trace."""
        self.trace.close()


def load_run(runs_dir: Path, name: str) -> dict[str, Any]:
    """The `result.json` of run `name` (a folder name or a path)."""
    path = Path(name) if Path(name).is_dir() else runs_dir / name
    result = path / "result.json"
    if not result.is_file():
        raise UserError(f"no run {name!r}: {str(result)!r} does not exist. List runs with `amapreduce runs list`.")
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{str(result)!r} is not valid JSON ({exc.msg}); the run may have been interrupted.") from None
    if not isinstance(data, dict):
        raise UserError(f"{str(result)!r} does not hold a run result object.")
    data.setdefault("run_dir", str(path))
    return data


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """One summary per run folder that has a `result.json`, newest first."""
    rows: list[dict[str, Any]] = []
    if not runs_dir.is_dir():
        return rows
    for folder in sorted((p for p in runs_dir.iterdir() if p.is_dir()), reverse=True):
        result = folder / "result.json"
        if not result.is_file():
            continue
        try:
            data = json.loads(result.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            rows.append({"run": folder.name, "status": "unreadable result.json"})
            continue
        completeness = data.get("completeness", {})
        rows.append(
            {
                "run": folder.name,
                "kind": data.get("kind"),
                "query": data.get("query"),
                "rows": completeness.get("rows"),
                "missing_cells": completeness.get("missing_cells"),
                "cost_usd": (data.get("usage") or {}).get("total", {}).get("cost_usd"),
                "status": data.get("status"),
            }
        )
    return rows
