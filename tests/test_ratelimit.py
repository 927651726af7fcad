"""The rate limiters: spacing for search backends, sliding windows for providers (never more than
the limit in any window, even under 32 threads), and the registry's same-key rule."""

from __future__ import annotations

import threading

import pytest
from fake_clock import FakeTime

from amapreduce.errors import ConfigError
from amapreduce.ratelimit import (
    SpacingLimiter,
    SpacingPolicy,
    WindowLimiter,
    WindowPolicy,
    forget_shared_limiters,
    shared_limiter,
)


def test_spacing_limiter_spaces_calls() -> None:
    t = FakeTime()
    limiter = SpacingLimiter(SpacingPolicy(2.0), clock=t.clock, sleep=t.sleep)
    assert [limiter.acquire() for _ in range(3)] == [0.0, 2.0, 2.0]
    t.now += 10
    assert limiter.acquire() == 0.0


def test_requests_per_window_with_fake_clock() -> None:
    t = FakeTime()
    limiter = WindowLimiter(WindowPolicy(rpm=3, window_s=60), clock=t.clock, sleep=t.sleep)
    starts = [limiter.acquire()[0] for _ in range(7)]
    assert starts[:3] == [0.0, 0.0, 0.0]
    assert starts[3] >= 60 and starts[6] >= 120
    for s in starts:
        assert sum(1 for u in starts if s <= u < s + 60) <= 3


def test_tokens_per_window_and_settlement() -> None:
    t = FakeTime()
    limiter = WindowLimiter(WindowPolicy(tpm=1000, window_s=60), clock=t.clock, sleep=t.sleep)
    first = limiter.acquire(900)
    limiter.settle(first, 200)  # it really used 200
    assert limiter.acquire(700)[0] == 0.0  # 200 + 700 fits
    assert limiter.acquire(500)[0] >= 60  # 900 + 500 does not
    assert limiter.acquire(5000)[0] >= 120  # larger than the limit: admitted alone once the window is empty


def test_never_more_than_the_limit_under_32_threads() -> None:
    window, rpm = 0.25, 5
    limiter = WindowLimiter(WindowPolicy(rpm=rpm, window_s=window))
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
        WindowPolicy(rpm=0)
    with pytest.raises(ValueError, match="`min_interval_s` must be >= 0, got -1"):
        SpacingPolicy(-1)


def test_shared_limiter_is_one_per_key_and_policy() -> None:
    spacing = shared_limiter("test-ratelimit-backend", SpacingPolicy(1.0))
    assert shared_limiter("test-ratelimit-backend", SpacingPolicy(1.0)) is spacing
    assert shared_limiter("test-ratelimit-other", SpacingPolicy(1.0)) is not spacing
    window = shared_limiter("test-ratelimit-provider", WindowPolicy(rpm=10))
    assert shared_limiter("test-ratelimit-provider", WindowPolicy(rpm=10)) is window
    assert isinstance(spacing, SpacingLimiter) and isinstance(window, WindowLimiter)


def test_shared_limiter_refuses_a_conflicting_policy() -> None:
    first = shared_limiter("test-ratelimit-conflict", SpacingPolicy(1.0))
    with pytest.raises(
        ConfigError, match=r"rate limit of 'test-ratelimit-conflict' is already .*1\.0.*got .*3\.0"
    ):
        shared_limiter("test-ratelimit-conflict", SpacingPolicy(3.0))
    assert shared_limiter("test-ratelimit-conflict", SpacingPolicy(1.0)) is first
    assert first.policy.min_interval_s == 1.0  # neither the first nor the last caller changes it silently

    shared_limiter("test-ratelimit-conflict-llm", WindowPolicy(rpm=10))
    with pytest.raises(ConfigError, match="AMAPREDUCE_MODEL_RPM") as info:
        shared_limiter("test-ratelimit-conflict-llm", WindowPolicy(rpm=10, tpm=1000))
    assert info.value.fields["key"] == "test-ratelimit-conflict-llm"


def test_spacing_and_window_limiters_of_one_name_do_not_clash() -> None:
    spacing = shared_limiter("test-ratelimit-both", SpacingPolicy(1.0))
    window = shared_limiter("test-ratelimit-both", WindowPolicy(rpm=5))
    assert shared_limiter("test-ratelimit-both", SpacingPolicy(1.0)) is spacing
    assert shared_limiter("test-ratelimit-both", WindowPolicy(rpm=5)) is window


def test_forgetting_the_shared_limiters_lets_a_long_lived_process_set_new_limits() -> None:
    first = shared_limiter("test-ratelimit-forget", SpacingPolicy(1.0))
    forget_shared_limiters()
    second = shared_limiter("test-ratelimit-forget", SpacingPolicy(3.0))  # no conflict: the old one is gone
    assert second is not first and second.policy.min_interval_s == 3.0
    assert first.policy.min_interval_s == 1.0  # a holder of the old limiter keeps it as it was


def test_a_deferral_holds_every_caller_but_a_retry_that_waited_its_own_retry_after() -> None:
    t = FakeTime()
    limiter = WindowLimiter(WindowPolicy(rpm=2, window_s=60), clock=t.clock, sleep=t.sleep)
    limiter.defer(5.0)  # another caller's 429
    assert limiter.acquire(skip_deferral=True)[0] == 0.0  # a retry that already waited: not held again
    assert limiter.acquire()[0] == 5.0  # any other caller waits for the deferral
    assert limiter.acquire(skip_deferral=True)[0] == 60.0  # the window still holds everyone
