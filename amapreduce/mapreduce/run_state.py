"""The state of one engine run: its batches, the attempts in flight, and why it stops.

Why apart from the engine: the engine object is shared (two `mapreduce` tool calls in one manager
step, several runs in one process), so everything that belongs to one `MapReduceEngine.run` call
lives in an `EngineRun` made by that call; the engine keeps only configuration and collaborators.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from amapreduce.llm.scope import UsageScope
from amapreduce.mapreduce.result import RunEnding, RunStatus
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.mapreduce.work import WorkBatch

__all__ = ["CANCELLED", "INTERRUPTED", "BatchJob", "BatchState", "EngineRun"]


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
    outcome: tuple[SolverReply | None, BaseException | None] | None = None
    """Set by the worker when the solver returns, before its slot is freed: a stop never loses it."""


CANCELLED = RunEnding(RunStatus.STOPPED, "the MapReduce run was cancelled")
INTERRUPTED = RunEnding(RunStatus.INTERRUPTED, "interrupted")


class EngineRun:
    """The state of one `MapReduceEngine.run` call, so that runs sharing an engine (two tool calls
    in one manager step, two runs in one process) never see each other's attempts, slots or stop."""

    def __init__(self, workers: int) -> None:
        self.slots = threading.Semaphore(workers)
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

    def stop(self, ending: RunEnding) -> None:
        """Stop this run soon (thread-safe); the first reason given is the one reported."""
        with self.gate:
            if self.ending is None:
                self.ending = ending
        self.stopping.set()
        self.done.put(None)
