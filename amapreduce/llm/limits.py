"""A process-wide rate limiter per provider: requests per minute and tokens per minute.

Every model object of a provider (the manager, dozens of sub-agents, the judge) shares one
limiter, so the whole process stays under the provider's limits however many threads call at
once. It is a sliding window: a call may start when, counting it, no 60-second window holds
more than `rpm` requests or `tpm` tokens. Token counts are estimated before the call and
corrected when the real usage is known.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["ProviderLimiter", "limiter_for"]

WINDOW_S = 60.0


class ProviderLimiter:
    """Sliding-window limits on requests and tokens per minute (None: unlimited)."""

    def __init__(
        self,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        window_s: float = WINDOW_S,
    ) -> None:
        for name, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be >= 1 or None, got {value}")
        self.rpm, self.tpm, self.window_s = rpm, tpm, window_s
        self._clock, self._sleep = clock, sleep
        self._cond = threading.Condition()
        self._events: deque[list[float]] = deque()  # [start time, tokens] per admitted call

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._events.popleft()

    def _wait_needed(self, now: float, tokens: int) -> float:
        self._expire(now)
        waits = [0.0]
        if self.rpm is not None and len(self._events) >= self.rpm:
            waits.append(self._events[len(self._events) - self.rpm][0] + self.window_s - now)
        if self.tpm is not None:
            used = sum(e[1] for e in self._events)
            if used + tokens > self.tpm and self._events:
                excess = used + tokens - self.tpm
                for start, spent in self._events:
                    excess -= spent
                    if excess <= 0:
                        waits.append(start + self.window_s - now)
                        break
                else:  # larger than the limit itself: wait for an empty window
                    waits.append(self._events[-1][0] + self.window_s - now)
        return max(waits)

    def acquire(self, tokens: int = 0) -> list[float]:
        """Block until a call of about `tokens` tokens may start; return its ticket.

        A single call larger than `tpm` is admitted once the window is empty (it could never
        fit otherwise).
        """
        tokens = max(0, tokens)
        with self._cond:
            while True:
                now = self._clock()
                wait = self._wait_needed(now, tokens)
                if wait <= 0:
                    ticket = [now, float(tokens)]
                    self._events.append(ticket)
                    return ticket
                self._cond.release()
                try:
                    self._sleep(min(wait, 1.0))
                finally:
                    self._cond.acquire()

    def settle(self, ticket: list[float], tokens: int) -> None:
        """Replace a ticket's estimate with the tokens the call really used."""
        with self._cond:
            ticket[1] = float(max(0, tokens))

    def window_counts(self) -> tuple[int, float]:
        """(requests, tokens) in the current window (for tests and progress displays)."""
        with self._cond:
            self._expire(self._clock())
            return len(self._events), sum(e[1] for e in self._events)


_REGISTRY: dict[str, ProviderLimiter] = {}
_REGISTRY_LOCK = threading.Lock()


def limiter_for(provider: str, *, rpm: int | None = None, tpm: int | None = None) -> ProviderLimiter:
    """The process-wide limiter of `provider` (created on first use with these limits)."""
    with _REGISTRY_LOCK:
        limiter = _REGISTRY.get(provider)
        if limiter is None:
            limiter = _REGISTRY[provider] = ProviderLimiter(rpm=rpm, tpm=tpm)
        return limiter
