"""Per-backend rate limiting and retries with exponential backoff.

Why: many sub-agents search at once. Without a shared limiter, eight workers times several tool
calls per step hit a free backend in the same second and get rate-limited (the reference has no
limiter at all). One `RateLimiter` per backend name is shared by every thread of the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from amapreduce._retry import RetryPolicy, Transient, retry_loop
from amapreduce.errors import RunError

__all__ = ["BackendError", "RateLimiter", "limiter_for", "with_retries"]

T = TypeVar("T")
Sleep = Callable[[float], None]


class BackendError(RunError):
    """A search backend failed; `transient` tells whether a retry may help."""


class RateLimiter:
    """Spaces calls at least `min_interval_s` apart across all threads."""

    def __init__(self, min_interval_s: float, clock: Callable[[], float] = time.monotonic, sleep: Sleep = time.sleep):
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next = 0.0

    def acquire(self) -> float:
        """Wait for this caller's slot; return the seconds waited."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.min_interval_s
        wait = start - now
        if wait > 0:
            self._sleep(wait)
        return wait


_LIMITERS: dict[str, RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter_for(name: str, min_interval_s: float) -> RateLimiter:
    """The process-wide limiter of one backend (created on first use; interval may be updated)."""
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.get(name)
        if limiter is None:
            limiter = _LIMITERS[name] = RateLimiter(min_interval_s)
        limiter.min_interval_s = min_interval_s
        return limiter


def with_retries(
    call: Callable[[], T],
    *,
    what: str,
    attempts: int = 3,
    base_delay_s: float = 1.0,
    sleep: Sleep = time.sleep,
) -> T:
    """Run `call`, retrying a transient `BackendError` with delays base, 2·base, 4·base ...

    Raises:
        BackendError: the last error, when it is not transient or attempts ran out; the message
            says how many attempts were made.
    """

    def classify(exc: Exception) -> Transient | None:
        return Transient(kind="backend") if isinstance(exc, BackendError) and getattr(exc, "transient", False) else None

    def give_up(exc: Exception, tries: int, transient: Transient | None) -> BaseException:
        if isinstance(exc, BackendError) and tries > 1:
            return BackendError(f"{exc.message} (after {tries} attempts of {what})", **exc.fields)
        return exc

    policy = RetryPolicy(max_retries=attempts - 1, base_delay_s=base_delay_s, max_delay_s=float("inf"), jitter=0.0)
    return retry_loop(call, policy=policy, classify=classify, give_up=give_up, sleep=sleep)
