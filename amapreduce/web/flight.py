"""Single-flight: identical searches and crawls in flight at once share one request.

Why: a wide run's sub-agents often search the same query or crawl the same page at the same moment
(twenty batches of one Wikipedia list). The cache answers only once the first call has finished and
stored its result, so without this every one of them fetched the page. `SingleFlight.do(key, fn)`
runs `fn` for the first caller of a key; callers that come while it runs wait for that call and get
its result (or its exception) instead of running their own. Once the call is done the key is free:
the next caller runs again (and normally finds the result in the cache).

Why our own (about thirty lines): the Python packages that offer this are asyncio-only or bundle a
cache and a transport of their own; the service already has its cache, and its callers are threads.
`concurrent.futures.Future` is the waiting primitive. One `SingleFlight` belongs to one
`WebService` (one run, or one Ray worker's run of chunks): calls share within a process.

`served_by_another` tells the current tool call (a context-local flag, set in the calling thread)
whether its search or crawl was served by another call's request; the tool-call trace records it
(`agents.tool_calls`: the `tool` line's `shared`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from contextvars import ContextVar
from typing import Generic, TypeVar

__all__ = ["SingleFlight", "call_shares", "served_by_another"]

T = TypeVar("T")


class _Shared:
    """Whether any search or crawl of the current tool call was served by another's request."""

    def __init__(self) -> None:
        self.shared = False


_CALL: ContextVar[_Shared | None] = ContextVar("amapreduce_flight_call", default=None)


@contextlib.contextmanager
def call_shares() -> Iterator[_Shared]:
    """Track, for the block (one tool call), whether a request was shared; read `.shared` after it."""
    box = _Shared()
    token = _CALL.set(box)
    try:
        yield box
    finally:
        _CALL.reset(token)


def served_by_another() -> None:
    """Note that the current tool call's result came from another call's request."""
    box = _CALL.get()
    if box is not None:
        box.shared = True


class SingleFlight(Generic[T]):
    """One call per key in flight; concurrent callers of the same key share its outcome (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, Future[T]] = {}
        self.shared = 0
        """How many callers were served by another's call."""

    def do(self, key: Hashable, fn: Callable[[], T]) -> tuple[T, bool]:
        """`fn()`'s result for `key`, and whether it came from another caller's call.

        Raises:
            BaseException: whatever `fn` raised, in every caller that shared the call.
        """
        with self._lock:
            running = self._calls.get(key)
            if running is None:
                mine: Future[T] = Future()
                self._calls[key] = mine
            else:
                self.shared += 1
        if running is not None:
            served_by_another()
            return running.result(), True
        try:
            value = fn()
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(value)
            return value, False
        finally:
            with self._lock:
                del self._calls[key]
