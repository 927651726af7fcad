"""How many attempts an engine runs at once: a fixed number (`workers`), or adapted to the server.

Why adapt: a local server computes a few requests at a time (llama.cpp's slots; llama-cpp-python's
server one), so a run's default 8 workers queue behind each other there, pass their deadlines and
are retried while the server still computes the abandoned calls; a hosted API takes far more. Where
the server reports its slots (llama.cpp's `/props`, `llm.endpoint`) the session runs that many
workers; where it does not, `--workers auto` starts low and adapts (`AdaptiveWorkers`):

* **grow while throughput rises**: after a window of settled attempts (twice the limit) at one limit,
  the limit doubles while attempts per second rise by at least `GAIN` over the last window's (a slow
  start, as TCP's: a hosted API reaches its 32 in four windows); the first doubling that brings no such
  rise is taken back (the server was saturated below it: more in flight only queues) and from there
  the limit grows by one while throughput still rises, else it holds;
* **back off on pressure**: an attempt past its deadline or a 429 from the provider halves the limit
  (at least 1) and probing starts again from there.

Each change is reported (`on_change`: the engine's `WorkersChanged` event, a `workers` trace line).
One `AdaptiveWorkers` belongs to one engine (one server); each of its runs holds at most the current
limit (`run_state.AdaptiveSlots`), and every run's settled attempts and 429s teach the one limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["AUTO_MAX_WORKERS", "AUTO_START_WORKERS", "GAIN", "AdaptiveWorkers"]

AUTO_START_WORKERS = 2
"""Where `--workers auto` starts when the server reports no slots."""
AUTO_MAX_WORKERS = 32
"""The most it grows to."""
GAIN = 0.1
"""The rise in attempts per second over the last window's that makes the limit grow (10 %)."""


class AdaptiveWorkers:
    """The limit of attempts in flight, adapted to observed throughput and pressure (see the module doc).

    Args:
        maximum: the most it grows to.
        start: where it starts.
        clock: seconds (monotonic).
        on_change: told (previous, limit, why) after each change.
    """

    def __init__(self, maximum: int = AUTO_MAX_WORKERS, *, start: int = AUTO_START_WORKERS,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[int, int, str], None] | None = None) -> None:
        if maximum < 1:
            raise ValueError(f"maximum must be at least 1, got {maximum}")
        self.maximum = maximum
        self._limit = max(1, min(start, maximum))
        self._clock = clock
        self.on_change = on_change
        self._lock = threading.Lock()
        self._window_start: float | None = None
        self._window_done = 0
        self._last_rate: float | None = None
        self._doubling = True
        """Still in the slow start: each rise doubles the limit (until the first doubling that did not help)."""
        self._undo: int | None = None
        """The limit before the last doubling."""
        self._calm = True
        """An attempt settled since the last back-off: a burst of 429s from the calls in flight at once
        is one signal, not one halving each."""

    @property
    def limit(self) -> int:
        """Attempts allowed in flight now."""
        return self._limit

    def settled(self, outcome: str) -> None:
        """An attempt settled (`AttemptRecord.outcome`): a `timeout` backs off; any other counts towards the window."""
        if outcome == "timeout":
            self.pressure("an attempt passed its deadline")
            return
        change: tuple[int, int, str] | None = None
        with self._lock:
            self._calm = True
            now = self._clock()
            if self._window_start is None:
                self._window_start, self._window_done = now, 0
            self._window_done += 1
            if self._window_done < 2 * self._limit:
                return
            elapsed = max(now - self._window_start, 1e-9)
            rate = self._window_done / elapsed
            rising = self._last_rate is None or rate >= self._last_rate * (1 + GAIN)
            self._last_rate = rate if rising else max(rate, self._last_rate or 0.0)
            self._window_start, self._window_done = now, 0
            change = self._step(rising, rate)
        self._tell(change)

    def _step(self, rising: bool, rate: float) -> tuple[int, int, str] | None:
        """The change a finished window makes (under the lock): double or add one on a rise; the slow
        start's first doubling that brought no rise is taken back."""
        previous = self._limit
        if rising:
            self._undo = previous if self._doubling else None
            self._limit = min(self.maximum, 2 * previous if self._doubling else previous + 1)
            why = f"throughput rose to {rate:.2f} attempts/s"
        elif self._doubling:
            self._doubling = False
            self._limit = self._undo or previous
            why = f"throughput held at {rate:.2f} attempts/s: the server is saturated below {previous}"
        else:
            return None
        return (previous, self._limit, why) if self._limit != previous else None

    def pressure(self, why: str) -> None:
        """The server is over its capacity (a 429, an attempt past its deadline): halve the limit."""
        with self._lock:
            if not self._calm:
                return
            previous, self._calm = self._limit, False
            self._limit = max(1, previous // 2)
            self._window_start, self._window_done, self._last_rate, self._doubling = None, 0, None, False
        self._tell((previous, self._limit, why) if self._limit != previous else None)

    def _tell(self, change: tuple[int, int, str] | None) -> None:
        if change is not None and self.on_change is not None:
            self.on_change(*change)
