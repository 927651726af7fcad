"""Where batch attempts run. The engine needs `submit`, `replace_stuck_thread` and `shutdown`.

Threads suit the I/O-bound fan-out of sub-agents on a small machine (docs/dependencies.md §8: a
thread pool runs 100 trivial tasks in 2.3 ms, Ray needs 3–4 s just to start). This seam stays in
one process by design: a job here is a closure over the engine's per-run state (the attempt's
cancel event and deadline, its usage scope, the pages its quotes are checked against), which is
what lets a deadline abandon an attempt and a Ctrl-C settle the finished ones. Work crosses
machines one level up, as plain data: a chunk of a very wide run's batches (`cluster.wide`,
each chunk running this engine with its threads) or an evaluation's trial (`cluster.trials`).

Why not `concurrent.futures.ThreadPoolExecutor`: an attempt that passes its deadline is
abandoned, but a Python thread cannot be killed — a sub-agent blocked inside one model call
keeps its thread until the call returns. With a fixed-size pool, enough hung attempts hold
every thread and the queued attempts never start, so the run stalls instead of timing out.
`ThreadExecutor` therefore starts a fresh thread for each abandoned one (`replace_stuck_thread`);
its threads are daemons, so a hung call cannot keep the process alive after the run ends.

Each job runs in a copy of the context of the thread that submitted it
(`contextvars.copy_context().run`), as `asyncio.to_thread` does. A new thread otherwise starts
from an empty context, so whatever the submitter set in context variables was lost: the open
OpenTelemetry span above all, which left every sub-agent run a trace of its own (`telemetry`). The
copy is the submitter's, never another job's, so parallel attempts still see nothing of each
other's (their usage scopes included, `llm.scope`).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

__all__ = ["Executor", "ThreadExecutor"]

T = TypeVar("T")
_Item = tuple[Future[Any], Callable[[], Any]]


class Executor(Protocol):
    """Runs zero-argument jobs somewhere and returns futures."""

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Schedule `fn` and return its future. `fn` must see the caller's context variables
        (the current trace span among them): run it in a copy of `contextvars.copy_context()`,
        or, off this process, in what the tracing context propagates to."""
        ...

    def replace_stuck_thread(self) -> None:
        """An abandoned job still holds a worker: add one so queued jobs keep flowing.
        Executors without a fixed set of workers do nothing."""
        ...

    def shutdown(self, *, cancel: bool) -> None:
        """Release resources; with `cancel`, drop jobs not yet started and do not wait."""
        ...


class ThreadExecutor:
    """A pool of `threads` daemon threads that grows by one per abandoned job.

    `threads` should exceed the engine's `workers` a little, so that a freed worker slot is
    taken by a thread already waiting for it.
    """

    def __init__(self, threads: int, *, name: str = "amapreduce-batch") -> None:
        if threads < 1:
            raise ValueError(f"`threads` must be >= 1, got {threads}")
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count()
        self._closed = False
        self._limit = threads
        # Threads start lazily, as in ThreadPoolExecutor: a short run never pays for 40 threads.
        self._idle = threading.Semaphore(0)

    @property
    def thread_count(self) -> int:
        """Threads started so far (started on demand, up to `threads` plus one per replacement)."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue `fn` for the next free thread, to run in a copy of the caller's context."""
        future: Future[T] = Future()
        job = functools.partial(contextvars.copy_context().run, fn)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a ThreadExecutor after shutdown")
            self._queue.put((future, job))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._limit:
                self._spawn()
        return future

    def replace_stuck_thread(self) -> None:
        """Start one more thread (the stuck one returns to the pool if it ever finishes)."""
        with self._lock:
            if not self._closed:
                self._limit += 1
                self._spawn()

    def shutdown(self, *, cancel: bool) -> None:
        """Stop the threads: with `cancel`, queued jobs are cancelled and nothing is awaited;
        without it, queued jobs run first and the threads are joined."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        if cancel:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if not cancel:
            for thread in threads:
                thread.join()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait (after `shutdown`) until every thread has exited; False if some still run at
        the timeout — e.g. a sub-agent stuck in a model call that ignores its cancel token."""
        with self._lock:
            threads = list(self._threads)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._work, name=f"{self._name}_{next(self._ids)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # handed to the future's owner, like ThreadPoolExecutor
                future.set_exception(exc)
            else:
                future.set_result(result)
            del item, future, fn
            self._idle.release()
