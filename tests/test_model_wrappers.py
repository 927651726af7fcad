"""The model seam's layers (`amapreduce.llm.wrappers`), each alone over a scripted model, and the
order `compose` puts them in: a layer's behaviour is tested without the others around it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from smolagents.models import ChatMessage, MessageRole, Model

from amapreduce.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from amapreduce.errors import BudgetExceeded, ProviderUnavailable
from amapreduce.llm.endpoint import OPENAI_DIALECT
from amapreduce.llm.hedge import ExtraCalls, HedgeOutcome, Hedger
from amapreduce.llm.meter import Budget, UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.llm.retry import ModelCallError, ProviderRetry, RetryPolicy
from amapreduce.llm.scope import UsageScope, usage_scope
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel, innermost, layer_of
from amapreduce.llm.wrappers.breaker import BreakerModel
from amapreduce.llm.wrappers.budget import BudgetModel
from amapreduce.llm.wrappers.endpoint import EndpointModel
from amapreduce.llm.wrappers.hedge import HedgeModel
from amapreduce.llm.wrappers.limiter import LimiterModel
from amapreduce.llm.wrappers.masking import MaskedModel
from amapreduce.llm.wrappers.meter import MeterModel
from amapreduce.llm.wrappers.retry import RetryModel
from amapreduce.llm.wrappers.trace import CallEvents, SpanModel, TracedModel
from amapreduce.ratelimit import WindowLimiter, WindowPolicy
from amapreduce.testing.scripted import FunctionModel, ModelInfo
from amapreduce.trace import REDACTED, Trace, register_secrets

HELLO = [ChatMessage(role=MessageRole.USER, content="hello")]


class Events(Trace):
    """A trace kept in memory."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def write(self, event: str, **data: Any) -> None:
        self.events.append((event, data))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [data for name, data in self.events if name == event]


class Recording(Model):
    """Answers "ok" and keeps what each call was sent."""

    def __init__(self) -> None:
        super().__init__(model_id="sim/recording")
        self.sent: list[tuple[list[ChatMessage], dict[str, Any]]] = []

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        self.sent.append((messages, kwargs))
        return ChatMessage(role=MessageRole.ASSISTANT, content="ok")


class Status(Exception):
    """A provider's HTTP error, as the clients raise it (a status code, headers)."""

    def __init__(self, status_code: int, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.headers = {"retry-after": retry_after} if retry_after is not None else {}


def failing(*errors: Exception) -> FunctionModel:
    """Raises `errors` in turn, then answers "ok"."""
    pending = list(errors)

    def reply(messages: list[Any], info: ModelInfo) -> Any:
        if pending:
            raise pending.pop(0)
        return "ok"

    return FunctionModel(reply, model_id="sim/failing")


def layers(model: Model) -> list[type[Model]]:
    found: list[type[Model]] = []
    while isinstance(model, WrapperModel):
        found.append(type(model))
        model = model.wrapped
    return found


def test_the_stack_is_composed_in_its_documented_order() -> None:
    limiter = WindowLimiter(WindowPolicy(rpm=100))
    client = FunctionModel(lambda m, i: "ok")
    model = ManagedModel(client, role="subagent", meter=UsageMeter(), limiter=limiter)
    assert layers(model) == [ManagedModel, HedgeModel, BudgetModel, EndpointModel, MaskedModel, TracedModel,
                             MeterModel, RetryModel, BreakerModel, LimiterModel, SpanModel]
    assert innermost(model) is client and model.inner is client
    assert LimiterModel not in layers(ManagedModel(client, role="subagent", meter=UsageMeter()))  # unlimited: no layer
    with pytest.raises(LookupError, match="LimiterModel"):
        layer_of(ManagedModel(client, role="subagent", meter=UsageMeter()), LimiterModel)


def test_the_budget_layer_refuses_a_call_once_the_budget_is_spent() -> None:
    meter = UsageMeter(budget=Budget(max_tokens=10))
    inner = FunctionModel(lambda m, i: "ok")
    model = BudgetModel(inner, meter=meter)
    assert model.generate(HELLO).content == "ok" and model.has_room_for(Usage(requests=1, input_tokens=5))
    assert not model.has_room_for(Usage(requests=1, input_tokens=50))
    meter.record("subagent", "sim", Usage(requests=1, input_tokens=10))
    with pytest.raises(BudgetExceeded):
        model.generate(HELLO)
    assert inner.calls == 1  # the refused call sent nothing


def test_the_endpoint_layer_sizes_an_endpoints_replies_to_the_batch() -> None:
    inner = Recording()
    model = EndpointModel(inner, capabilities=OPENAI_DIALECT)
    with usage_scope(UsageScope(reply_tokens=300)):
        model.generate(HELLO)
        model.generate(HELLO, max_tokens=20)  # the caller's own wins
    model.generate(HELLO)  # no batch: the role's default
    EndpointModel(inner, capabilities=None).generate(HELLO)  # not an endpoint: nothing added
    assert [kwargs for _, kwargs in inner.sent] == [{"max_tokens": 300}, {"max_tokens": 20}, {}, {}]


def test_the_masking_layer_never_sends_a_registered_key() -> None:
    register_secrets(["sk-wrapper-0123456789"])
    inner = Recording()
    MaskedModel(inner).generate([ChatMessage(role=MessageRole.USER, content="my key is sk-wrapper-0123456789")])
    assert inner.sent[0][0][0].content == f"my key is {REDACTED}"


def test_the_trace_layer_writes_one_event_per_call_with_its_attempts_and_error() -> None:
    trace = Events()
    events = CallEvents(role="judge", model_id="sim/failing", trace=trace)
    model = TracedModel(SpanModel(FunctionModel(lambda m, i: "ok", model_id="sim/failing")), events=events)
    with usage_scope(batch_id="batch-003"):
        model.generate(HELLO)
    (call,) = trace.named("model_call")
    assert call["role"] == "judge" and call["batch_id"] == "batch-003" and call["retries"] == 0
    assert call["usage"] is None and call["error"] is None  # no meter below: nothing charged

    def refuse(messages: list[Any], info: ModelInfo) -> Any:
        raise ModelCallError("judge model failed: nope")

    with pytest.raises(ModelCallError):
        TracedModel(SpanModel(FunctionModel(refuse)), events=events).generate(HELLO)
    assert trace.named("model_call")[-1]["error"] == "ModelCallError: judge model failed: nope"


def test_the_meter_layer_charges_each_call_by_role_and_counts_it_in_flight() -> None:
    meter = UsageMeter()
    model = MeterModel(FunctionModel(lambda m, i: "a reply"), meter=meter, role="memory")
    extra = ExtraCalls(0.05, needed=40)
    with usage_scope(UsageScope(extra_calls=extra)) as scope:
        model.generate(HELLO)
    used = meter.by_role()["memory"]
    assert used.requests == 1 and used.input_tokens > 0 and used.output_tokens > 0
    assert scope.usage("memory") == used and extra.calls == 1 and meter.in_flight()[0] == 0


def test_the_retry_layer_retries_transient_errors_and_defers_the_limiter() -> None:
    slept: list[float] = []
    deferred: list[float] = []
    seen: list[ProviderRetry] = []
    trace = Events()
    events = CallEvents(role="subagent", model_id="sim/failing", trace=trace, on_retry=seen.append)
    model = RetryModel(failing(Status(429, retry_after="2"), Status(503)),
                       policy=RetryPolicy(base_delay_s=0.5, jitter=0, max_retry_after_s=1.5), events=events,
                       sleep=slept.append, defer=deferred.append)
    assert model.generate(HELLO).content == "ok"
    assert [(e.retry, e.kind) for e in seen] == [(1, "rate_limit"), (2, "server")]
    assert [e["kind"] for e in trace.named("model_retry")] == ["rate_limit", "server"]
    assert deferred == [1.5] and slept[0] == pytest.approx(1.5, rel=0.11) and slept[1] == 1.0  # capped, then backoff
    assert not model.has_room_for(Usage(requests=1))  # a 429 asked us to slow down: no optional work yet
    permanent = failing(ValueError("no such tool"))
    with pytest.raises(ModelCallError, match="failed: ValueError: no such tool"):
        RetryModel(permanent, policy=RetryPolicy(), events=events, sleep=slept.append).generate(HELLO)
    assert permanent.calls == 1  # a permanent error is not retried


def test_the_retry_layer_sends_nothing_for_a_cancelled_attempt() -> None:
    inner = FunctionModel(lambda m, i: "ok")
    model = RetryModel(inner, policy=RetryPolicy(), events=CallEvents(role="subagent", model_id="m"))
    with usage_scope(UsageScope(cancelled=lambda: True)), pytest.raises(ModelCallError, match="was cancelled"):
        model.generate(HELLO)
    assert inner.calls == 0


def test_the_breaker_layer_opens_on_outages_and_fails_fast() -> None:
    breaker = CircuitBreaker("wrapper-provider", BreakerPolicy(failures=1, cooldown_s=600.0, max_wait_s=0.0))
    inner = failing(Status(503))
    model = BreakerModel(inner, gate=breaker, provider="wrapper-provider", what="subagent model 'm'")
    assert model.has_room_for(Usage(requests=1))
    with pytest.raises(Status):
        model.generate(HELLO)
    assert breaker.state is BreakerState.OPEN and not model.has_room_for(Usage(requests=1))
    with pytest.raises(ProviderUnavailable):
        model.generate(HELLO)
    assert inner.calls == 1  # the open breaker sent nothing


def test_the_limiter_layer_takes_a_ticket_per_attempt_and_settles_it() -> None:
    taken: list[tuple[int, bool]] = []
    settled: list[int] = []
    gate = SimpleNamespace(acquire=lambda tokens, skip_deferral=False: taken.append((tokens, skip_deferral)) or [0.0, tokens],
                           settle=lambda ticket, tokens: settled.append(tokens), defer=lambda s: None)
    model = LimiterModel(FunctionModel(lambda m, i: "a reply"), gate=gate)
    reply = model.generate(HELLO)
    assert taken == [(2, False)] and reply.token_usage is not None
    assert settled == [reply.token_usage.input_tokens + reply.token_usage.output_tokens]
    busy = LimiterModel(FunctionModel(lambda m, i: "ok"), gate=WindowLimiter(WindowPolicy(rpm=1)))
    assert busy.has_room_for(Usage(requests=1))
    busy.generate(HELLO)
    assert not busy.has_room_for(Usage(requests=1))  # the window is full: no optional work now


def test_the_hedge_layer_admits_within_the_runs_extra_calls_and_charges_the_losers() -> None:
    client = FunctionModel(lambda m, i: "ok")
    client.client = SimpleNamespace(hedger=None)  # type: ignore[attr-defined]  # as our chat client starts
    meter, trace = UsageMeter(), Events()
    model = HedgeModel(BudgetModel(client, meter=meter), meter=meter, limiter=None,
                       events=CallEvents(role="subagent", model_id="m", trace=trace))
    assert isinstance(client.client.hedger, Hedger)  # type: ignore[attr-defined]
    assert not model.may_hedge(400, False)  # outside a run's attempt: no extra calls to spend
    with usage_scope(UsageScope(extra_calls=ExtraCalls(0.05, needed=20))):
        assert model.may_hedge(400, False) and not model.may_hedge(400, False)  # a cap of one extra call
    model.hedged(HedgeOutcome(winner="hedge", after_s=1.0, threshold_s=0.5, losers=(None,), request_bytes=400))
    assert meter.by_role()["subagent"] == Usage(requests=1, input_tokens=100, abandoned=1)  # cancelled: an estimate
    (hedge,) = trace.named("model_hedge")
    assert hedge["losers"] == ["cancelled"] and hedge["winner"] == "hedge"
    plain = FunctionModel(lambda m, i: "ok")
    HedgeModel(plain, meter=meter, limiter=None, events=CallEvents(role="subagent", model_id="m"))
    assert not hasattr(plain, "client")  # a client that cannot hedge is left as it is
