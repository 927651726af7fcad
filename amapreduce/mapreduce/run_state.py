"""The state of one engine run: its batches, the attempts in flight, and why it stops.

Why apart from the engine: the engine object is shared (two `mapreduce` tool calls in one manager
step, several runs in one process), so everything that belongs to one `MapReduceEngine.run` call
lives in an `EngineRun` made by that call; the engine keeps only configuration and collaborators.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from amapreduce.llm.scope import UsageScope
from amapreduce.mapreduce.backup import BackupPolicy, Stragglers
from amapreduce.mapreduce.result import RunEnding
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.mapreduce.work import WorkBatch
from amapreduce.table.evidence import FetchedPages

__all__ = ["POLL_S", "AdaptiveSlots", "AttemptNotStarted", "BatchJob", "BatchState", "EngineRun"]

POLL_S = 0.05
"""How often a waiting worker or the engine loop looks again (slots, attempts not yet started)."""


class AttemptNotStarted(Exception):
    """An attempt still waiting for a slot when its run stopped: it never started, so it is no
    attempt (not recorded, not journaled). Private to the engine, which never lets it out."""


@dataclass(eq=False)
class BatchState:
    """One batch across its attempts: its work, prompt variables, first prompt and attempt count."""

    work: WorkBatch
    prompt_vars: dict[str, Any]
    first_prompt: str = ""
    attempt: int = 0


@dataclass(eq=False)
class BatchJob:
    """One attempt of a batch, from submission to its outcome."""

    state: BatchState
    request: BatchRequest | None
    """None until the attempt starts: a first prompt is rendered on the worker, not the engine loop."""
    started_at: float | None = None
    future: Future[SolverReply] | None = None
    holds_slot: bool = False
    scope: UsageScope | None = None
    """The metered model calls of the running attempt (billed even when the attempt fails)."""
    pages: FetchedPages = field(default_factory=FetchedPages)
    """The text the attempt's web tools fetched, by URL: what its quotes are checked against."""
    outcome: tuple[SolverReply | None, BaseException | None] | None = None
    """Set by the worker when the solver returns, before its slot is freed: a stop never loses it."""
    backup: bool = False
    """Whether this attempt is a straggler's backup (the same request, on a fresh sub-agent)."""
    rival: BatchJob | None = None
    """The other attempt of a straggler and its backup while both run; the first valid reply wins."""
    superseded: bool = False
    """The rival won: this attempt was cancelled, its reply (if one still comes) is not merged."""




class AdaptiveSlots:
    """A run's slots under an adapted limit (`concurrency.AdaptiveWorkers`): `acquire` takes one while
    fewer than `limit()` are held; a lowered limit takes effect as held slots are given back."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self._cond = threading.Condition()
        self._held = 0

    def acquire(self, timeout: float | None = None) -> bool:
        with self._cond:
            if self._held >= self._limit():
                self._cond.wait(timeout)
                if self._held >= self._limit():
                    return False
            self._held += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._held -= 1
            self._cond.notify()


class EngineRun:
    """The state of one `MapReduceEngine.run` call, so that runs sharing an engine (two tool calls
    in one manager step, two runs in one process) never see each other's attempts, slots or stop."""

    def __init__(
        self, workers: int, *, batch_timeout_s: float, clock: Callable[[], float], stragglers: Stragglers | None = None,
        limit: Callable[[], int] | None = None,
    ) -> None:
        self._workers = workers
        self._limit = limit
        """The adapted limit (`--workers auto`), read at each slot taken; None: `workers`, fixed."""
        self.batch_timeout_s = batch_timeout_s
        self.stragglers = stragglers or Stragglers(BackupPolicy(mode="off"))
        """The run's backup bookkeeping (`mapreduce.backup`), across its phases."""
        self.clock = clock
        self.slots: threading.Semaphore | AdaptiveSlots = (threading.Semaphore(workers) if limit is None
                                                           else AdaptiveSlots(limit))
        self.gate = threading.Lock()  # guards `running`, slot hand-back and `ending`
        self.running: set[BatchJob] = set()
        # Finished futures arrive here through done-callbacks: O(1) per completion, however
        # many attempts are in flight. `None` is the wake-up sent by `stop()`.
        self.done: queue.SimpleQueue[Future[SolverReply] | None] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.ending: RunEnding | None = None
        """Why the run stops (the first cause wins); None while it runs."""
        self.prompt_lock = threading.Lock()
        self.prompt_headers: dict[str, str] = {}

    @property
    def workers(self) -> int:
        """Attempts allowed in flight now (fixed, or the adapted limit)."""
        return self._workers if self._limit is None else self._limit()

    def stop(self, ending: RunEnding) -> None:
        """Stop this run soon (thread-safe); the first reason given is the one reported."""
        with self.gate:
            if self.ending is None:
                self.ending = ending
        self.stopping.set()
        self.done.put(None)

    # -- attempts in flight: slots, deadlines and completions ---------------------------------

    def release(self, job: BatchJob) -> None:
        """Give back the job's slot once (by the worker when done, or by the loop on abandon)."""
        with self.gate:
            held, job.holds_slot = job.holds_slot, False
        if held:
            self.slots.release()

    def leave(self, job: BatchJob) -> None:
        """The job no longer runs (it finished, or was abandoned)."""
        with self.gate:
            self.running.discard(job)

    def abandon(self, job: BatchJob) -> None:
        """Give up on a running job: its slot goes to the next attempt, a late result is ignored, and
        its model request on the wire is dropped (the server sees the connection close)."""
        self.leave(job)
        self.release(job)
        if job.request is not None:
            job.request.cancel.set()
        if job.scope is not None:
            job.scope.drop_requests()

    def overdue(self, now: float) -> list[BatchJob]:
        """Running jobs past their deadline at `now`."""
        with self.gate:
            return [j for j in self.running if j.started_at is not None and now - j.started_at > self.batch_timeout_s]

    def finished(
        self, inflight: Mapping[Future[SolverReply], BatchJob], wake_at: float | None = None
    ) -> list[Future[SolverReply]]:
        """In-flight futures that finished, in completion order (waits until the first one,
        the next deadline, `wake_at` (when a straggler gets its backup), or a stop). Late results
        of abandoned attempts are ignored."""
        wait_s = self._wait_s(inflight)
        if wake_at is not None:
            wait_s = max(0.0, min(wait_s, wake_at - self.clock()))
        try:
            first = self.done.get(timeout=wait_s)
        except queue.Empty:
            return []
        got = [first]
        while True:
            try:
                got.append(self.done.get_nowait())
            except queue.Empty:
                break
        return [f for f in got if f is not None and f in inflight]

    def _wait_s(self, inflight: Mapping[Future[SolverReply], BatchJob]) -> float:
        """Sleep until the nearest deadline of a running attempt; poll while some have not started."""
        now = self.clock()
        with self.gate:
            starts = [j.started_at for j in self.running if j.started_at is not None]
            waiting = len(inflight) > len(self.running)
        wait_s = min((s + self.batch_timeout_s - now for s in starts), default=POLL_S * 20)
        if waiting:
            wait_s = min(wait_s, POLL_S)
        return max(0.0, wait_s)
