"""A run directory's journal (`journal.jsonl`): the run-level entries, and what they say about a run.

Why: `result.json` is written when a run ends, so a run killed with `kill -9` (or a crashed
machine) used to leave nothing a resume could use and looked like a run still going. The journal
(`amapreduce.journal`, one format for runs and evaluations) is written as the run goes: a
`RunStarted` entry (what was asked, the settings that matter to rerun it — never a secret — and
which process runs it), the engine's entries (`mapreduce.checkpoint`: each execution's decision
and plan, each settled batch attempt with its merged rows), and a `RunEnded` entry. A resume
appends a new `RunStarted` (`resumed: true`) and goes on in the same directory.

A wide run on Ray (`cluster.wide`) journals a `WideStarted` (the whole decision, its plan and how
it is cut into chunks); then, as each chunk comes back to the driver, the chunk's own engine
entries (its sub-decision as execution `chunk + 1`, its settled attempts: the same entries a local
run writes) and, if it ran to its end, a `ChunkFinished`. A resume replays the finished chunks and
runs the rest, a chunk with attempts but no `ChunkFinished` (stopped by the budget) going on
from its last settled attempt.

A run whose journal has no `RunEnded` after its last `RunStarted` is `running` while that
process lives and `interrupted` once it is gone; the process is told by pid, host and its start
time (so a reused pid is not mistaken for the run).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from amapreduce.errors import UserError
from amapreduce.journal import JournalEntry, JournalWriter, read_journal
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.checkpoint import ENGINE_ENTRIES, BatchAttempt, ExecutionStarted
from amapreduce.mapreduce.result import RunEnding, RunStatus
from amapreduce.progress import ProgressEvent
from amapreduce.settings import Settings

__all__ = [
    "JOURNAL_KIND",
    "JOURNAL_NAME",
    "RERUN_SETTINGS",
    "RUN_ENTRIES",
    "ChunkFinished",
    "ProcessRef",
    "RunEnded",
    "RunJournal",
    "RunKind",
    "RunStarted",
    "WideStarted",
    "open_run_journal",
    "read_run_journal",
]

JOURNAL_NAME = "journal.jsonl"
JOURNAL_KIND = "run"

RERUN_SETTINGS: tuple[str, ...] = (
    "model", "subagent_model", "extraction_model", "memory_model", "api_base", "search_backend", "searxng_url",
    "mcp", "mcp_manager",
    "workers", "workers_auto", "max_attempts", "batch_timeout_s", "patch_rounds", "max_batches", "subagent_max_steps",
    "manager_max_steps", "max_tool_calls", "max_cost_usd", "max_tokens", "model_rpm", "model_tpm", "prices_file",
    "retry_max_retries", "retry_base_delay_s", "retry_max_delay_s", "allow_private_urls", "allowed_domains",
    "denied_domains", "crawl_max_chars", "allow_web_crawl", "model_timeout_s", "endpoint_probe", "message_content",
    "tool_choice", "structured_output", "solver", "context_window",
)
"""The settings a run journals so that a resume runs as the run did. No secret is among them
(API keys come from the environment again); values left at their defaults are not journaled, so
the resume takes the same defaults."""


class ProcessRef(BaseModel):
    """Which process runs the run: enough to tell it from a later process with the same pid."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int
    host: str
    start_ticks: int | None
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat`); None where unknown."""

    @classmethod
    def current(cls) -> ProcessRef:
        """This process."""
        return cls(pid=os.getpid(), host=socket.gethostname(), start_ticks=_start_ticks(os.getpid()))

    def alive(self) -> bool:
        """True while the process lives (a process on another host is taken as alive: it cannot be checked)."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # it exists, owned by someone else
        now = _start_ticks(self.pid)
        if now is None:
            return _proc_stat(self.pid) is None  # no /proc here: the pid exists, believe it; a zombie is dead
        return self.start_ticks is None or now == self.start_ticks


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state first), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def _start_ticks(pid: int) -> int | None:
    """The process's start time (field 22 of `/proc/<pid>/stat`); None if unknown or a zombie."""
    fields = _proc_stat(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class RunKind(StrEnum):
    """What made a run: the `kind` of its `result.json`, the `command` of its journal, the `kind`
    column of `runs list`.

    `demo` and `eval` runs are `ask` runs (the manager, the mapreduce tool, a prior) started by
    `amapreduce demo` and by an `eval run` trial: `memory learn` takes all three, `runs resume`
    finishes `ask`, `mapreduce_run` and `enrich` runs (a demo is rerun, an evaluation resumed with
    `eval run --resume`). An `enrich` run is a `mapreduce_run` whose decision was made from a
    user's list, with a plan stage (the memory's prior) before it.
    """

    ASK = "ask"
    MAPREDUCE_RUN = "mapreduce_run"
    DEMO = "demo"
    EVAL = "eval"
    ENRICH = "enrich"
    """`amapreduce enrich`: a user's list enriched by one decision made from its rows (no manager)."""

    @property
    def is_ask(self) -> bool:
        """True for the runs of the `ask` lifecycle (`ask`, `demo`, `eval`)."""
        return self in (RunKind.ASK, RunKind.DEMO, RunKind.EVAL)


class RunStarted(JournalEntry):
    """A run (or a resume of it) began."""

    type: Literal["run_start"] = "run_start"
    command: RunKind
    """What made the run (the `kind` of `result.json`)."""
    query: str
    settings: dict[str, Any]
    """The `RERUN_SETTINGS` the run set (JSON values)."""
    process: ProcessRef
    resumed: bool = False

    @classmethod
    def now(cls, *, command: RunKind, query: str, settings: Settings, resumed: bool = False) -> RunStarted:
        """The entry for a run of `command` starting in this process with `settings`."""
        chosen = {name for name in RERUN_SETTINGS if name in settings.model_fields_set}
        return cls(
            command=command, query=query, settings=settings.model_dump(mode="json", include=chosen),
            process=ProcessRef.current(), resumed=resumed,
        )


class RunEnded(JournalEntry):
    """The run ended and wrote `result.json`."""

    type: Literal["run_end"] = "run_end"
    status: RunStatus
    label: str
    """The `status` string of `result.json`."""

    @classmethod
    def of(cls, ending: RunEnding) -> RunEnded:
        """The entry for a run that ended with `ending`."""
        return cls(status=ending.status, label=ending.label)


class WideStarted(JournalEntry):
    """A wide run began on Ray: its whole decision and plan, cut into chunks of `chunk_batches`."""

    type: Literal["wide_run"] = "wide_run"
    decision: dict[str, Any]
    """The validated decision as JSON (`Decision.model_dump(mode="json")`)."""
    plan: dict[str, Any]
    """Its whole batch plan (`checkpoint.plan_manifest`)."""
    chunk_batches: int
    """Batches per chunk: a resume cuts the plan the same way, whatever `--workers` it is given."""
    address: str | None = None
    """The Ray cluster it ran on (None: a local Ray instance)."""


class ChunkFinished(JournalEntry):
    """A wide run's chunk ran to its end; its rows are its execution's journaled attempts."""

    type: Literal["chunk_done"] = "chunk_done"
    chunk: int
    execution: int
    """The chunk's execution number in the journal (`chunk + 1`)."""
    usage: dict[str, Usage] = {}
    """What the chunk spent, by role."""


RUN_ENTRIES: tuple[type[JournalEntry], ...] = (RunStarted, RunEnded, WideStarted, ChunkFinished, *ENGINE_ENTRIES)


def open_run_journal(run_dir: Path) -> JournalWriter:
    """The journal of the run directory `run_dir`, opened for appending (created if new)."""
    return JournalWriter(run_dir / JOURNAL_NAME, kind=JOURNAL_KIND)


@dataclass(frozen=True, kw_only=True)
class RunJournal:
    """What a run directory's journal says."""

    started: RunStarted
    """The last start (the first run, or its latest resume)."""
    first: RunStarted
    """The run's first start (its settings are the run's)."""
    ended: RunEnded | None
    """The end of the last start; None while it runs or when its process died."""
    entries: tuple[JournalEntry, ...]

    @property
    def finished(self) -> bool:
        """The run ended complete or incomplete: nothing is left to resume."""
        return self.ended is not None and not self.ended.status.ended_early

    def status(self) -> str:
        """`running`, `interrupted` (no end, process gone), or the `RunStatus` value of its end."""
        if self.ended is not None:
            return self.ended.status.value
        return "running" if self.started.process.alive() else RunStatus.INTERRUPTED.value

    @property
    def executions(self) -> list[ExecutionStarted]:
        """The engine executions the run began (their decisions and batch plans), in order."""
        return [e for e in self.entries if isinstance(e, ExecutionStarted)]

    @property
    def wide(self) -> WideStarted | None:
        """The run's `WideStarted` when it is a wide run on Ray."""
        return next((e for e in self.entries if isinstance(e, WideStarted)), None)

    def progress(self) -> ProgressEvent:
        """Map batches done so far over every execution (of a wide run: out of its whole plan, since
        its chunks' executions are journaled only as they come back), and the patch batches done
        (`data["patch_batches_done"]`)."""
        executions = self.executions
        done = {(a.execution, a.phase, a.batch_id) for a in self.entries if isinstance(a, BatchAttempt) and a.done}
        wide = self.wide
        return ProgressEvent(
            kind="journaled", phase="map", done=sum(1 for _, phase, _ in done if phase == "map"),
            total=len(wide.plan["batches"]) if wide is not None else sum(len(e.plan["batches"]) for e in executions),
            data={"patch_batches_done": sum(1 for _, phase, _ in done if phase != "map")},
        )


def read_run_journal(run_dir: Path) -> RunJournal | None:
    """The journal of `run_dir`, or None when it has none (a run of an older amapreduce).

    Raises:
        UserError: the journal is damaged or holds no `RunStarted` entry.
    """
    path = run_dir / JOURNAL_NAME
    if not path.is_file():
        return None
    _, entries = read_journal(path, RUN_ENTRIES, kind=JOURNAL_KIND)
    starts = [(k, e) for k, e in enumerate(entries) if isinstance(e, RunStarted)]
    if not starts:
        raise UserError(f"journal {str(path)!r} holds no run_start entry; the run cannot be read or resumed.")
    last_at, last = starts[-1]
    ends = [e for e in entries[last_at:] if isinstance(e, RunEnded)]
    return RunJournal(started=last, first=starts[0][1], ended=ends[-1] if ends else None, entries=tuple(entries))
