"""One typed event per thing that happened (issue 36, part 3): the engine emits each settled attempt
once, and the trace, the progress line, the journal and OpenTelemetry are subscribers of that one
emission, not calls of their own."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from solvers import WorldSolver, world, world_decision

from amapreduce.decision import Decision
from amapreduce.events import Event, EventStream
from amapreduce.journal import JournalEntry
from amapreduce.mapreduce.batching import plan_batches
from amapreduce.mapreduce.checkpoint import BatchAttempt, Checkpoint
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.events import (
    AttemptSettled,
    AttemptStarted,
    BatchDone,
    EngineRunEnded,
    EngineRunStarted,
    PhaseStarted,
    journal_channel,
)
from amapreduce.progress import ProgressEvent
from amapreduce.trace import TraceWriter, read_trace


class ListSink:
    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def append(self, entry: JournalEntry) -> None:
        self.entries.append(entry)


class Counting(EventStream):
    """An engine's stream that counts every emission, by the event's identity."""

    def __init__(self) -> None:
        super().__init__()
        self.emitted: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self._lock:
            self.emitted.append(event)
        super().emit(event)


def test_each_settled_attempt_is_emitted_once_and_every_channel_reports_that_one(tmp_path: Path) -> None:
    truth = world(12)
    progress: list[ProgressEvent] = []
    trace = TraceWriter(tmp_path / "trace.jsonl")
    # a quarter of the attempts fail or come back unreadable: retries and patch rounds happen
    engine = MapReduceEngine(WorldSolver(truth, fail_rate=0.25, drop_rate=0.2, seed=3),
                             config=EngineConfig(workers=3, max_attempts=3, patch_rounds=2, max_batches=None),
                             trace=trace, progress=progress.append)
    counting = Counting()
    counting.subscribe(Event, engine.events.emit)  # every emission counted, then handed to the channels
    engine.events = counting
    sink = ListSink()
    result = engine.run(Decision.parse(world_decision(truth, batch_size=2)), checkpoint=Checkpoint(sink))
    trace.close()

    settled = [e for e in counting.emitted if isinstance(e, AttemptSettled)]
    per_attempt = Counter((e.record.batch_id, e.record.phase, e.record.attempt, e.record.backup) for e in settled)
    assert settled and set(per_attempt.values()) == {1}  # each attempt emitted exactly once
    assert len(settled) == len(result.attempts) == result.summary.attempts
    assert any(e.record.attempt > 1 for e in settled), "the run must have retried for the count to mean anything"
    # ... and each channel's report of attempts is that one emission, no more, no fewer
    traced = [line for line in read_trace(tmp_path / "trace.jsonl") if line["event"] == "attempt"]
    assert len(traced) == len(settled)
    assert [e for e in progress if e.kind == "attempt"] and len([e for e in progress if e.kind == "attempt"]) == len(settled)
    journaled = [e for e in sink.entries if isinstance(e, BatchAttempt)]
    assert [(j.batch_id, j.attempt, j.outcome, j.rows) for j in journaled] == [
        (e.record.batch_id, e.record.attempt, e.record.outcome, e.merged) for e in settled]
    # every trace line of the run is an emitted event's: the engine writes nothing to the trace itself
    lines = Counter(line["event"] for line in read_trace(tmp_path / "trace.jsonl"))
    assert lines == Counter(e.trace_event for e in counting.emitted if e.trace_event is not None)
    assert lines["run_start"] == lines["run_end"] == 1
    kinds = Counter(type(e) for e in counting.emitted)
    assert kinds[EngineRunStarted] == kinds[EngineRunEnded] == 1
    assert kinds[AttemptStarted] == len(settled)  # every settled attempt started once (no backups here)
    assert kinds[BatchDone] == result.summary.batches
    assert kinds[PhaseStarted] == 1 + result.summary.patch_rounds


def test_a_subscriber_sees_its_type_and_its_subclasses_and_can_leave() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Ping(Event):
        n: int

    @dataclass(frozen=True, kw_only=True)
    class LoudPing(Ping):
        pass

    stream = EventStream()
    pings: list[int] = []
    every: list[Event] = []
    leave = stream.subscribe(Ping, lambda e: pings.append(e.n))
    stream.subscribe(Event, every.append)
    stream.emit(Ping(n=1))
    stream.emit(LoudPing(n=2))
    leave()
    stream.emit(Ping(n=3))
    assert pings == [1, 2] and [e.n for e in every if isinstance(e, Ping)] == [1, 2, 3]
    child = stream.scoped()
    mine: list[Event] = []
    child.subscribe(Event, mine.append)
    stream.emit(Ping(n=4))  # the parent's event does not reach the child
    child.emit(Ping(n=5))  # the child's reaches both
    assert [e.n for e in mine if isinstance(e, Ping)] == [5]
    assert [e.n for e in every if isinstance(e, Ping)][-2:] == [4, 5]


def test_a_subscriber_that_raises_reaches_the_emitter() -> None:
    """A journal that cannot write must stop the run, not be swallowed by the stream."""
    stream = EventStream()

    def broken(event: Event) -> None:
        raise OSError(28, "No space left on device")

    stream.subscribe(Event, broken)
    with pytest.raises(OSError, match="No space"):
        stream.emit(EngineRunEnded(status="complete"))


def test_two_runs_on_one_engine_each_journal_only_their_own_attempts() -> None:
    """A run's journal subscribes to the run's own scope of the engine's stream."""
    first, second = world(6), {f"F{i}": {"name": f"F{i}", "capital": f"Town{i}", "population": str(i)} for i in range(6)}
    engine = MapReduceEngine(WorldSolver({**first, **second}, sleep=(0.001, 0.003)),
                             config=EngineConfig(workers=4, patch_rounds=0, max_batches=None))
    sinks = ListSink(), ListSink()
    every: list[AttemptSettled] = []
    engine.events.subscribe(AttemptSettled, every.append)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(engine.run, Decision.parse(world_decision(truth)), checkpoint=Checkpoint(sink))
                for truth, sink in zip((first, second), sinks, strict=True)]
        results = [r.result(60) for r in runs]
    for truth, result, sink in zip((first, second), results, sinks, strict=True):
        journaled = [e for e in sink.entries if isinstance(e, BatchAttempt)]
        assert len(journaled) == len(result.attempts)
        names = {row.values["name"] for entry in journaled for row in entry.rows}
        assert names == set(truth)  # this run's entities only
    assert len(every) == sum(len(r.attempts) for r in results)  # the engine's own subscribers see both


def test_the_journal_channel_writes_the_attempt_as_the_journal_holds_it() -> None:
    from amapreduce.mapreduce.result import AttemptRecord

    sink = ListSink()
    decision = Decision.parse(world_decision(world(1)))
    execution = Checkpoint(sink).begin(decision, plan_batches(decision))
    stream = EventStream()
    journal_channel(stream, execution)
    record = AttemptRecord(batch_id="batch-001", phase="map", attempt=2, outcome="ok", elapsed_s=0.5, rows=1)
    stream.emit(AttemptSettled(record=record, done=True))
    (entry,) = [e for e in sink.entries if isinstance(e, BatchAttempt)]
    assert (entry.batch_id, entry.attempt, entry.outcome, entry.done, entry.parsed_rows) == ("batch-001", 2, "ok", True, 1)
    assert entry.execution == execution.number
