"""The engine's events, one per thing that happened in a run, and the channels that subscribe to them.

`MapReduceEngine` emits each of these once, on its `events` stream (`amapreduce.events`):

| event | when | trace line | progress (`ProgressEvent.kind`) | journal | OpenTelemetry |
|---|---|---|---|---|---|
| `EngineRunStarted` | a run begins | `run_start` | | | |
| `PhaseStarted` | the map or a patch round begins | | `phase` | | |
| `PatchRound` | a patch round is planned | `patch_round` | | | |
| `AttemptStarted` | an attempt got a slot and starts | | | | (its span opens) |
| `AttemptSettled` | an attempt's reply (or error) is merged | `attempt` | `attempt` | `batch_attempt` | batch span event |
| `BackupStarted` | a straggler gets a backup attempt | `backup_start` | `backup` | | |
| `BatchDone` | a batch needs no further attempt | | `batch_done` | | batch span ends |
| `WorkersChanged` | the adapted limit of attempts in flight changed (`--workers auto`) | `workers` | | | |
| `EngineRunEnded` | the run ends (finished or stopped) | `run_end` | | | |

The subscribers: `events.trace_channel` (every event with a `trace_event`), `progress_channel` (a
`ProgressSink`), and, per run, `journal_channel` (the run's `ExecutionCheckpoint`: an attempt is on
disk before its batch counts as done, since handlers run before `emit` returns) and
`telemetry_channel` (the phase's batch spans).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from amapreduce.events import Event, EventStream
from amapreduce.mapreduce.checkpoint import BatchAttempt, ExecutionCheckpoint, MergedRow
from amapreduce.mapreduce.result import AttemptRecord
from amapreduce.progress import ProgressEvent, ProgressSink

if TYPE_CHECKING:
    from amapreduce import telemetry

__all__ = [
    "AttemptSettled",
    "AttemptStarted",
    "BackupStarted",
    "BatchDone",
    "PatchRound",
    "PhaseStarted",
    "WorkersChanged",
    "EngineRunEnded",
    "EngineRunStarted",
    "journal_channel",
    "progress_channel",
    "telemetry_channel",
]


@dataclass(frozen=True, kw_only=True)
class EngineRunStarted(Event):
    """A run begins: its tasks, batching strategy and batches (their manifests)."""

    trace_event: ClassVar[str | None] = "run_start"
    num_rows: int
    strategy: str
    batches: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class PhaseStarted(Event):
    """The map (`map`) or a patch round (`patch1`, ...) begins; `done` of its `total` batches are
    already done (a resumed run's)."""

    phase: str
    done: int
    total: int


@dataclass(frozen=True, kw_only=True)
class PatchRound(Event):
    """Patch round `round` is planned: its batches (manifests) ask only for what is still missing."""

    trace_event: ClassVar[str | None] = "patch_round"
    round: int
    batches: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, kw_only=True)
class AttemptStarted(Event):
    """An attempt got one of the `workers` slots and calls its sub-agent (on the worker's thread)."""

    batch_id: str
    phase: str
    attempt: int
    backup: bool = False


@dataclass(frozen=True, kw_only=True)
class AttemptSettled(Event):
    """An attempt finished and was merged (or superseded by its rival): the one report of it."""

    trace_event: ClassVar[str | None] = "attempt"
    record: AttemptRecord
    """What the run's summary counts (outcome, rows, usage, ...)."""
    merged: tuple[MergedRow, ...] = ()
    """The rows it merged, in merge order (what the journal replays)."""
    done: bool = False
    """Its batch needs no further attempt (nothing missing, or its attempts are spent)."""
    prompt: str | None = None
    raw_output: str | None = None
    parsed_rows: tuple[Mapping[str, Any], ...] = ()
    """The reply's rows as parsed, with their task and source (only when the trace is written)."""
    subagent: Mapping[str, Any] | None = None
    """The sub-agent's own trace (steps, tool calls)."""

    def trace_fields(self) -> dict[str, Any]:
        r = self.record
        return {
            "batch_id": r.batch_id, "phase": r.phase, "attempt": r.attempt, "outcome": r.outcome, "prompt": self.prompt,
            "raw_output": self.raw_output, "parsed_rows": [dict(p) for p in self.parsed_rows],
            "dropped_rows": r.dropped_rows, "error": r.error, "elapsed_s": r.elapsed_s, "usage": r.usage.to_json(),
            "subagent": None if self.subagent is None else dict(self.subagent), "backup": r.backup,
        }


@dataclass(frozen=True, kw_only=True)
class BackupStarted(Event):
    """A straggler (running `running_s`, past `threshold_s`) gets a backup attempt on a fresh sub-agent."""

    trace_event: ClassVar[str | None] = "backup_start"
    batch_id: str
    phase: str
    attempt: int
    running_s: float
    threshold_s: float | None


@dataclass(frozen=True, kw_only=True)
class BatchDone(Event):
    """A batch needs no further attempt; `done` of the phase's `total` batches are done."""

    batch_id: str
    phase: str
    done: int
    total: int
    attempts: int


@dataclass(frozen=True, kw_only=True)
class WorkersChanged(Event):
    """The adapted limit of attempts in flight changed (`mapreduce.concurrency.AdaptiveWorkers`)."""

    trace_event: ClassVar[str | None] = "workers"
    workers: int
    previous: int
    why: str


@dataclass(frozen=True, kw_only=True)
class EngineRunEnded(Event):
    """The run ended: its summary (`RunSummary.to_json`) and status label."""

    trace_event: ClassVar[str | None] = "run_end"
    summary: Mapping[str, Any] = field(default_factory=dict)
    cancelled: bool = False
    status: str = ""


# -- the channels ------------------------------------------------------------------------------


def progress_channel(stream: EventStream, sink: ProgressSink) -> None:
    """Report the engine's progress to `sink` as `ProgressEvent`s (`phase`, `attempt`, `backup`, `batch_done`)."""

    def phase(e: PhaseStarted) -> None:
        sink(ProgressEvent(kind="phase", phase=e.phase, done=e.done, total=e.total))

    def attempt(e: AttemptSettled) -> None:
        r = e.record
        data = {"batch_id": r.batch_id, "attempt": r.attempt, "outcome": r.outcome, **({"backup": True} if r.backup else {})}
        sink(ProgressEvent(kind="attempt", phase=r.phase, done=0, total=0, data=data))

    def backup(e: BackupStarted) -> None:
        sink(ProgressEvent(kind="backup", phase=e.phase, done=0, total=0, data={"batch_id": e.batch_id, "attempt": e.attempt}))

    def batch_done(e: BatchDone) -> None:
        sink(ProgressEvent(kind="batch_done", phase=e.phase, done=e.done, total=e.total, data={"batch_id": e.batch_id}))

    stream.subscribe(PhaseStarted, phase)
    stream.subscribe(AttemptSettled, attempt)
    stream.subscribe(BackupStarted, backup)
    stream.subscribe(BatchDone, batch_done)


def journal_channel(stream: EventStream, execution: ExecutionCheckpoint) -> None:
    """Journal every settled attempt of one execution (`batch_attempt`), before its batch counts as done."""

    def record(e: AttemptSettled) -> None:
        r = e.record
        execution.record(BatchAttempt(
            execution=execution.number, batch_id=r.batch_id, phase=r.phase, attempt=r.attempt, outcome=r.outcome,
            done=e.done, rows=e.merged, parsed_rows=r.rows, dropped_rows=r.dropped_rows, error=r.error,
            elapsed_s=r.elapsed_s, usage=r.usage, backup=r.backup,
        ))

    stream.subscribe(AttemptSettled, record)


def telemetry_channel(stream: EventStream, batches: telemetry.SpanGroup) -> None:
    """One span event per settled attempt on its batch's span (`amapreduce.attempt_settled`); the
    span ends when the batch is done."""
    from amapreduce import telemetry

    def settled(e: AttemptSettled) -> None:
        r = e.record
        batches.event(r.batch_id, "amapreduce.attempt_settled",
                      telemetry.ours(attempt=r.attempt, outcome=r.outcome, rows=r.rows, error=r.error))

    def done(e: BatchDone) -> None:
        batches.end(e.batch_id, telemetry.ours(attempts=e.attempts, status="done"))

    stream.subscribe(AttemptSettled, settled)
    stream.subscribe(BatchDone, done)
