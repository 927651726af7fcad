"""The one place the model stack is composed, and `ManagedModel`, a role's stack as one model.

`compose` wraps a provider's client (or a simulated model) in the layers of this package in the
order its doc gives; `ManagedModel` is what the rest of the program holds: the composed stack,
plus the handles callers read (its client, role, meter, gates, capabilities) and the run's trace
and retry handler, attached once the run's directory exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from smolagents.models import Model

from amapreduce.llm.endpoint import EndpointCapabilities
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.retry import ProviderRetryHandler, RetryPolicy
from amapreduce.llm.usage import Usage
from amapreduce.llm.wrappers.base import WrapperModel, layer_of
from amapreduce.llm.wrappers.breaker import BreakerGate, BreakerModel
from amapreduce.llm.wrappers.budget import BudgetModel
from amapreduce.llm.wrappers.endpoint import EndpointModel
from amapreduce.llm.wrappers.hedge import HedgeModel
from amapreduce.llm.wrappers.limiter import LimiterModel
from amapreduce.llm.wrappers.masking import MaskedModel
from amapreduce.llm.wrappers.meter import MeterModel
from amapreduce.llm.wrappers.retry import RetryModel
from amapreduce.llm.wrappers.trace import CallEvents, SpanModel, TracedModel
from amapreduce.ratelimit import WindowGate
from amapreduce.trace import register_secrets

if TYPE_CHECKING:
    from amapreduce.trace import Trace

__all__ = ["NO_KEY", "ManagedModel", "compose"]

NO_KEY = "not-needed"
"""The key an OpenAI-compatible client is given when none is configured (local servers take any);
not a secret, so never registered for redaction."""


def compose(
    client: Model,
    *,
    meter: UsageMeter,
    events: CallEvents,
    limiter: WindowGate | None = None,
    breaker: BreakerGate | None = None,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], object] | None = None,
    provider: str | None = None,
    capabilities: EndpointCapabilities | None = None,
) -> HedgeModel:
    """`client` wrapped, innermost first: span, limiter (when there is one), breaker, retry, meter,
    trace, masking, endpoint, budget, hedge (the order and why: the package doc)."""
    attempt: Model = SpanModel(client)
    if limiter is not None:
        attempt = LimiterModel(attempt, gate=limiter)
    attempt = BreakerModel(attempt, gate=breaker, provider=provider or events.what, what=events.what)
    call: Model = RetryModel(attempt, policy=retry or RetryPolicy(), events=events, provider=provider, sleep=sleep,
                             defer=limiter.defer if limiter is not None else None)
    call = MeterModel(call, meter=meter, role=events.role)
    call = TracedModel(call, events=events)
    call = MaskedModel(call)
    call = EndpointModel(call, capabilities=capabilities)
    call = BudgetModel(call, meter=meter)
    return HedgeModel(call, meter=meter, limiter=limiter, events=events)


class ManagedModel(WrapperModel):
    """A model whose every call is budgeted, guarded by a circuit breaker, rate-limited, retried,
    metered and traced: `compose`'s stack over `inner`.

    Each HTTP attempt, the first and every retry after its backoff, is admitted by the provider's
    circuit breaker (it may wait while the breaker is open, or raise `ProviderUnavailable` without
    sending anything) and takes its own ticket from the provider's limiter. Each call writes one
    `model_call` trace event and each retry one `model_retry` event, tagged with the batch and
    attempt of the open `usage_scope`. A request the provider refuses for good is not retried: the
    call raises `ProviderRejected`, which stops the run. The messages sent have every registered
    secret masked (keys are registered where runs and commands read them from the settings).

    Args:
        inner: the model that talks to the provider (or a simulated model).
        role: what the model is used for (`manager`, `subagent`, ...), for usage by role.
        meter: the run's usage meter (and budget).
        limiter: the provider's shared limiter (None: unlimited); a `Retry-After` a provider sends
            defers it for every caller.
        breaker: the provider's shared circuit breaker (None: none).
        retry: the retry policy.
        sleep: replaces `time.sleep` between retries (tests).
        trace: where call and retry events go (None: not traced).
        on_retry: told of each retry as a `ProviderRetry` (e.g. to count retries in progress).
        provider: the provider's key in a `ProviderRejected` (`build_model`: `provider_of(spec)`).
        capabilities: what the provider's endpoint accepts (`ModelSpec.capabilities`).
        register_key: register the client's API key for redaction by value (`trace.register_secrets`),
            so an error that echoes it is masked in every message, trace event and prompt; False
            where the caller registered it already (`build_model`: the factory registers every key
            of the settings once per run).
    """

    def __init__(
        self,
        inner: Model,
        *,
        role: str,
        meter: UsageMeter,
        limiter: WindowGate | None = None,
        breaker: BreakerGate | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], object] | None = None,
        trace: Trace | None = None,
        on_retry: ProviderRetryHandler | None = None,
        provider: str | None = None,
        capabilities: EndpointCapabilities | None = None,
        register_key: bool = True,
    ) -> None:
        if register_key:
            client_kwargs = getattr(inner, "client_kwargs", None)
            keys = (getattr(inner, "api_key", None),
                    client_kwargs.get("api_key") if isinstance(client_kwargs, dict) else None)
            register_secrets(key for key in keys if key != NO_KEY)
        self.events = CallEvents(role=role, model_id=inner.model_id, trace=trace, on_retry=on_retry)
        """Where the stack's events go; `trace` and `on_retry` read and set it."""
        super().__init__(compose(inner, meter=meter, events=self.events, limiter=limiter, breaker=breaker,
                                 retry=retry, sleep=sleep, provider=provider, capabilities=capabilities))
        self.inner = inner
        self.role = role
        self.meter = meter
        self.limiter = limiter
        self.breaker = breaker
        self.provider = provider
        self._retry = layer_of(self, RetryModel)
        self._endpoint = layer_of(self, EndpointModel)

    @property
    def trace(self) -> Trace | None:
        """Where call, retry and hedge events go (None: not traced)."""
        return self.events.trace

    @trace.setter
    def trace(self, trace: Trace | None) -> None:
        self.events.trace = trace

    @property
    def on_retry(self) -> ProviderRetryHandler | None:
        """Told of each provider retry."""
        return self.events.on_retry

    @on_retry.setter
    def on_retry(self, handler: ProviderRetryHandler | None) -> None:
        self.events.on_retry = handler

    @property
    def retry(self) -> RetryPolicy:
        """The retry layer's policy."""
        return self._retry.policy

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self._retry.policy = policy

    @property
    def capabilities(self) -> EndpointCapabilities | None:
        """What the model's endpoint accepts (`llm.endpoint`); None: not an `api_base` endpoint, or
        a client given by the caller (a simulated model)."""
        return self._endpoint.capabilities

    @capabilities.setter
    def capabilities(self, capabilities: EndpointCapabilities | None) -> None:
        self._endpoint.capabilities = capabilities

    def has_room_for(self, usage: Usage) -> bool:
        """Whether one more optional piece of work of about `usage` (a straggler's backup
        attempt, `mapreduce.backup`) may start now: the run's budget would not be reached, the
        provider's breaker is closed, it has not asked us to slow down (a 429 within the wait it
        asked for, or within its backoff), and its limiter would admit the first request at once.
        Gates kept elsewhere (a Ray cluster's) are not asked; the calls still pass through them."""
        return super().has_room_for(usage)

