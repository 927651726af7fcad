"""The per-provider circuit breaker: a provider outage is detected after K requests and calls then
fail fast with `ProviderUnavailable`, instead of every worker spending every retry."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import httpx
import openai
import pytest
from fake_clock import FakeTime
from smolagents.models import ChatMessage, MessageRole

from amapreduce.errors import BudgetExceeded, ConfigError, ProviderUnavailable, find_cause
from amapreduce.llm.breaker import (
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    forget_shared_breakers,
    is_outage,
    shared_breaker,
)
from amapreduce.llm.factory import build_role_model, new_meter
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ManagedModel, ModelSpec, build_model, provider_of
from amapreduce.llm.retry import RetryPolicy
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1")
DOWN = openai.InternalServerError("bad gateway", response=httpx.Response(502, request=REQUEST), body=None)
RATE_LIMITED = openai.RateLimitError("slow down", response=httpx.Response(429, request=REQUEST), body=None)
REFUSED = openai.BadRequestError("context too long", response=httpx.Response(400, request=REQUEST), body=None)
HI = [ChatMessage(role=MessageRole.USER, content="hi")]


def breaker(
    time: FakeTime, *, failures: int = 3, cooldown_s: float = 30.0, max_wait_s: float = 0.0
) -> CircuitBreaker:
    policy = BreakerPolicy(failures=failures, cooldown_s=cooldown_s, max_wait_s=max_wait_s)
    return CircuitBreaker("test-provider", policy, clock=time.clock, sleep=time.sleep)


def state(b: CircuitBreaker) -> BreakerState:
    """The breaker's state, read afresh (a call, so type checkers do not narrow it between reads)."""
    return b.state


def fail(b: CircuitBreaker, times: int, *, probe: bool = False) -> None:
    for _ in range(times):
        b.record(probe, "InternalServerError: bad gateway")


def test_outages_are_5xx_timeouts_and_connection_errors_only() -> None:
    assert is_outage(DOWN) and is_outage(TimeoutError()) and is_outage(ConnectionError("refused"))
    assert not is_outage(RATE_LIMITED) and not is_outage(REFUSED) and not is_outage(ValueError("bad reply"))


def test_opens_after_k_outage_failures_in_a_row_and_an_answer_resets_the_count() -> None:
    time = FakeTime()
    b = breaker(time)
    fail(b, 2)
    b.record(False, None)  # an answer (a reply, a 429, a 4xx) shows the provider is up
    fail(b, 2)
    assert state(b) is BreakerState.CLOSED and b.admit() is False
    fail(b, 1)
    assert state(b) is BreakerState.OPEN


def test_fails_fast_while_open() -> None:
    time = FakeTime()
    b = breaker(time)
    fail(b, 3)
    with pytest.raises(ProviderUnavailable) as caught:
        b.admit()
    err = caught.value
    assert (
        err.provider == "test-provider"
        and err.failures == 3
        and err.last_error == "InternalServerError: bad gateway"
    )
    assert "\n" not in str(err) and "provider 'test-provider' is unavailable" in str(err)
    assert "AMAPREDUCE_BREAKER_MAX_WAIT_S" in str(err)
    assert time.now == 0  # nothing waited
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, ProviderUnavailable) and again.failures == 3 and str(again) == str(err)


def test_callers_wait_for_the_probe_and_give_up_after_max_wait() -> None:
    time = FakeTime()
    b = breaker(time, cooldown_s=30, max_wait_s=100)
    fail(b, 3)
    assert b.admit() is True  # waited out the cool-down, then became the half-open probe
    assert time.now == 30 and state(b) is BreakerState.HALF_OPEN
    b.record(True, "ConnectionError: refused")  # the probe failed: open for another cool-down
    assert state(b) is BreakerState.OPEN
    assert b.admit() is True and time.now == 60
    b.record(True, "ConnectionError: refused")
    assert b.admit() is True and time.now == 90
    b.record(True, "ConnectionError: refused")
    with pytest.raises(ProviderUnavailable, match="ConnectionError: refused") as caught:
        b.admit()  # the next probe would be at 120: past the outage's 100 s of waiting
    assert time.now == 100 and caught.value.failures == 6


def test_half_open_probe_success_closes_and_failure_reopens() -> None:
    time = FakeTime()
    b = breaker(time, cooldown_s=30)
    fail(b, 3)
    time.sleep(30)
    assert b.admit() is True and state(b) is BreakerState.HALF_OPEN
    with pytest.raises(ProviderUnavailable):
        b.admit()  # one probe at a time: the others do not go out
    fail(b, 1, probe=True)
    assert state(b) is BreakerState.OPEN
    with pytest.raises(ProviderUnavailable):
        b.admit()  # a new cool-down began at the failed probe
    time.sleep(30)
    assert b.admit() is True
    b.record(True, None)
    assert state(b) is BreakerState.CLOSED and b.admit() is False
    fail(b, 2)
    assert state(b) is BreakerState.CLOSED  # the count started again


def test_an_interrupted_probe_passes_its_turn_on() -> None:
    time = FakeTime()
    b = breaker(time, cooldown_s=0)
    fail(b, 3)
    assert b.admit() is True
    b.release(True)
    assert b.admit() is True


def test_a_late_failure_of_an_earlier_request_does_not_reopen_a_closed_breaker() -> None:
    time = FakeTime()
    b = breaker(time, cooldown_s=0)
    fail(b, 3)
    assert b.admit() is True
    b.record(False, None)  # a request sent before the outage answered: closed
    fail(b, 1, probe=True)  # the probe's late failure counts, nothing more
    assert state(b) is BreakerState.CLOSED


def test_many_threads_get_one_probe() -> None:
    time = FakeTime()
    b = breaker(time, cooldown_s=10, max_wait_s=60)
    fail(b, 3)
    time.sleep(10)
    results: list[object] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def caller() -> None:
        start.wait()
        try:
            outcome: object = b.admit()
        except ProviderUnavailable as exc:
            outcome = exc
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=caller) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert sum(isinstance(r, ProviderUnavailable) for r in results) == 15


def test_failures_recorded_from_many_threads_are_all_counted() -> None:
    time = FakeTime()
    b = breaker(time, failures=200)
    threads = [threading.Thread(target=fail, args=(b, 10)) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state(b) is BreakerState.OPEN
    with pytest.raises(ProviderUnavailable) as caught:
        b.admit()
    assert caught.value.failures == 200


def test_shared_per_provider_key() -> None:
    policy = BreakerPolicy(failures=1, cooldown_s=30, max_wait_s=0)
    a = shared_breaker("test-breaker-a", policy)
    assert shared_breaker("test-breaker-a", BreakerPolicy(failures=1, cooldown_s=30, max_wait_s=0)) is a
    other = shared_breaker("test-breaker-b", policy)
    a.record(False, "ConnectionError: refused")
    assert state(a) is BreakerState.OPEN and state(other) is BreakerState.CLOSED
    with pytest.raises(ConfigError, match="circuit breaker of 'test-breaker-a'"):
        shared_breaker("test-breaker-a", BreakerPolicy(failures=2, cooldown_s=30, max_wait_s=0))


@pytest.mark.parametrize(
    "bad", [{"failures": 0}, {"cooldown_s": -1.0}, {"max_wait_s": float("inf")}, {"cooldown_s": float("nan")}]
)
def test_policy_refuses_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        BreakerPolicy(**{"failures": 5, "cooldown_s": 30.0, "max_wait_s": 60.0, **bad})


def test_settings_defaults_and_environment_reach_the_models_breaker() -> None:
    defaults = load_settings({})
    assert (defaults.breaker_failures, defaults.breaker_cooldown_s, defaults.breaker_max_wait_s) == (
        5,
        30.0,
        120.0,
    )
    settings = load_settings(
        {
            "AMAPREDUCE_BREAKER_FAILURES": "2",
            "AMAPREDUCE_BREAKER_COOLDOWN_S": "7.5",
            "AMAPREDUCE_BREAKER_MAX_WAIT_S": "0",
        }
    )
    inner = FunctionModel(lambda messages, info: final_answer("x"), model_id="breaker-env/model")
    model = build_role_model(
        settings, "subagent", "breaker-env/model", meter=new_meter(settings), inner=inner
    )
    assert model.breaker is not None and model.breaker.key == "breaker-env"
    assert model.breaker.policy == BreakerPolicy(failures=2, cooldown_s=7.5, max_wait_s=0.0)
    judge = build_role_model(settings, "judge", "breaker-env/other", meter=new_meter(settings), inner=inner)
    assert judge.breaker is model.breaker  # one breaker per provider, every role


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AMAPREDUCE_BREAKER_FAILURES", "0"),
        ("AMAPREDUCE_BREAKER_COOLDOWN_S", "-1"),
        ("AMAPREDUCE_BREAKER_MAX_WAIT_S", "inf"),
    ],
)
def test_bad_breaker_settings_are_refused(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        load_settings({variable: value})


def test_managed_model_fails_fast_without_contacting_the_provider_while_open() -> None:
    time = FakeTime()
    calls: list[float] = []
    healthy = threading.Event()

    def provider(messages: list[Any], info: ModelInfo) -> Any:
        calls.append(time.clock())
        if not healthy.is_set():
            raise DOWN
        return "back"

    model = ManagedModel(
        FunctionModel(provider, model_id="sim-model"),
        role="subagent",
        meter=UsageMeter(),
        breaker=breaker(time, failures=3, cooldown_s=30, max_wait_s=0),
        retry=RetryPolicy(max_retries=5, base_delay_s=0, jitter=0),
        sleep=time.sleep,
    )
    with pytest.raises(ProviderUnavailable) as caught:
        model.generate(HI)
    assert len(calls) == 3  # K requests, not the call's six attempts
    assert find_cause(caught.value, BudgetExceeded) is None  # the cause chain ends
    with pytest.raises(ProviderUnavailable):
        model.generate(HI)
    assert len(calls) == 3  # nothing sent while open
    healthy.set()
    time.sleep(30)
    assert model.generate(HI).content == "back"  # the half-open probe answered
    assert model.breaker is not None and state(model.breaker) is BreakerState.CLOSED and len(calls) == 4


def test_a_down_http_provider_is_detected_after_k_requests_not_every_workers_retries() -> None:
    def broken(messages: list[Any], info: ModelInfo) -> Any:
        raise RuntimeError("upstream down")  # the loopback server answers it with a 500

    policy = BreakerPolicy(failures=3, cooldown_s=3600, max_wait_s=0)
    with (
        OpenAICompatibleServer(FunctionModel(broken, model_id="sim-model")) as server,
        allow_model_requests(),
    ):
        spec = ModelSpec(model_id="sim-model", api_base=server.base_url)
        models = [
            build_model(
                spec,
                role="subagent",
                meter=UsageMeter(),
                retry=RetryPolicy(max_retries=5, base_delay_s=0),
                breaker=policy,
            )
            for _ in range(8)
        ]
        errors: list[ProviderUnavailable] = []
        for model in models:  # eight workers' calls; without the breaker, 8 × 6 = 48 requests
            with pytest.raises(ProviderUnavailable) as caught:
                model.generate(HI)
            errors.append(caught.value)
    assert len(server.requests) == 3
    assert {e.provider for e in errors} == {provider_of(spec)}
    assert "InternalServerError" in str(errors[0])


def test_forgetting_the_shared_breakers_starts_closed_ones() -> None:
    policy = BreakerPolicy(failures=1, cooldown_s=30, max_wait_s=0)
    opened = shared_breaker("test-breaker-forget", policy)
    fail(opened, 1)
    assert state(opened) is BreakerState.OPEN
    forget_shared_breakers()
    fresh = shared_breaker("test-breaker-forget", BreakerPolicy(failures=2, cooldown_s=30, max_wait_s=0))
    assert fresh is not opened and state(fresh) is BreakerState.CLOSED and fresh.admit() is False
