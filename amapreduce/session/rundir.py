"""Run directories: every run leaves `runs/<timestamp>-<slug>/` to inspect afterwards.

Contents: `table.md` (the WideSearch-readable table), `table.csv`, `result.json` (the table with
cell statuses, completeness, the decision Θ, usage, cost, timings) and `trace.jsonl` (every model
call, tool call and batch attempt, credentials redacted), and `journal.jsonl` (`session.journal`:
the run's start, decisions, every settled batch attempt and its end, each line fsynced; what
`runs resume` continues from and what tells a live run from a dead one). Files are written
atomically (a temporary file, then `os.replace`), so a crash never leaves half a result behind.

A run's state (`runs list --status`): `running` or `interrupted` while its journal has no end
after its last start (its process lives, or is gone), else its `RunStatus` (`complete`,
`incomplete`, `stopped`, `interrupted`, `failed`, `no_table`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amapreduce._atomic import atomic_write, write_json
from amapreduce.errors import UserError
from amapreduce.mapreduce.result import RunEnding, RunStatus
from amapreduce.session.journal import RunJournal, read_run_journal
from amapreduce.session.record import RunRecord
from amapreduce.trace import TraceWriter

__all__ = ["RUN_STATES", "RunDir", "StoredRun", "atomic_write", "list_runs", "read_run", "run_path", "slugify"]

RUN_STATES = ("running", *(s.value for s in RunStatus))
"""What `runs list --status` filters on."""


def slugify(text: str, *, max_len: int = 40) -> str:
    """A short, filesystem-safe slug of `text` (`"Top 10 billionaires?"` → `top-10-billionaires`)."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", ascii_text).strip("-").lower()
    return slug[:max_len].rstrip("-") or "run"


class RunDir:
    """One run's folder: `RunDir.create` makes a new one, `RunDir(path)` reopens an existing one
    (a resumed run)."""

    def __init__(self, path: Path) -> None:
        if not path.is_dir():
            raise UserError(f"no run folder {str(path)!r}. List runs with `amapreduce runs list`.")
        self.path = path
        self.trace = TraceWriter(self.path / "trace.jsonl")

    @classmethod
    def create(cls, runs_dir: Path, label: str, *, now: float | None = None) -> RunDir:
        """A new run folder under `runs_dir`, `<timestamp>-<slug>`, that no other run has.

        Why `mkdir` without `exist_ok`: the folder is claimed by creating it, which the file
        system does for one caller only. Checking for it first and then creating it let two runs
        started in the same second both take one folder (their traces interleaved and one
        `result.json` overwrote the other). A name already taken gets the next suffix (`-2`,
        `-3`, ...) until a `mkdir` succeeds.
        """
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        base = f"{stamp}-{slugify(label)}"
        runs_dir.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:
            path = runs_dir / (base if n == 1 else f"{base}-{n}")
            try:
                path.mkdir()
            except FileExistsError:
                n += 1
                continue
            return cls(path)

    @property
    def opaque_name(self) -> str:
        """The folder's name with the question's slug replaced by a digest of the whole name:
        `20261127-161530-3f9a0c2e1b`, unique per folder and the same on every resume, but saying
        nothing of the question (the session id of a trace that hides its inputs)."""
        name = self.path.name
        return f"{name[:15]}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"

    def write_table(self, markdown: str, csv_text: str) -> None:
        """Write `table.md` and `table.csv`."""
        atomic_write(self.path / "table.md", markdown + "\n")
        atomic_write(self.path / "table.csv", csv_text)

    def write_result(self, record: RunRecord) -> None:
        """Write `record` as `result.json` (credentials redacted, by value and by key name)."""
        write_json(self.path / "result.json", record.to_json(), indent=2, credential_keys=True)

    def close(self) -> None:
        """Close the trace."""
        self.trace.close()

    def discard(self) -> None:
        """Remove the folder (closed first): a run refused while it was being set up, before any
        work, leaves nothing behind (`session.Session`)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):  # the runs folder too, when this run was all it held
            self.path.parent.rmdir()


def run_path(runs_dir: Path, name: str) -> Path:
    """The folder of run `name` (a folder name under `runs_dir`, or a path).

    Raises:
        UserError: there is no such folder.
    """
    path = Path(name) if Path(name).is_dir() else runs_dir / name
    if not path.is_dir():
        raise UserError(f"no run {name!r}: {str(path)!r} does not exist. List runs with `amapreduce runs list`.")
    return path


def _state_of_label(label: object) -> str | None:
    """The `RunStatus` value of a `result.json` `status` string (see `RunEnding.label`)."""
    status = RunEnding.status_of_label(label)
    return status.value if status is not None else None


def _progress(journal: RunJournal | None) -> dict[str, Any] | None:
    """The journal's batches done/total and its other counts (None: no journal)."""
    if journal is None:
        return None
    progress = journal.progress()
    return {"batches_done": progress.done, "batches_total": progress.total, **progress.data}


@dataclass(frozen=True, kw_only=True)
class StoredRun:
    """A run folder as every reader sees it (`read_run`): its record once it wrote one, and what its
    journal says now: the live state and the batches done."""

    path: Path
    kind: str
    query: str
    state: str | None
    """`running`, `interrupted` (the journal has no end after its last start), else the `RunStatus` value."""
    status: str | None
    """The record's `status`, or the journal's state while the run goes on (or died) without an end."""
    progress: dict[str, Any] | None = None
    """`batches_done`, `batches_total` and the journal's other counts (None: no journal)."""
    record: RunRecord | None = None
    """None: the run has not finished (or was killed) and wrote no `result.json` yet."""

    def to_json(self) -> dict[str, Any]:
        """The object `runs show --json` prints for a run not finished and the MCP server's
        `run_status` returns: the record's fields (or the kind and query), `state`, `status`,
        `progress` and `run_dir`."""
        return {**(self.record.to_json() if self.record is not None else {"kind": self.kind, "query": self.query}),
                "state": self.state, "status": self.status,
                **({"progress": self.progress} if self.progress is not None else {}), "run_dir": str(self.path)}


def read_run(runs_dir: Path, name: str) -> StoredRun:
    """Run `name` (a folder name under `runs_dir`, or a path): its `result.json` read as a
    `RunRecord` (the one reader), with its journal's state and batch progress; a run still going
    (or killed) without a `result.json` yet is described by its journal alone.

    Raises:
        UserError: no such run, or a `result.json` that is not a run record (the message says why).
    """
    path = run_path(runs_dir, name)
    journal = read_run_journal(path)
    result = path / "result.json"
    if not result.is_file():
        if journal is None:
            raise UserError(f"no run {name!r}: {str(result)!r} does not exist. List runs with `amapreduce runs list`.")
        live = journal.status()
        return StoredRun(path=path, kind=str(journal.first.command), query=journal.first.query or "", state=live,
                         status=live, progress=_progress(journal))
    record = RunRecord.read(result)
    if journal is None:
        state, status = _state_of_label(record.status), record.status
    else:  # a resumed run going on (or killed again) has the record of its earlier end: its state is the journal's
        state = journal.status()
        status = record.status if journal.ended is not None else state
    return StoredRun(path=path, kind=record.kind, query=record.query, state=state, status=status,
                     progress=_progress(journal), record=record)


def list_runs(runs_dir: Path, *, state: str | None = None) -> list[dict[str, Any]]:
    """One summary per run folder that has a `result.json` or a journal, newest first; with
    `state`, only the runs in that state (one of `RUN_STATES`). A run's `cost_usd` is null when it
    made no model call or used a model with no known price (named in `unpriced_models`); its
    `wall_s` (`result.json`'s `timings.wall_s`) is null until it has a result."""
    rows: list[dict[str, Any]] = []
    if not runs_dir.is_dir():
        return rows
    for folder in sorted((p for p in runs_dir.iterdir() if p.is_dir()), reverse=True):
        try:
            run = read_run(runs_dir, str(folder))
        except UserError as exc:
            if (folder / "result.json").is_file() or (folder / "journal.jsonl").is_file():
                rows.append({"run": folder.name, "status": f"unreadable: {exc}", "state": None})
            continue
        record = run.record
        usage = record.usage if record is not None else None
        rows.append({
            "run": folder.name, "kind": run.kind, "query": run.query,
            "rows": record.completeness.rows if record is not None else None,
            "missing_cells": record.completeness.missing_cells if record is not None else None,
            # no model call: no cost to show; a model without a price makes the cost unknown, also in a
            # record written when its total counted such a model as $0
            "cost_usd": usage.total.cost_usd if usage is not None and usage.total.requests and not usage.unpriced_models
            else None,
            "unpriced_models": list(usage.unpriced_models) if usage is not None else [],
            "wall_s": record.timings.wall_s if record is not None else None,
            "status": run.status, "state": run.state,
            **({"progress": run.progress} if run.progress is not None else {}),
        })
    return [r for r in rows if state is None or r["state"] == state]
