"""Managed models: the provider client for a `ModelSpec`, and the wrapper that makes calls safe to fan out.

Callers get their models from the one model factory, `amapreduce.llm.factory`, which turns
`Settings` into a spec per role and calls `build_model` here. `build_model(spec)` returns a
smolagents `Model` for:

* a LiteLLM model id (`openai/gpt-5-mini`, `anthropic/claude-...`, `ollama/llama3.1`), or
* any OpenAI-compatible endpoint (vLLM, llama.cpp server, Ollama) when `api_base` is set.

It is wrapped in `ManagedModel`, which every call goes through: the stack of wrapper models
composed in `llm.wrappers.stack` (the budget check, the provider's process-wide circuit breaker
and rate limiter, both per HTTP attempt, retries with backoff that honour `Retry-After`, usage
and cost accounting by role, hedges, and a `model_call` trace event per call; `llm.wrappers`
gives their order). Reasoning models get no `temperature`/`max_tokens` (their APIs
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
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from smolagents.models import Model

from amapreduce.errors import ConfigError
from amapreduce.llm.breaker import BreakerPolicy, shared_breaker
from amapreduce.llm.dialect import Adapter, adapters_for
from amapreduce.llm.endpoint import EndpointCapabilities
from amapreduce.llm.meter import UsageMeter, litellm_offline
from amapreduce.llm.retry import ProviderRetryHandler, RetryPolicy
from amapreduce.llm.wrappers.breaker import BreakerGate
from amapreduce.llm.wrappers.meter import cached_tokens
from amapreduce.llm.wrappers.stack import NO_KEY, ManagedModel
from amapreduce.ratelimit import WindowGate, WindowPolicy, shared_limiter

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
    circuit breaker, None for none). Its key is not registered for redaction here: whoever reads
    keys from the settings registers them all once (`llm.factory.ModelFactory`)."""
    if role not in ROLES:
        raise ConfigError(f"unknown model role {role!r}; roles are {', '.join(ROLES)}.")
    limiter = _limiter(provider_of(spec), WindowPolicy(rpm=spec.rpm, tpm=spec.tpm)) if (spec.rpm or spec.tpm) else None
    return ManagedModel(
        inner or _inner_model(spec, role), role=role, meter=meter, limiter=limiter,
        breaker=_breaker(provider_of(spec), breaker) if breaker is not None else None,
        retry=retry, trace=trace, on_retry=on_retry, provider=provider_of(spec),
        capabilities=spec.capabilities if inner is None else None, register_key=False,
    )
