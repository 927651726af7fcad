"""A clock for tests of waits and backoffs: time moves only when someone sleeps."""

from __future__ import annotations

import threading


class FakeTime:
    """`clock()` and `sleep()` over one shared, lock-protected 'now' (thread-safe)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def clock(self) -> float:
        with self.lock:
            return self.now

    def sleep(self, s: float) -> None:
        with self.lock:
            self.now += max(0.0, s)
