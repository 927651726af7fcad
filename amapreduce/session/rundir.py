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
import json
import re
import shutil
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from amapreduce._atomic import atomic_write, write_json
from amapreduce.errors import UserError
from amapreduce.mapreduce.result import RunEnding, RunStatus
from amapreduce.session.journal import RunJournal, read_run_journal
from amapreduce.trace import TraceWriter

__all__ = ["RUN_STATES", "RunDir", "atomic_write", "list_runs", "load_run", "run_path", "slugify"]

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

    def write_result(self, result: Mapping[str, Any]) -> None:
        """Write `result.json` (credentials redacted, by value and by key name)."""
        write_json(self.path / "result.json", dict(result), indent=2, credential_keys=True)

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


def _journal_view(journal: RunJournal | None) -> dict[str, Any]:
    """What the journal adds to a run's summary: its live state (while no end follows its last
    start) and its batches done/total."""
    if journal is None:
        return {}
    progress = journal.progress()
    view: dict[str, Any] = {"progress": {"batches_done": progress.done, "batches_total": progress.total,
                                         **progress.data}}
    if journal.ended is None:
        state = journal.status()
        view.update(state=state, status=state)
    else:
        view["state"] = journal.ended.status.value
    return view


def load_run(runs_dir: Path, name: str) -> dict[str, Any]:
    """The `result.json` of run `name` (a folder name or a path), with its journal's state and
    batch progress (`state`, `progress`); a run still going (or killed) without a `result.json`
    yet is described by its journal alone."""
    path = run_path(runs_dir, name)
    journal = read_run_journal(path)
    result = path / "result.json"
    if not result.is_file():
        if journal is None:
            raise UserError(f"no run {name!r}: {str(result)!r} does not exist. List runs with `amapreduce runs list`.")
        return {"kind": journal.first.command, "query": journal.first.query, **_journal_view(journal), "run_dir": str(path)}
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{str(result)!r} is not valid JSON ({exc.msg}); the run may have been interrupted.") from None
    if not isinstance(data, dict):
        raise UserError(f"{str(result)!r} does not hold a run result object.")
    data.setdefault("state", _state_of_label(data.get("status")))
    data.update(_journal_view(journal))
    data.setdefault("run_dir", str(path))
    return data


def _cost_of(usage: object) -> tuple[float | None, list[str]]:
    """A run's cost and the models it used without a known price, from `result.json`'s `usage`.

    The cost is None when any model was unpriced, also in a `result.json` written before that
    rule, whose total counted such a model as $0 beside its `unpriced_models` list.
    """
    if not isinstance(usage, Mapping):
        return None, []
    raw = usage.get("unpriced_models")
    unpriced = [str(m) for m in raw] if isinstance(raw, list) else []
    total = usage.get("total")
    cost = total.get("cost_usd") if isinstance(total, Mapping) else None
    if unpriced or isinstance(cost, bool) or not isinstance(cost, int | float):
        return None, unpriced
    return float(cost), unpriced


def list_runs(runs_dir: Path, *, state: str | None = None) -> list[dict[str, Any]]:
    """One summary per run folder that has a `result.json` or a journal, newest first; with
    `state`, only the runs in that state (one of `RUN_STATES`). A run's `cost_usd` is null when it
    recorded no usage or used a model with no known price (named in `unpriced_models`); its
    `wall_s` (`result.json`'s `timings.wall_s`) is null until it has a result."""
    rows: list[dict[str, Any]] = []
    if not runs_dir.is_dir():
        return rows
    for folder in sorted((p for p in runs_dir.iterdir() if p.is_dir()), reverse=True):
        try:
            data = load_run(runs_dir, str(folder))
        except UserError as exc:
            if (folder / "result.json").is_file() or (folder / "journal.jsonl").is_file():
                rows.append({"run": folder.name, "status": f"unreadable: {exc}", "state": None})
            continue
        completeness = data.get("completeness") or {}
        cost, unpriced = _cost_of(data.get("usage"))
        rows.append(
            {
                "run": folder.name,
                "kind": data.get("kind"),
                "query": data.get("query"),
                "rows": completeness.get("rows"),
                "missing_cells": completeness.get("missing_cells"),
                "cost_usd": cost,
                "unpriced_models": unpriced,
                "wall_s": _wall_s(data.get("timings")),
                "status": data.get("status"),
                "state": data.get("state"),
                **({"progress": data["progress"]} if "progress" in data else {}),
            }
        )
    return [r for r in rows if state is None or r["state"] == state]


def _wall_s(timings: object) -> float | None:
    """A run's wall time from its recorded `timings` (None when it has none yet or it is not a number)."""
    wall = timings.get("wall_s") if isinstance(timings, dict) else None
    return float(wall) if isinstance(wall, int | float) and not isinstance(wall, bool) else None
