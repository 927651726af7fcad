"""Backup attempts for stragglers (issue 28): the faster reply wins, the loser is cancelled and
still counted, backups never jump the queue, their cap and gate hold, the journal counts a batch once.

No wall-clock assertions: scripted solvers hold a straggler until the engine cancels it (or a
safety timeout that a correct engine never reaches), so the order of events is fixed.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
from fake_clock import FakeTime
from solvers import WorldSolver, world, world_decision

from amapreduce.breaker import BreakerPolicy, CircuitBreaker
from amapreduce.decision import Decision
from amapreduce.journal import JournalEntry
from amapreduce.llm.meter import Budget, UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.backup import BackupPolicy, Stragglers
from amapreduce.mapreduce.checkpoint import BatchAttempt, Checkpoint
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.result import SUPERSEDED, MapReduceResult
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.progress import ProgressEvent
from amapreduce.ratelimit import WindowLimiter, WindowPolicy
from amapreduce.settings import load_settings
from amapreduce.testing.scripted import FunctionModel, final_answer
from amapreduce.trace import TraceWriter
from amapreduce.ui.timeline import read_timeline

WAIT_S = 30.0  # a safety net against a hang, never reached when the engine is right
TRUTH = world(10)
# A tiny floor: the scripted attempts take milliseconds, a held one is a straggler at once.
EAGER = BackupPolicy(max_extra=1.0, floor_s=0.02)


class Stragglers_:
    """A `WorldSolver` whose first attempt of each batch in `slow` is held until the engine cancels
    it (then it answers late, with nothing useful); every other call answers at once. Counts the
    calls per batch: the second call of a batch's first attempt is its backup."""

    def __init__(self, slow: set[str], *, hold_s: float = WAIT_S, pace: threading.Event | None = None) -> None:
        self.slow = slow
        self.pace = pace
        """When given, batches after the fourth answer only once it is set."""
        self.hold_s = hold_s
        self.calls: Counter[str] = Counter()
        self.copies: Counter[tuple[str, int]] = Counter()
        """Calls per (batch, attempt number): 2 where the attempt got a backup."""
        self.order: list[tuple[str, int]] = []
        self.held: list[BatchRequest] = []
        self.lock = threading.Lock()
        self.world = WorldSolver(TRUTH)

    def solve(self, request: BatchRequest) -> SolverReply:
        with self.lock:
            self.calls[request.batch_id] += 1
            self.copies[request.batch_id, request.attempt] += 1
            call = self.calls[request.batch_id]
            self.order.append((request.batch_id, call))
        if request.batch_id in self.slow and call == 1:
            with self.lock:
                self.held.append(request)
            request.cancel.wait(self.hold_s)
            return SolverReply(output="[]")  # late and empty: a cancelled copy's reply is ignored
        if self.pace is not None and request.batch_id > "batch-004":
            self.pace.wait(WAIT_S)
        return self.world.solve(request)


def run(solver: Any, n: int = 10, *, backup: BackupPolicy = EAGER, workers: int = 2, checkpoint: Checkpoint | None = None,
        **engine: Any) -> tuple[MapReduceResult, list[ProgressEvent]]:
    events: list[ProgressEvent] = []
    truth = dict(list(TRUTH.items())[:n])
    config = EngineConfig(workers=workers, batch_timeout_s=WAIT_S * 2, patch_rounds=0, max_batches=None, backup=backup)
    engine_ = MapReduceEngine(solver, config=config, progress=events.append, **engine)
    result = engine_.run(Decision.parse(world_decision(truth, batch_strategy={"type": "per_atom", "rationale": "r"})),
                         checkpoint=checkpoint)
    return result, events


def assert_every_row_once(result: MapReduceResult, n: int = 10) -> None:
    assert result.summary.complete and not result.table.missing_cells()
    assert [r["name"] for r in result.table.records()] == list(TRUTH)[:n]


def test_a_straggler_gets_a_backup_whose_faster_reply_wins_and_the_loser_is_cancelled() -> None:
    solver = Stragglers_({"batch-001"})
    result, events = run(solver)
    assert_every_row_once(result)
    assert solver.calls["batch-001"] == 2  # the straggler and its one backup
    assert solver.held[0].cancel.is_set()  # the loser was told to send nothing more
    mine = [r for r in result.attempts if r.batch_id == "batch-001"]
    assert [(r.backup, r.outcome) for r in mine] == [(True, "ok"), (False, SUPERSEDED)]
    assert all(r.attempt == 1 for r in mine) and result.summary.retries == 0
    assert result.summary.backups == len([e for e in events if e.kind == "backup"]) >= 1
    # The loser's usage still counts: whatever its calls were charged (the scripted reply came late: none).
    assert result.summary.usage == sum((r.usage for r in result.attempts), Usage())
    assert [e.data for e in events if e.kind == "backup"][0] == {"batch_id": "batch-001", "attempt": 1}


def test_no_backup_starts_while_batches_wait_for_a_slot() -> None:
    pace = threading.Event()
    solver = Stragglers_({"batch-001"}, pace=pace)
    started_then: list[int] = []  # batches started when each backup was decided

    def progress(event: ProgressEvent) -> None:
        if event.kind == "attempt" and event.data["batch_id"] == "batch-004":
            threading.Timer(0.1, pace.set).start()  # batch-001 is a straggler by then; batches still wait
        if event.kind == "backup":
            with solver.lock:
                started_then.append(len(solver.calls))

    # Two threads for three slots: while batch-001 straggles, a slot stays free and batches wait.
    config = EngineConfig(workers=3, threads=2, batch_timeout_s=WAIT_S * 2, patch_rounds=0, max_batches=None, backup=EAGER)
    result = MapReduceEngine(solver, config=config, progress=progress).run(
        Decision.parse(world_decision(TRUTH, batch_strategy={"type": "per_atom", "rationale": "r"})))
    assert_every_row_once(result)
    # batch-001 straggled from the start, but its backup came only once every batch had started.
    assert started_then and all(n == len(TRUTH) for n in started_then)
    firsts = [i for i, (_, call) in enumerate(solver.order) if call == 1]
    backups = [i for i, (_, call) in enumerate(solver.order) if call == 2]
    assert backups and min(backups) > max(firsts)


def test_the_cap_on_extra_calls_holds() -> None:
    slow = {f"batch-{i:03d}" for i in range(4, 11)}  # 7 stragglers, 3 quick batches to measure
    solver = Stragglers_(slow, hold_s=0.5)  # held ones answer [] on their own after a while
    # 10 batches of one call each: 2 extra calls; each cancelled straggler had sent its one call.
    policy = BackupPolicy(max_extra=0.2, floor_s=0.02)
    result, events = run(solver, workers=10, backup=policy)
    backed_up = [key for key, n in solver.copies.items() if n > 1]
    assert len(backed_up) == result.summary.backups == 2
    assert len([e for e in events if e.kind == "backup"]) == 2
    assert sum(1 for r in result.attempts if r.backup) == 2


def test_a_backup_is_not_started_when_the_gate_refuses() -> None:
    asked: list[Usage] = []

    def gate(usage: Usage) -> bool:
        asked.append(usage)
        return False

    solver = Stragglers_({"batch-001"}, hold_s=0.3)
    result, events = run(solver, backup_gate=gate)
    assert asked and solver.copies["batch-001", 1] == 1 and result.summary.backups == 0
    assert not [e for e in events if e.kind == "backup"]
    assert asked[0].requests == 1 and asked[0].input_tokens == 100  # the usual attempt's usage


def test_backups_off_starts_none() -> None:
    solver = Stragglers_({"batch-001"}, hold_s=0.3)
    result, _ = run(solver, backup=EAGER.model_copy(update={"mode": "off"}))
    assert solver.copies["batch-001", 1] == 1 and result.summary.backups == 0


def test_a_failed_straggler_leaves_the_batch_to_its_backup() -> None:
    """The first valid reply wins: a straggler that fails while its backup runs is recorded, but
    the batch waits for the backup instead of retrying."""
    gate = threading.Event()

    class FailThenBackup(Stragglers_):
        def solve(self, request: BatchRequest) -> SolverReply:
            with self.lock:
                self.calls[request.batch_id] += 1
                call = self.calls[request.batch_id]
            if request.batch_id == "batch-001" and call == 1:
                gate.wait(WAIT_S)  # until the backup runs
                raise RuntimeError("the straggler crashed")
            if request.batch_id == "batch-001" and call == 2:
                gate.set()
                while not self.done.is_set():  # answer once the straggler's failure was settled
                    self.done.wait(0.01)
            return self.world.solve(request)

    solver = FailThenBackup(set())
    solver.done = threading.Event()  # type: ignore[attr-defined]

    def progress(event: ProgressEvent) -> None:
        if event.kind == "attempt" and event.data.get("batch_id") == "batch-001" and event.data.get("outcome") == "error":
            solver.done.set()  # type: ignore[attr-defined]

    config = EngineConfig(workers=2, batch_timeout_s=WAIT_S * 2, patch_rounds=0, max_batches=None, backup=EAGER)
    result = MapReduceEngine(solver, config=config, progress=progress).run(
        Decision.parse(world_decision(TRUTH, batch_strategy={"type": "per_atom", "rationale": "r"})))
    assert_every_row_once(result)
    mine = [(r.attempt, r.backup, r.outcome) for r in result.attempts if r.batch_id == "batch-001"]
    assert mine == [(1, False, "error"), (1, True, "ok")]
    assert solver.calls["batch-001"] == 2 and result.summary.retries == 0


class ListSink:
    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def append(self, entry: JournalEntry) -> None:
        self.entries.append(entry)


def test_a_journal_with_a_superseded_attempt_resumes_counting_the_batch_once() -> None:
    sink = ListSink()
    solver = Stragglers_({"batch-001"})
    first, _ = run(solver, checkpoint=Checkpoint(sink))
    saved = [e for e in sink.entries if isinstance(e, BatchAttempt) and e.batch_id == "batch-001"]
    assert [(e.backup, e.outcome, e.done) for e in saved] == [(True, "ok", True), (False, SUPERSEDED, False)]
    again = Stragglers_(set())
    resumed, _ = run(again, checkpoint=Checkpoint(ListSink(), sink.entries))
    assert not again.calls  # every batch done, the superseded attempt after its winner included
    assert_every_row_once(resumed)
    assert resumed.summary.usage == first.summary.usage and resumed.summary.backups == first.summary.backups == 1


def test_the_threshold_is_a_multiple_of_the_finished_attempts_p75_with_a_floor() -> None:
    st = Stragglers(BackupPolicy(multiple=2.0, floor_s=0.5, min_samples=3))
    st.plan(100)
    assert st.threshold_s is None and st.cap == 5  # 5 % of 100 batches of one call until attempts are measured
    for s in (1.0, 1.0, 2.0, 10.0):
        st.finished(s, Usage(requests=2, input_tokens=10))
    assert st.threshold_s == 4.0 and st.typical_usage() == Usage(requests=2, input_tokens=10)
    assert st.cap == 10  # 5 % of 100 batches x 2 calls
    assert not st.is_straggler(3.9, 0.0) and st.is_straggler(4.0, 0.0)
    assert st.due(0.0, [1.0, 0.5]) == 4.5
    # Each racing backup reserves an attempt's 2 calls; a decided race charges the loser's calls.
    assert [st.admit() for _ in range(6)] == [True] * 5 + [False]
    for _ in range(5):
        st.settled(1)  # each straggler was cancelled in its first call
    assert st.extra_calls == 5 and st.room() and [st.admit() for _ in range(3)] == [True, True, False]
    fast = Stragglers(BackupPolicy(floor_s=0.5))
    for _ in range(3):
        fast.finished(0.01, Usage())
    assert fast.threshold_s == 0.5


def test_the_budget_refuses_a_backup_that_would_cross_it() -> None:
    meter = UsageMeter(budget=Budget(max_tokens=1000))
    meter.record("subagent", "m", Usage(requests=1, input_tokens=900))
    assert meter.would_cross(Usage(input_tokens=100)) and not meter.would_cross(Usage(input_tokens=99))
    assert not UsageMeter().would_cross(Usage(input_tokens=10**9))


def test_settings_name_the_backup_variables() -> None:
    settings = load_settings({"AMAPREDUCE_BACKUP": "off", "AMAPREDUCE_BACKUP_MAX_EXTRA": "0.1"})
    config = EngineConfig.from_settings(settings, decisions_by="user")
    assert config.backup.mode == "off" and config.backup.max_extra == 0.1
    assert load_settings({}).backup == "auto" and load_settings({}).backup_max_extra == 0.05


def test_the_trace_and_the_timeline_show_the_backup_and_which_attempt_won(tmp_path: Path) -> None:
    trace = TraceWriter(tmp_path / "trace.jsonl")
    result, _ = run(Stragglers_({"batch-001"}), trace=trace)
    trace.close()
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    starts = [e for e in lines if e["event"] == "backup_start"]
    assert starts and starts[0]["batch_id"] == "batch-001" and starts[0]["threshold_s"] >= EAGER.floor_s
    mine = [(e["backup"], e["outcome"]) for e in lines if e["event"] == "attempt" and e["batch_id"] == "batch-001"]
    assert mine == [(True, "ok"), (False, SUPERSEDED)]
    assert lines[-1]["summary"]["backups"] == result.summary.backups
    timeline = read_timeline(tmp_path / "trace.jsonl")
    assert timeline is not None and timeline.counts["superseded"] == 1 and timeline.counts["backups"] >= 1
    assert any("batch-001 attempt 1 backup (map): ok" in bar.title for bar in timeline.bars)


def test_a_model_has_room_for_a_backup_only_under_its_budget_limiter_and_closed_breaker() -> None:
    """The run's backup gate (`ManagedModel.has_room_for`): never a backup that would cross
    --max-tokens, wait on the provider's limiter, or meet an open breaker."""
    time_ = FakeTime()
    attempt = Usage(requests=2, input_tokens=100)
    meter = UsageMeter(budget=Budget(max_tokens=1000))
    limiter = WindowLimiter(WindowPolicy(rpm=2), clock=time_.clock, sleep=time_.sleep)
    breaker = CircuitBreaker("p", BreakerPolicy(failures=1, cooldown_s=30.0, max_wait_s=60.0), clock=time_.clock,
                             sleep=time_.sleep)
    model = ManagedModel(FunctionModel(lambda m, i: "ok", model_id="m"), role="subagent", meter=meter, limiter=limiter,
                         breaker=breaker)
    assert model.has_room_for(attempt)
    meter.record("subagent", "m", Usage(requests=1, input_tokens=950))
    assert not model.has_room_for(attempt)  # 950 + 100 tokens would cross the budget of 1,000
    assert model.has_room_for(Usage(requests=1, input_tokens=40))
    limiter.acquire()
    limiter.acquire()  # the window is full: a backup would wait for it
    assert not model.has_room_for(Usage(requests=1, input_tokens=40))
    time_.sleep(61)
    assert model.has_room_for(Usage(requests=1, input_tokens=40))
    breaker.record(False, "HTTP 503")  # one outage failure opens this breaker
    assert not model.has_room_for(Usage(requests=1, input_tokens=40))


def test_a_provider_that_asked_to_slow_down_gets_no_backup() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1")
    failures = [openai.RateLimitError("slow down", response=httpx.Response(429, headers={"retry-after": "30"}, request=request),
                                      body=None)]

    def reply(messages: list[Any], info: Any) -> Any:
        if failures:
            raise failures.pop()
        return final_answer("done")

    model = ManagedModel(FunctionModel(reply, model_id="m"), role="subagent", meter=UsageMeter(), sleep=lambda s: None)
    assert model.has_room_for(Usage(requests=1))
    model.generate([])  # a 429 asking for 30 s, retried (the test's sleep does not wait)
    assert not model.has_room_for(Usage(requests=1))
