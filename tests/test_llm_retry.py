"""Model-call retries: classification by type/status, Retry-After honoured, never a None reply."""

from __future__ import annotations

import random

import httpx
import openai
import pytest

from amapreduce._retry import RETRY_AFTER_SPREAD
from amapreduce.errors import ProviderRejected
from amapreduce.llm.retry import ModelCallError, RetryPolicy, call_with_retries, classify


def status_error(cls: type[openai.APIStatusError], status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request)
    return cls("boom", response=response, body=None)


def test_classification() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/v1")
    assert classify(status_error(openai.RateLimitError, 429, {"retry-after": "7"})).retry_after_s == 7  # type: ignore[union-attr]
    assert classify(status_error(openai.RateLimitError, 429, {"retry-after-ms": "1500"})).retry_after_s == 1.5  # type: ignore[union-attr]
    assert classify(status_error(openai.InternalServerError, 503)).kind == "server"  # type: ignore[union-attr]
    assert classify(openai.APITimeoutError(request=request)).kind == "timeout"  # type: ignore[union-attr]
    assert classify(openai.APIConnectionError(request=request)).kind == "connection"  # type: ignore[union-attr]
    assert classify(status_error(openai.BadRequestError, 400)) is None
    assert classify(ValueError("bad")) is None


def test_retry_after_is_honoured_and_backoff_grows() -> None:
    sleeps: list[float] = []
    errors = iter([status_error(openai.RateLimitError, 429, {"retry-after": "7"}), status_error(openai.InternalServerError, 502)])

    def call() -> str:
        err = next(errors, None)
        if err is not None:
            raise err
        return "ok"

    policy = RetryPolicy(base_delay_s=1, jitter=0)
    assert call_with_retries(call, what="test", policy=policy, sleep=sleeps.append) == "ok"
    assert sleeps == [7.0, 2.0]  # the Retry-After asked; then 2 s (the second retry, doubled)


def test_jitter_stays_within_bounds() -> None:
    sleeps: list[float] = []

    def call() -> str:
        raise status_error(openai.InternalServerError, 500)

    with pytest.raises(ModelCallError):
        call_with_retries(call, what="x", policy=RetryPolicy(max_retries=4, base_delay_s=1, jitter=0.25), sleep=sleeps.append, rng=random.Random(1))
    for attempt, slept in enumerate(sleeps):
        assert 0.75 * 2**attempt <= slept <= 1.25 * 2**attempt


def test_exhausted_retries_raise_a_clear_error() -> None:
    def call() -> str:
        raise status_error(openai.RateLimitError, 429)

    with pytest.raises(ModelCallError, match=r"failed after 3 attempts \(rate_limit\).*lower --workers") as info:
        call_with_retries(call, what="manager model 'x'", policy=RetryPolicy(max_retries=2, base_delay_s=0), sleep=lambda s: None)
    assert info.value.kind == "rate_limit"
    assert isinstance(info.value.__cause__, openai.RateLimitError)


def test_permanent_errors_are_not_retried() -> None:
    """A refused key stops the run (`ProviderRejected`, tests/test_permanent_errors.py); any other
    permanent error fails the call at once, unretried."""
    calls = []

    def call() -> str:
        calls.append(1)
        raise status_error(openai.AuthenticationError, 401)

    with pytest.raises(ProviderRejected, match="AuthenticationError"):
        call_with_retries(call, what="x", policy=RetryPolicy(), sleep=lambda s: None)
    assert len(calls) == 1

    def other() -> str:
        calls.append(1)
        raise ValueError("the reply could not be read")

    with pytest.raises(ModelCallError, match="ValueError"):
        call_with_retries(other, what="x", policy=RetryPolicy(), sleep=lambda s: None)
    assert len(calls) == 2


def test_retry_after_is_a_wait_not_a_floor_under_exponential_growth() -> None:
    """Issue 28: four 429s in a row with `Retry-After: 1` waited 1.15, 1.74, 3.65 and 7.02 s; each
    now waits the second asked plus at most `RETRY_AFTER_SPREAD`, and growth resumes without one."""
    sleeps: list[float] = []
    errors = iter([*(status_error(openai.RateLimitError, 429, {"retry-after": "1"}) for _ in range(4)),
                   status_error(openai.InternalServerError, 502)])

    def call() -> str:
        err = next(errors, None)
        if err is not None:
            raise err
        return "ok"

    policy = RetryPolicy(base_delay_s=1, jitter=0.25)
    assert call_with_retries(call, what="test", policy=policy, sleep=sleeps.append, rng=random.Random(3)) == "ok"
    assert all(1.0 <= s <= 1.0 + RETRY_AFTER_SPREAD for s in sleeps[:4]), sleeps
    assert len(set(sleeps[:4])) > 1  # jittered: parallel callers do not return in lockstep
    assert 0.75 * 16 <= sleeps[4] <= 1.25 * 16  # the fifth failure has no Retry-After: exponential (2**4 s)
