"""The lifecycle every run command shares: open a run directory, record how the run ended, close it.

Why one place: `ask` (and the demo, which runs `ask`) and `mapreduce run` must leave the same
record. Each run gets a fresh `runs/<timestamp>-<slug>/` and a usage meter; a run that finishes
writes `table.md`, `table.csv` and `result.json` with one shape of `timings`; a run that raises
before that still writes `result.json` (status `failed`, or `stopped: interrupted` for Ctrl-C:
`RunEnding.label`) with the error, because a run directory without one is invisible to `runs list` and says nothing
about what went wrong. Every run directory also gets a journal (`session.journal`): how the run
started, the engine's checkpoints (`ActiveRun.checkpoint`) and how it ended, so that a killed run
can be resumed in place (`resume_run`). Every key the settings know is registered for redaction
by value before anything is written (`trace.register_secrets`), so an echoed key is masked in
`result.json`, the trace and the journal's error texts. With `settings.otel` (`--otel`,
`AMAPREDUCE_OTEL`), OpenTelemetry tracing is turned on (`telemetry.enable`) before anything is
made, and the run is one span (`amapreduce.run`, the root of the run's one trace) around
everything it does. A run's `session.Session` opens and finishes it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from amapreduce import telemetry
from amapreduce.agents.tool_calls import tool_trace
from amapreduce.errors import StorageError, is_storage_fault, storage_error
from amapreduce.events import Event, EventStream, trace_channel
from amapreduce.llm.factory import RoleModels
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.checkpoint import BatchAttempt, Checkpoint
from amapreduce.mapreduce.result import Completeness, RunEnding, RunStatus, completeness_record
from amapreduce.session.journal import (
    ChunkFinished,
    RunEnded,
    RunJournal,
    RunKind,
    RunStarted,
    open_run_journal,
)
from amapreduce.session.record import RunRecord
from amapreduce.session.rundir import RunDir
from amapreduce.table.render import to_csv, to_markdown
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from amapreduce.journal import JournalWriter
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.settings import Settings
    from amapreduce.table.table import Table

__all__ = ["ActiveRun", "RunFinished", "resume_run", "run_timings", "start_run"]


def run_timings(started: float, executions: Sequence[Mapping[str, float]] = ()) -> dict[str, Any]:
    """The `timings` object of every `result.json`: one shape for `ask`, `demo` and `mapreduce run`.

    `wall_s` is the whole run (setup, manager, every execution, writing the table) measured from
    `started` (a `time.perf_counter()` value); `executions` holds each engine execution's own
    `map_s` / `patch_s` / `wall_s`, in order.
    """
    return {
        "wall_s": round(max(time.perf_counter() - started, 0.0), 6),
        "executions": [dict(t) for t in executions],
    }


@dataclass(frozen=True, kw_only=True)
class RunFinished(Event):
    """A run ended and its `result.json` is written: emitted once, after the record is on disk. Its
    subscribers (`ActiveRun.events`): the run's journal (`RunEnded`; from then the run is finished),
    the trace (`run_finished`) and the run's OpenTelemetry span (status, rows, tokens, cost)."""

    trace_event: ClassVar[str | None] = "run_finished"
    ending: RunEnding
    usage: Mapping[str, Any]
    rows: int = 0
    error: str | None = None
    """Why it failed (a `failed` run's error; `interrupted` for Ctrl-C)."""
    output: str | None = None
    """The table as markdown (the span's output)."""

    def trace_fields(self) -> dict[str, Any]:
        return {"status": self.ending.label, **({"error": self.error} if self.error is not None else {}),
                "usage": dict(self.usage)}


@dataclass(kw_only=True)
class ActiveRun:
    """A run in progress: its directory, its usage meter, and what `result.json` records it as."""

    kind: RunKind
    """What made the run: the `kind` of `result.json`."""
    query: str
    """The question (or the decision file's name): the `query` of `result.json`."""
    run_dir: RunDir
    meter: UsageMeter
    """Usage and cost of the run, by role."""
    started: float
    """When the run (or this resume of it) started (`time.perf_counter()`), for `timings.wall_s`."""
    journal: JournalWriter
    checkpoint: Checkpoint
    """The engine's view of the journal: pass it to every `MapReduceEngine.run` of the run."""
    finished: bool = False
    """`finish` (or `record_failure`) wrote `result.json`."""
    span: telemetry.SpanHandle = telemetry.NO_SPAN
    """The run's OpenTelemetry span (`NO_SPAN` while tracing is off): how it ended is set on it."""
    events: EventStream = field(default_factory=EventStream)
    """The run's own events (`RunFinished`); the journal, the trace and the span subscribe here."""

    def __post_init__(self) -> None:
        def journaled(event: RunFinished) -> None:
            self.journal.append(RunEnded.of(event.ending))
            self.finished = True

        def on_span(event: RunFinished) -> None:
            if event.output is not None:
                self.span.set({telemetry.OUTPUT_VALUE: event.output})
            _mark_ending(self.span, event.ending, self.meter, event.rows)

        self.events.subscribe(RunFinished, journaled)
        trace_channel(self.events, self.run_dir.trace)
        self.events.subscribe(RunFinished, on_span)

    def finish(
        self,
        table: Table,
        completeness: Mapping[str, Any],
        *,
        ending: RunEnding,
        executions: Sequence[Mapping[str, float]] = (),
        extra: dict[str, Any] | None = None,
    ) -> RunRecord:
        """Write `table.md`, `table.csv` and `result.json`; return the record.

        `completeness` is the run's `completeness_record`; `ending` its status (`result.json`'s
        `status` is its `label`);
        `executions` holds each engine execution's timings (see `run_timings`); `extra` adds
        command-specific fields (the decision, the manager's answer, web usage).
        """
        markdown = to_markdown(table)
        self.run_dir.write_table(markdown, to_csv(table))
        record = RunRecord.of({
            "kind": self.kind,
            "query": self.query,
            "status": ending.label,
            **({"error": ending.error} if ending.error else {}),
            "completeness": dict(completeness),
            "table": table.to_json(),
            "usage": self.meter.to_json(),
            **(extra or {}),
            "timings": run_timings(self.started, executions),
        })
        self.run_dir.write_result(record)
        self.events.emit(RunFinished(ending=ending, usage=self.meter.to_json(), rows=len(table), output=markdown))
        return record

    def record_failure(self, exc: BaseException) -> None:
        """Write a `failed` (or `stopped: interrupted`) `result.json` for `exc`, unless `finish` wrote one.

        A failure to record the failure (disk full ...) must not hide `exc`: it rides along as a note.
        """
        if self.finished:
            return
        interrupted = isinstance(exc, KeyboardInterrupt)
        error = "interrupted" if interrupted else (redact_secrets(str(exc)) or type(exc).__name__)
        ending = RunEnding(RunStatus.INTERRUPTED if interrupted else RunStatus.FAILED, error)
        status = ending.label
        try:
            self.run_dir.write_result(RunRecord.of({
                "kind": self.kind,
                "query": self.query,
                "status": status,
                "error": error,
                "error_type": type(exc).__name__,
                "completeness": completeness_record(Completeness.nothing(), ()),
                "usage": self.meter.to_json(),
                "timings": run_timings(self.started),
            }))
            self.events.emit(RunFinished(ending=ending, usage=self.meter.to_json(), error=error))
        except Exception as record_exc:
            exc.add_note(
                f"(also: could not write the failed result.json in {self.run_dir.path}: {record_exc})"
            )


@contextlib.contextmanager
def start_run(settings: Settings, *, kind: RunKind, query: str, meter: UsageMeter, task_id: str | None = None,
              trial: int | None = None) -> Iterator[ActiveRun]:
    """Open a run: a new run directory under `settings.runs_dir`, named after `query`, metered by
    `meter`; on the way out, close the directory. `task_id` and `trial` (an evaluation's) label its span.

    If the body raises before `ActiveRun.finish` wrote `result.json`, a `failed` one is written
    (see `ActiveRun.record_failure`) and the exception is re-raised.
    """
    started = time.perf_counter()
    try:
        run_dir = RunDir.create(settings.runs_dir, query)
    except OSError as exc:
        raise storage_error(exc, then="no run was started") from exc
    try:
        journal = open_run_journal(run_dir.path)
        journal.append(RunStarted.now(command=kind, query=query, settings=settings))
    except (OSError, StorageError) as exc:
        run_dir.close()
        _remove_if_empty(run_dir.path)
        raise _with_next_step(exc, "run the command again (no run was started)", run_dir.path) from exc
    run = ActiveRun(
        kind=kind, query=query, run_dir=run_dir, meter=meter, started=started, journal=journal,
        checkpoint=Checkpoint(journal),
    )
    with _recorded(run, resumed=False, labels=telemetry.ours(task_id=task_id, trial=trial)):
        yield run


@contextlib.contextmanager
def resume_run(path: Path, saved: RunJournal, settings: Settings, *, meter: UsageMeter,
               roles: RoleModels | None = None) -> Iterator[ActiveRun]:
    """Go on with the interrupted run in `path`, whose journal says `saved`: the same directory,
    the same journal (a new `RunStarted`, `resumed: true`), a checkpoint over the saved entries,
    and `meter` charged first with the usage the journal recorded (`_saved_usage`), each role's at
    its model (`roles`: the run's, resolved once by its `ModelFactory`). Ends as `start_run`.
    """
    started = time.perf_counter()
    models = roles if roles is not None else RoleModels.of(settings)
    for role, usage in _saved_usage(saved).items():
        meter.record(role, models.get(role) or "", usage)
    kind, query = saved.first.command, saved.first.query
    journal = open_run_journal(path)
    journal.append(RunStarted.now(command=kind, query=query, settings=settings, resumed=True))
    run = ActiveRun(
        kind=kind, query=query, run_dir=RunDir(path), meter=meter, started=started, journal=journal,
        checkpoint=Checkpoint(journal, saved.entries),
    )
    with _recorded(run, resumed=True):
        yield run


def _saved_usage(saved: RunJournal) -> dict[str, Usage]:
    """What the journaled work spent, by role: a wide run's finished chunks as they recorded it
    (`ChunkFinished`, every role), every other settled attempt as the sub-agents' usage."""
    chunks = [e for e in saved.entries if isinstance(e, ChunkFinished)]
    counted = {c.execution for c in chunks}
    spent: dict[str, Usage] = {}
    for role, usage in [(r, u) for c in chunks for r, u in c.usage.items()] + [
            ("subagent", e.usage) for e in saved.entries if isinstance(e, BatchAttempt) and e.execution not in counted]:
        spent[role] = spent.get(role, Usage()) + usage
    return {role: usage for role, usage in spent.items() if usage.requests}


@contextlib.contextmanager
def _recorded(run: ActiveRun, *, resumed: bool, labels: Mapping[str, object] | None = None) -> Iterator[ActiveRun]:
    """Record a failure of the body in `result.json` and the journal; close the run's files. All
    of it inside the run's span, whose session is the run directory (a resume is a new trace of
    the same session)."""
    hidden = telemetry.hides_inputs()  # the folder's name is a slug of the question
    shown = {telemetry.INPUT_VALUE: run.query,
             telemetry.SESSION_ID: run.run_dir.opaque_name if hidden else run.run_dir.path.name,
             **telemetry.ours(kind=run.kind, run_dir=None if hidden else str(run.run_dir.path), resumed=resumed),
             **(labels or {})}
    with telemetry.span("amapreduce.run", shown) as run.span, tool_trace(run.run_dir.trace):
        try:
            yield run
        except Exception as exc:
            if not (isinstance(exc, StorageError) or is_storage_fault(exc)):
                run.record_failure(exc)
                raise
            # A full or failing disk: one line naming the file and how to go on, written into
            # `result.json` when it can be; the journal keeps every settled batch for the resume.
            failed = _storage_failure(exc, run)
            run.record_failure(failed)
            raise failed from exc
        except KeyboardInterrupt as exc:
            run.record_failure(exc)
            raise
        finally:
            run.journal.close()
            run.run_dir.close()


def _storage_failure(exc: Exception, run: ActiveRun) -> StorageError:
    """The `StorageError` that ends `run` (`exc` is one, or an `OSError` of the disk): what the
    machine refused, and how to finish the run once that is fixed."""
    where = str(run.run_dir.path)
    if run.kind in (RunKind.ASK, RunKind.MAPREDUCE_RUN):
        then = f"finish the run kept in {where!r} with `amapreduce runs resume {where}`"
    elif run.kind is RunKind.EVAL:
        then = "continue the evaluation with `amapreduce eval run --resume DIR`"
    else:
        then = "run the command again"
    return _with_next_step(exc, then, run.run_dir.path)


def _with_next_step(exc: Exception, then: str, folder: Path) -> StorageError:
    """`exc` (a `StorageError`, or an `OSError` of the disk) as a `StorageError` that ends with `then`:
    what to do once the disk is fixed. An error that names no file names `folder`."""
    if isinstance(exc, StorageError):
        if exc.errno is None:
            return StorageError(f"{exc.message} Then {then}.", **exc.fields)
        exc = OSError(exc.errno, os.strerror(exc.errno), exc.path)
    if not isinstance(exc, OSError):
        raise TypeError(f"not a storage fault: {exc!r}") from exc
    return storage_error(exc, path=exc.filename if exc.filename is not None else folder, then=then)


def _remove_if_empty(folder: Path) -> None:
    """Remove a run folder that holds nothing but an empty trace (its journal could not be created):
    a run that never started leaves no folder that `runs list` would have to explain."""
    trace = folder / "trace.jsonl"
    if trace.is_file() and trace.stat().st_size == 0:
        trace.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _mark_ending(span: telemetry.SpanHandle, ending: RunEnding, meter: UsageMeter, rows: int) -> None:
    """Set how a run ended on its span: status, error, rows, tokens and cost; a failed or
    interrupted run also sets the span's status to ERROR (it ended without raising)."""
    total = meter.total()
    span.set(telemetry.ours(status=ending.label, error=ending.error, rows=rows, requests=total.requests,
                            tokens=total.total_tokens, cost_usd=meter.cost_usd(),  # None (absent): unpriced
                            unpriced_models=meter.unpriced() or None))
    if ending.status in (RunStatus.FAILED, RunStatus.INTERRUPTED):
        span.error(ending.label if ending.error is None else f"{ending.label}: {ending.error}")
