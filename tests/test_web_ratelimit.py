"""Rate limiter spacing and retries with backoff (fake clock and sleep: no waiting)."""

from __future__ import annotations

import pytest

from amapreduce.web.ratelimit import BackendError, RateLimiter, limiter_for, with_retries


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_limiter_spaces_calls() -> None:
    t = FakeTime()
    limiter = RateLimiter(2.0, clock=t.clock, sleep=t.sleep)
    assert [limiter.acquire() for _ in range(3)] == [0.0, 2.0, 2.0]
    t.now += 10
    assert limiter.acquire() == 0.0


def test_limiter_for_is_shared_per_name() -> None:
    assert limiter_for("x-test", 1.0) is limiter_for("x-test", 3.0)
    assert limiter_for("x-test", 3.0).min_interval_s == 3.0


def test_transient_errors_are_retried_with_exponential_backoff() -> None:
    t = FakeTime()
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise BackendError("busy", transient=True)
        return "ok"

    assert with_retries(flaky, what="test", attempts=3, base_delay_s=0.5, sleep=t.sleep) == "ok"
    assert t.slept == [0.5, 1.0]


def test_permanent_errors_are_not_retried() -> None:
    t = FakeTime()

    def bad() -> str:
        raise BackendError("bad key", transient=False)

    with pytest.raises(BackendError, match="bad key"):
        with_retries(bad, what="test", sleep=t.sleep)
    assert t.slept == []


def test_attempts_run_out_with_a_count_in_the_message() -> None:
    t = FakeTime()

    def down() -> str:
        raise BackendError("unreachable", transient=True)

    with pytest.raises(BackendError, match=r"unreachable \(after 3 attempts of test\)"):
        with_retries(down, what="test", attempts=3, sleep=t.sleep)
    assert t.slept == [1.0, 2.0]
