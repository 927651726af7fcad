"""The provider limiter: never more than the limit in any window, even under 32 threads."""

from __future__ import annotations

import threading

import pytest
from fake_clock import FakeTime

from amapreduce.llm.limits import ProviderLimiter


def test_requests_per_window_with_fake_clock() -> None:
    t = FakeTime()
    limiter = ProviderLimiter(rpm=3, clock=t.clock, sleep=t.sleep, window_s=60)
    starts = [limiter.acquire()[0] for _ in range(7)]
    assert starts[:3] == [0.0, 0.0, 0.0]
    assert starts[3] >= 60 and starts[6] >= 120
    for s in starts:
        assert sum(1 for u in starts if s <= u < s + 60) <= 3


def test_tokens_per_window_and_settlement() -> None:
    t = FakeTime()
    limiter = ProviderLimiter(tpm=1000, clock=t.clock, sleep=t.sleep, window_s=60)
    first = limiter.acquire(900)
    limiter.settle(first, 200)  # it really used 200
    assert limiter.acquire(700)[0] == 0.0  # 200 + 700 fits
    assert limiter.acquire(500)[0] >= 60  # 900 + 500 does not
    assert limiter.acquire(5000)[0] >= 120  # larger than the limit: admitted alone once the window is empty


def test_never_more_than_the_limit_under_32_threads() -> None:
    window, rpm = 0.25, 5
    limiter = ProviderLimiter(rpm=rpm, window_s=window)
    starts: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(2):
            ticket = limiter.acquire()  # the admitted start time, stamped under the limiter's lock
            with lock:
                starts.append(ticket[0])

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert len(starts) == 64
    starts.sort()
    for i, s in enumerate(starts):
        in_window = [u for u in starts[i:] if u < s + window - 1e-3]
        assert len(in_window) <= rpm


def test_invalid_limits() -> None:
    with pytest.raises(ValueError, match="`rpm` must be >= 1 or None, got 0"):
        ProviderLimiter(rpm=0)
