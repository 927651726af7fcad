"""The thread executor under hung sub-agents, and cancellation that stops queued attempts."""

from __future__ import annotations

import _thread
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from amapreduce.decision import Decision
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.executor import ThreadExecutor
from amapreduce.mapreduce.solver import BatchRequest, SolverReply

DECISION = {"task_matrix": [[f"C{i}"] for i in range(6)], "template": "__0__", "json_schema": ["country", "capital"]}


def test_executor_runs_jobs_and_hands_back_exceptions() -> None:
    ex = ThreadExecutor(2)
    ok = ex.submit(lambda: 41 + 1)
    bad = ex.submit(lambda: 1 // 0)
    assert ok.result(timeout=30) == 42
    assert isinstance(bad.exception(timeout=30), ZeroDivisionError)
    ex.shutdown(cancel=False)
    assert ex.join(30)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(lambda: 1)


def test_cancelling_shutdown_drops_queued_jobs() -> None:
    gate, began = threading.Event(), threading.Event()
    ex = ThreadExecutor(1)

    def hold() -> bool:
        began.set()
        return gate.wait(30)

    running = ex.submit(hold)
    assert began.wait(30)
    queued = ex.submit(lambda: "never")
    ex.shutdown(cancel=True)
    assert queued.cancelled()
    gate.set()
    assert running.result(timeout=30) is True
    assert ex.join(30)


def test_hung_attempts_do_not_starve_the_pool() -> None:
    """Every first attempt blocks in a 'model call' that ignores its cancel token; with a fixed
    pool of 4 threads the 6 batches would stall until the calls return by themselves."""
    release = threading.Event()
    released_by_test: list[bool] = []
    lock = threading.Lock()

    class Solver:
        def solve(self, req: BatchRequest) -> SolverReply:
            if req.attempt == 1:
                got = release.wait(60)
                with lock:
                    released_by_test.append(got)
                return SolverReply(output="[]", usage=Usage())
            return SolverReply(output=json.dumps([{"task": 1, "capital": f"cap-{req.tasks[0]}"}]), usage=Usage())

    ex = ThreadExecutor(4)
    engine = MapReduceEngine(Solver(), config=EngineConfig(workers=2, batch_timeout_s=0.3), executor=ex)
    result = engine.run(Decision.parse(DECISION))
    release.set()  # only now do the hung calls return
    ex.shutdown(cancel=False)
    assert ex.join(60)
    assert result.summary.complete and result.summary.timeouts == 6
    assert [r["capital"] for r in result.table.records()] == [f"cap-C{i}" for i in range(6)]
    assert released_by_test == [True] * 6  # no hung call had to give up on its own for the run to finish
    assert ex.thread_count == 4 + 6


@pytest.mark.usefixtures("python_sigint")
def test_no_attempt_starts_after_ctrl_c() -> None:
    """Two workers block; the second interrupts the main thread. Attempts already on pool threads
    waiting for a worker slot must see the cancel and never call the solver."""
    release = threading.Event()
    started: list[str] = []
    lock = threading.Lock()

    class Solver:
        def solve(self, req: BatchRequest) -> SolverReply:
            with lock:
                started.append(req.batch_id)
                first_two = len(started) == 2
            if first_two:
                _thread.interrupt_main()
            release.wait(60)
            return SolverReply(output="[]", usage=Usage())

    ex = ThreadExecutor(4)
    engine = MapReduceEngine(Solver(), config=EngineConfig(workers=2, max_attempts=1, patch_rounds=0), executor=ex)
    assert engine.run(Decision.parse(DECISION)).cancelled  # returned, not raised
    release.set()  # frees both slots: waiting threads now get them and must stand down
    assert ex.join(60)
    assert len(started) == 2  # the two that held the slots; nothing started after the interrupt


class HeldResults:
    """Runs each job on its own thread but hands its result to the engine only when released:
    the engine loop sees no finished attempt, however many have answered."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()

        def run() -> None:
            try:
                result = fn()
            except BaseException as exc:
                self.release.wait(60)
                future.set_exception(exc)
            else:
                self.release.wait(60)
                future.set_result(result)

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        return future

    def replace_stuck_thread(self) -> None:
        pass

    def shutdown(self, *, cancel: bool) -> None:
        pass


def test_attempts_answered_before_a_cancel_are_kept() -> None:
    """Two attempts answer (their slots pass on) before the engine loop has seen either result;
    the third cancels the run. The partial table must still hold the two answered batches."""
    engine: MapReduceEngine
    answered: list[int] = []
    lock = threading.Lock()

    class Solver:
        def solve(self, req: BatchRequest) -> SolverReply:
            with lock:
                answered.append(int(req.tasks[0][1:]))
                third = len(answered) == 3
            if third:
                engine.cancel()
            return SolverReply(output=json.dumps([{"task": 1, "capital": f"cap-{req.tasks[0]}"}]), usage=Usage())

    ex = HeldResults()
    engine = MapReduceEngine(Solver(), config=EngineConfig(workers=1, max_attempts=1, patch_rounds=0), executor=ex)
    partial = engine.run(Decision.parse(DECISION))
    ex.release.set()
    for thread in ex.threads:
        thread.join(60)
    assert partial.cancelled
    done = {r.task_index for r in partial.table.rows if not r.missing()}
    assert done >= set(answered[:2]) and len(answered) >= 3
    assert partial.summary.attempts >= 2
