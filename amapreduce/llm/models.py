"""Managed models: the provider client for a `ModelSpec`, and the wrapper that makes calls safe to fan out.

Callers get their models from the one model factory, `amapreduce.llm.factory`, which turns
`Settings` into a spec per role and calls `build_model` here. `build_model(spec)` returns a
smolagents `Model` for:

* a LiteLLM model id (`openai/gpt-5-mini`, `anthropic/claude-...`, `ollama/llama3.1`), or
* any OpenAI-compatible endpoint (vLLM, llama.cpp server, Ollama) when `api_base` is set.

It is wrapped in `ManagedModel`, which every call goes through: the budget check, the
provider's process-wide circuit breaker and rate limiter (both per HTTP attempt, retries
included), retries with backoff that honour `Retry-After`, usage and cost accounting by role (cached prompt tokens
included), and a `model_call` trace event per call. Reasoning models get no `temperature`/`max_tokens` (their APIs
reject them). The provider clients' own retries (openai's `max_retries`, LiteLLM's
`num_retries`, smolagents' `retryer`) are switched off so exactly one policy applies.

Where a provider's limiter and breaker live: this process's (`ratelimit.shared_limiter`,
`breaker.shared_breaker`) unless a process installed other `ProviderGates` with
`use_provider_gates` — a worker of a Ray run installs the cluster's (`cluster.limits`), so every
worker of the cluster takes its tickets from one window and sees one breaker. The seam is plain
Python: nothing here knows Ray.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from smolagents.models import ChatMessage, Model

from amapreduce import telemetry
from amapreduce.breaker import BreakerState, CircuitBreaker
from amapreduce.errors import ConfigError, ProviderUnavailable
from amapreduce.llm.breaker import BreakerPolicy, is_outage, record_answer, shared_breaker, unreachable
from amapreduce.llm.dialect import Adapter, adapters_for
from amapreduce.llm.endpoint import EndpointCapabilities
from amapreduce.llm.hedge import HedgeOutcome, Hedger
from amapreduce.llm.messages import estimate_tokens, message_text, without_secrets
from amapreduce.llm.meter import UsageMeter, litellm_offline
from amapreduce.llm.retry import (
    ModelCallError,
    ProviderRetry,
    ProviderRetryHandler,
    RetryPolicy,
    Transient,
    call_with_retries,
)
from amapreduce.llm.scope import scope_cancelled, scope_extra_calls, scope_labels, scope_reply_tokens
from amapreduce.llm.usage import Usage
from amapreduce.ratelimit import WindowGate, WindowLimiter, WindowPolicy, shared_limiter
from amapreduce.trace import redact_secrets, register_secrets

if TYPE_CHECKING:
    from amapreduce.trace import Trace

__all__ = [
    "NO_KEY",
    "ROLES",
    "BreakerGate",
    "ManagedModel",
    "ModelSpec",
    "ProviderGates",
    "build_model",
    "cached_tokens",
    "is_reasoning_model",
    "provider_of",
    "use_provider_gates",
]

ROLES = ("manager", "subagent", "extraction", "memory", "judge")
"""The roles a run assigns models to; each may use its own model."""

NO_KEY = "not-needed"
"""The key an OpenAI-compatible client is given when none is configured (local servers take any);
not a secret, so never registered for redaction."""

_REASONING = re.compile(r"(^|/)(o1|o3|o4|gpt-5)([-.]|$)|deepseek-r1|reasoner", re.IGNORECASE)


class ModelSpec(BaseModel):
    """Which model serves a role, and how to reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str = Field(min_length=1)
    """LiteLLM id (`openai/gpt-5-mini`) or, with `api_base`, the server's model name."""
    api_base: str | None = None
    """An OpenAI-compatible endpoint, e.g. `http://127.0.0.1:8000/v1`."""
    api_key: SecretStr | None = None
    temperature: float | None = 0.0
    max_tokens: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute for this provider, shared by the whole process."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute for this provider, shared by the whole process."""
    capabilities: EndpointCapabilities | None = None
    """What the `api_base` endpoint accepts (`llm.endpoint`, probed in pre-flight): the request
    adapters of its dialect are chosen from it (`llm.dialect.adapters_for`); None: OpenAI's own
    dialect, requests sent as smolagents builds them."""


class BreakerGate(Protocol):
    """What a model call needs of its provider's circuit breaker (`breaker.CircuitBreaker` is one)."""

    def admit(self) -> bool:
        """Wait until a request may be sent; True when it is the half-open probe (raises the
        breaker's error when the provider is down)."""

    def record(self, probe: bool, outage: str | None) -> None:
        """Report a request's outcome (`outage`: why it failed as an outage; None: it answered)."""

    def release(self, probe: bool) -> None:
        """A request ended without an outcome."""


class ProviderGates(Protocol):
    """Where providers' rate limiters and circuit breakers live (see the module doc)."""

    def limiter(self, key: str, policy: WindowPolicy) -> WindowGate:
        """The limiter every caller of provider `key` shares."""

    def breaker(self, key: str, policy: BreakerPolicy) -> BreakerGate:
        """The circuit breaker every caller of provider `key` shares."""


_gates: ProviderGates | None = None


def use_provider_gates(gates: ProviderGates | None) -> ProviderGates | None:
    """Make models built from now on in this process use `gates` (None: this process's own
    limiters and breakers); return the gates in force before, so a caller can put them back."""
    global _gates
    previous, _gates = _gates, gates
    return previous


def _limiter(key: str, policy: WindowPolicy) -> WindowGate:
    return _gates.limiter(key, policy) if _gates is not None else shared_limiter(key, policy)


def _breaker(key: str, policy: BreakerPolicy) -> BreakerGate:
    return _gates.breaker(key, policy) if _gates is not None else shared_breaker(key, policy)


def is_reasoning_model(model_id: str) -> bool:
    """Models whose APIs refuse sampling parameters (o-series, GPT-5, R1-style reasoners)."""
    return bool(_REASONING.search(model_id))


def provider_of(spec: ModelSpec) -> str:
    """The rate-limit and circuit-breaker key of a spec: the endpoint's host, or the LiteLLM provider prefix."""
    if spec.api_base:
        return urlparse(spec.api_base).netloc or spec.api_base
    return spec.model_id.split("/", 1)[0] if "/" in spec.model_id else "openai"


def _sampling(spec: ModelSpec) -> dict[str, Any]:
    if is_reasoning_model(spec.model_id):
        return {}
    params: dict[str, Any] = {}
    if spec.temperature is not None:
        params["temperature"] = spec.temperature
    if spec.max_tokens is not None:
        params["max_tokens"] = spec.max_tokens
    return params


def _adapters(spec: ModelSpec, role: str) -> tuple[Adapter, ...]:
    """The request adapters of the endpoint's dialect for `role` (none for OpenAI's own dialect)."""
    if spec.capabilities is None:
        return ()
    return adapters_for(spec.capabilities, role=role, max_tokens=spec.max_tokens,
                        reasoning=is_reasoning_model(spec.model_id))


def _inner_model(spec: ModelSpec, role: str = "subagent") -> Model:
    key = spec.api_key.get_secret_value() if spec.api_key else None
    if spec.api_base:
        from smolagents import OpenAIModel

        from amapreduce.llm.chat_client import ChatCompletionsClient

        return OpenAIModel(
            model_id=spec.model_id,
            # our lean client, not the openai SDK's: smolagents builds the request and reads the reply
            client=ChatCompletionsClient(base_url=spec.api_base, api_key=key or NO_KEY, timeout_s=spec.timeout_s,
                                         adapters=_adapters(spec, role)),
            retry=False,  # smolagents' own retryer would sleep ~60 s on a 429 beneath our policy
            **_sampling(spec),
        )
    if "/" not in spec.model_id:
        raise ConfigError(
            f"model {spec.model_id!r} needs a provider prefix (e.g. 'openai/{spec.model_id}') or --api-base "
            "pointing at an OpenAI-compatible server."
        )
    litellm_offline()
    try:
        import litellm
        from smolagents import LiteLLMModel

        litellm.suppress_debug_info = True  # its "Give Feedback / Get Help" lines on stdout with every mapped error
        if key is None:
            _require_provider_key(litellm, spec.model_id)
        return LiteLLMModel(
            model_id=spec.model_id, api_key=key, num_retries=0, timeout=spec.timeout_s, retry=False, **_sampling(spec)
        )
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"model {spec.model_id!r} needs LiteLLM: pip install 'amapreduce[litellm]' "
            "(or use --api-base with an OpenAI-compatible server)."
        ) from exc


def _require_provider_key(litellm: Any, model_id: str) -> None:
    """Refuse, before any call, a LiteLLM model whose provider takes nothing but an API key when
    no key is set (LiteLLM would report each call as an HTTP 500 and the run would retry it for a
    minute). Providers that can authenticate otherwise (a local Ollama, AWS or Google credentials,
    Azure's endpoint settings) name other variables among the missing ones and are left to LiteLLM.

    Raises:
        ConfigError: the provider's key variable is unset.
    """
    missing = list(litellm.validate_environment(model=model_id).get("missing_keys") or [])
    if missing and all(name.endswith("_API_KEY") for name in missing):
        names = " or ".join(missing)
        raise ConfigError(f"model {model_id!r} needs an API key and none is set: export {names} (or AMAPREDUCE_API_KEY).")


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def cached_tokens(raw: Any) -> int:
    """Prompt tokens served from the provider's cache, read from a raw reply (0 when not reported).

    smolagents' `TokenUsage` has no cached count, so it comes from the provider's own usage
    object: OpenAI and LiteLLM report `usage.prompt_tokens_details.cached_tokens`, Anthropic
    `usage.cache_read_input_tokens`. Both count them inside the prompt tokens (LiteLLM adds
    Anthropic's cache reads to `prompt_tokens`), which is how `PriceTable.cost` prices them.
    """
    usage = _field(raw, "usage")
    if usage is None:
        return 0
    for value in (_field(_field(usage, "prompt_tokens_details"), "cached_tokens"), _field(usage, "cache_read_input_tokens")):
        if isinstance(value, int) and value > 0:
            return value
    return 0


@dataclass
class _Call:
    """What happened during one `generate`, across its HTTP attempts."""

    attempts: int = 0
    error: BaseException | None = None
    ticket: list[float] | None = None
    probe: bool = False
    """Whether the attempt in flight is its provider's half-open breaker probe."""
    failed_at: float | None = None
    """`time.monotonic()` when the last attempt failed transiently (its wait starts then)."""
    waited_retry_after: bool = False
    """Whether the retry about to be sent waited the `Retry-After` of its own 429 (the limiter
    then holds it by its window only: `WindowGate.acquire(skip_deferral=True)`)."""
    waits: list[dict[str, Any]] = field(default_factory=list)
    """One per retry: why (`kind`), what the server asked (`retry_after_s`, None if nothing), the
    retry loop's backoff (`delay_s`) and how long the call really waited before sending again
    (`waited_s`: the backoff plus any wait for the breaker and the limiter, and the scheduler's
    delay; None when the retry was never sent), for the `model_call` event's `retry_waits`: what
    shows whether a retry waited longer than its `Retry-After` asked (`benchmarks/bench_oracle.py`)."""


class ManagedModel(Model):
    """A model whose every call is budgeted, guarded by a circuit breaker, rate-limited, retried,
    metered and traced.

    Each HTTP attempt — the first and every retry, after its backoff — is first admitted by the
    provider's circuit breaker (it may wait while the breaker is open, or raise
    `ProviderUnavailable` without sending anything) and reports its outcome to it. Each HTTP attempt — the first and every retry — takes its own ticket from the provider's
    limiter, since each one is a request the provider counts. Each call writes one `model_call`
    trace event (role, model id, tokens, latency, retries and the waits before them, error) and each retry one
    `model_retry` event, tagged with the batch and attempt of the open `usage_scope`. A request
    the provider refuses for good (a wrong key, no such model: `llm.retry.rejected_status`) is not
    retried: the call raises `ProviderRejected`, which stops the run. The messages sent have every
    registered secret masked (`llm.messages.without_secrets`).

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

    The inner client's API key is registered for redaction by value (`trace.register_secrets`):
    an error that echoes it is masked in every message, trace event and prompt.
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
        sleep: Any = None,
        trace: Trace | None = None,
        on_retry: ProviderRetryHandler | None = None,
        provider: str | None = None,
        capabilities: EndpointCapabilities | None = None,
    ) -> None:
        super().__init__(model_id=inner.model_id)
        self.capabilities = capabilities
        """What the model's endpoint accepts (`llm.endpoint`); None: not an `api_base` endpoint, or
        a client given by the caller (a simulated model)."""
        client_kwargs = getattr(inner, "client_kwargs", None)
        keys = (getattr(inner, "api_key", None), client_kwargs.get("api_key") if isinstance(client_kwargs, dict) else None)
        register_secrets(key for key in keys if key != NO_KEY)
        self.provider = provider
        self.inner = inner
        self.role = role
        self.meter = meter
        self.limiter = limiter
        self.breaker = breaker
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self.trace = trace
        self.on_retry = on_retry
        self._slowed_until = float("-inf")
        """`time.monotonic()` until which the provider asked us to slow down (its last 429 and the
        wait it asked for): no optional work (`has_room_for`) starts before then."""
        client: Any = getattr(inner, "client", None)
        if getattr(client, "hedger", False) is None:  # our OpenAI-compatible client (`llm.chat_client`)
            client.hedger = Hedger(admit=self._may_hedge, report=self._hedged)

    def _may_hedge(self, request_bytes: int, again: bool, overdue: float = 1.0) -> bool:
        """Whether a late request of the call in this context may get its hedge (`llm.hedge`): the
        call belongs to a run's attempt whose extra-call budget has room, and one more request fits
        `has_room_for`; the hedge's call is charged to the budget and takes a limiter ticket."""
        extra = scope_extra_calls()
        estimate = max(1, request_bytes // 4)
        if extra is None or scope_cancelled() or not self.has_room_for(Usage(requests=1, input_tokens=estimate)):
            return False
        if not extra.take_hedge(again=again, overdue=overdue):
            return False
        if self.limiter is not None:
            self.limiter.acquire(estimate)
        return True

    def _hedged(self, outcome: HedgeOutcome[Any]) -> None:
        """Count each request that lost a hedged call (its reply's usage, or for a cancelled one its
        prompt's estimate) and trace the hedge (`model_hedge`)."""
        total = Usage()
        kinds: list[str] = []
        for loser in outcome.losers:
            used = getattr(loser, "usage", None)
            usage = Usage(
                requests=1,
                input_tokens=int(getattr(used, "prompt_tokens", None) or max(1, outcome.request_bytes // 4)),
                output_tokens=int(getattr(used, "completion_tokens", None) or 0),
            )
            total = total + self.meter.record(self.role, self.model_id or "unknown", usage)
            kinds.append("answered" if used is not None else "cancelled")
        self._write("model_hedge", winner=outcome.winner, hedges=outcome.hedges, after_s=round(outcome.after_s, 6),
                    threshold_s=round(outcome.threshold_s, 6), losers=kinds,
                    usage=total.to_json(), hedge_error=self._describe_text(outcome.hedge_error))

    def has_room_for(self, usage: Usage) -> bool:
        """Whether one more optional piece of work of about `usage` (a straggler's backup
        attempt, `mapreduce.backup`) may start now: the run's budget would not be reached, the
        provider's breaker is closed, it has not asked us to slow down (a 429 within the wait it
        asked for, or within its backoff), and its limiter would admit the first request at once.
        Gates kept elsewhere (a Ray cluster's) are not asked; the calls still pass through them."""
        if self.meter.would_cross(usage) or time.monotonic() < self._slowed_until:
            return False
        if isinstance(self.breaker, CircuitBreaker) and self.breaker.state is not BreakerState.CLOSED:
            return False
        per_request = usage.input_tokens // max(1, usage.requests)
        return not (isinstance(self.limiter, WindowLimiter) and self.limiter.wait_s(per_request) > 0)

    def _describe(self, exc: BaseException | None) -> str | None:
        """An error for the trace: capped at 1,000 characters, and never a key (servers may echo it)."""
        if exc is None:
            return None
        return redact_secrets(f"{type(exc).__name__}: {exc}")[:1000]

    @staticmethod
    def _describe_text(text: str | None) -> str | None:
        return None if text is None else redact_secrets(text)[:1000]

    def _write(self, event: str, **data: Any) -> None:
        if self.trace is not None and self.trace.enabled:
            self.trace.write(event, **{"role": self.role, "model_id": self.model_id, **scope_labels(), **data})

    def generate(
        self,
        messages: list[ChatMessage],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        self.meter.check()
        budget = scope_reply_tokens()
        if budget is not None and "max_tokens" not in kwargs and self.capabilities is not None:
            kwargs["max_tokens"] = budget  # a batch's calls are sized to its rows (`ReplyBudget` caps it to the window)
        messages = without_secrets(messages)  # no configured key is ever sent, whatever text a prompt quotes
        estimate = sum(estimate_tokens(message_text(m)) for m in messages)
        state = _Call()
        breaker = self.breaker
        what = f"{self.role} model {self.model_id!r}"
        provider = self.provider or what
        pause = self._sleep or time.sleep

        def admit() -> None:  # before the first request and before each retry
            if scope_cancelled():  # Ctrl-C, cancel() or a deadline gave the attempt up: send nothing more
                raise ModelCallError(f"{self.role} model {self.model_id!r}: not sent, its attempt was cancelled")
            state.probe = breaker.admit() if breaker is not None else False

        def pause_then_admit(delay_s: float) -> None:  # the retry loop's sleep: a retry is admitted like the first attempt
            pause(delay_s)
            admit()

        def call() -> ChatMessage:
            state.ticket = (self.limiter.acquire(estimate, skip_deferral=state.waited_retry_after)
                            if self.limiter is not None else None)
            if state.failed_at is not None:  # a retry is sent now: what the last failure really cost in waiting
                state.waits[-1]["waited_s"] = round(time.monotonic() - state.failed_at, 6)
                state.failed_at = None
            state.attempts += 1
            try:
                reply = telemetry.traced_generate(  # the simulated models' calls are LLM spans too
                    self.inner,
                    messages,
                    stop_sequences=stop_sequences,
                    response_format=response_format,
                    tools_to_call_from=tools_to_call_from,
                    **kwargs,
                )
            except Exception as exc:
                state.error = exc  # a failed request keeps its ticket: the provider counted it
                if breaker is not None:
                    breaker.record(state.probe, self._describe(exc) if is_outage(exc) else None)
                record_answer(provider, exc)
                never_reached = unreachable(exc, what=what, provider=provider)
                if never_reached is not None:  # a setup problem: said at once, not retried for a minute
                    raise never_reached from exc
                raise
            except BaseException:
                if breaker is not None:
                    breaker.release(state.probe)
                raise
            if breaker is not None:
                breaker.record(state.probe, None)
            record_answer(provider)
            return reply

        def retried(attempt: int, transient: Transient, delay_s: float) -> None:
            state.failed_at = time.monotonic()
            state.waited_retry_after = transient.retry_after_s is not None
            state.waits.append({"kind": transient.kind, "retry_after_s": transient.retry_after_s,
                                "delay_s": round(delay_s, 6), "waited_s": None})
            event = ProviderRetry(
                role=self.role, model_id=self.model_id or "unknown", retry=attempt, kind=transient.kind,
                delay_s=round(delay_s, 3), error=self._describe(state.error),
            )
            self._write("model_retry", **event.trace_fields())
            if transient.retry_after_s is not None and self.limiter is not None:
                self.limiter.defer(min(transient.retry_after_s, self.retry.max_retry_after_s))
            if transient.kind == "rate_limit":
                self._slowed_until = max(self._slowed_until, time.monotonic() + delay_s)
            if self.on_retry is not None:
                self.on_retry(event)

        started = time.monotonic()
        waiting = self.meter.call_started(started)
        try:
            admit()
            reply = call_with_retries(
                call, what=what, policy=self.retry, on_retry=retried, sleep=pause_then_admit, provider=self.provider,
            )
        except (ModelCallError, ProviderUnavailable) as exc:
            self._write(
                "model_call", latency_s=round(time.monotonic() - started, 6), retries=max(0, state.attempts - 1),
                retry_waits=state.waits, usage=None, error=self._describe(exc),
            )
            raise
        finally:
            self.meter.call_ended(waiting)
        used = reply.token_usage
        usage = Usage(
            requests=1,
            input_tokens=used.input_tokens if used else estimate,
            output_tokens=used.output_tokens if used else estimate_tokens(message_text(reply)),
            cached_tokens=cached_tokens(reply.raw),
        )
        if state.ticket is not None and self.limiter is not None:
            self.limiter.settle(state.ticket, usage.total_tokens)
        extra = scope_extra_calls()
        if extra is not None:  # a call of a run that may hedge: the base of its share of late calls
            extra.count_call()
        priced = self.meter.record(self.role, self.model_id or "unknown", usage)
        self._write(
            "model_call", latency_s=round(time.monotonic() - started, 6), retries=state.attempts - 1,
            retry_waits=state.waits, usage=priced.to_json(), error=None,
        )
        return reply


def build_model(
    spec: ModelSpec,
    *,
    role: str,
    meter: UsageMeter,
    retry: RetryPolicy | None = None,
    inner: Model | None = None,
    trace: Trace | None = None,
    on_retry: ProviderRetryHandler | None = None,
    breaker: BreakerPolicy | None = None,
) -> ManagedModel:
    """The managed model for `role` (`inner` replaces the provider client, e.g. a simulated model;
    `trace` and `on_retry` as in `ManagedModel`; `breaker`: the policy of the provider's shared
    circuit breaker, None for none)."""
    if role not in ROLES:
        raise ConfigError(f"unknown model role {role!r}; roles are {', '.join(ROLES)}.")
    register_secrets([spec.api_key.get_secret_value() if spec.api_key else None])
    limiter = _limiter(provider_of(spec), WindowPolicy(rpm=spec.rpm, tpm=spec.tpm)) if (spec.rpm or spec.tpm) else None
    return ManagedModel(
        inner or _inner_model(spec, role), role=role, meter=meter, limiter=limiter,
        breaker=_breaker(provider_of(spec), breaker) if breaker is not None else None,
        retry=retry, trace=trace, on_retry=on_retry, provider=provider_of(spec),
        capabilities=spec.capabilities if inner is None else None,
    )
