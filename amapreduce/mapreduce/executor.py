"""Where batch attempts run. The engine only needs `submit` and `shutdown`.

Threads suit the I/O-bound fan-out of sub-agents on a small machine (dependency-notes §8: a
thread pool runs 100 trivial tasks in 2.3 ms, Ray needs 3–4 s just to start). A distributed
executor (Ray, dask) later implements the same two methods and hands back
`concurrent.futures.Future`s, so the engine does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypeVar

__all__ = ["Executor", "ThreadExecutor"]

T = TypeVar("T")


class Executor(Protocol):
    """Runs zero-argument jobs somewhere and returns futures."""

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Schedule `fn` and return its future."""
        ...

    def shutdown(self, *, cancel: bool) -> None:
        """Release resources; with `cancel`, drop jobs not yet started and do not wait."""
        ...


class ThreadExecutor:
    """A thread pool. `threads` should exceed the engine's `workers` a little: an attempt that
    timed out is abandoned (Python threads cannot be killed), and its thread stays busy until
    the sub-agent notices its cancel token."""

    def __init__(self, threads: int, *, name: str = "amapreduce-batch") -> None:
        if threads < 1:
            raise ValueError(f"`threads` must be >= 1, got {threads}")
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on a pool thread."""
        return self._pool.submit(fn)

    def shutdown(self, *, cancel: bool) -> None:
        """Stop the pool (without waiting for abandoned threads when `cancel` is set)."""
        self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
