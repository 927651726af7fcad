"""The one model factory: which model serves each role, and the managed model built for it.

Every part of the program that talks to a model (a run's manager, sub-agents and extraction,
the experiential memory, the evaluation judges) gets its model here, from `Settings`, so each
one comes with the same retries, the provider's shared rate limits and circuit breaker, a budget and a usage
meter. It lives in the model layer rather than with the runs so that layers below `run` (the
evaluation scorer, the memory CLI) use the very same factory instead of building their own.

This is the one place the model layer reads `Settings`: a `ModelFactory` reads them once per run
(or command), registers every key they know for redaction once, resolves which model serves each
role once (`RoleModels`) and keeps only the settings the model layer uses (`ModelSettings`); the
layers of a model's stack (`llm.wrappers`) receive only their own part of those.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import SecretStr

from amapreduce.llm.breaker import BreakerPolicy
from amapreduce.llm.endpoint import OPENAI_DIALECT, EndpointCapabilities, endpoint_capabilities
from amapreduce.llm.meter import Budget, Price, PriceTable, UsageMeter, load_price_overrides
from amapreduce.llm.models import NO_KEY, ROLES, ManagedModel, ModelSpec, build_model
from amapreduce.llm.retry import ProviderRetryHandler, RetryPolicy
from amapreduce.trace import register_secrets

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.settings import Settings
    from amapreduce.trace import Trace

__all__ = ["ModelFactory", "ModelSettings", "RoleModels", "build_role_model", "endpoint_for", "model_for_role",
           "model_timeout_s", "new_meter"]

REMOTE_TIMEOUT_S = 120.0
"""A model request's default timeout on a hosted API."""
LOCAL_TIMEOUT_S = 300.0
"""The same for an endpoint on this machine or a private network: a CPU server computes one
request per slot and queues the others, seconds each."""


def model_timeout_s(settings: Settings) -> float:
    """Seconds one model request may take: `settings.model_timeout_s`, else `LOCAL_TIMEOUT_S` for an
    `api_base` on loopback or a private network, else `REMOTE_TIMEOUT_S`."""
    if settings.model_timeout_s is not None:
        return settings.model_timeout_s
    return LOCAL_TIMEOUT_S if settings.api_base and _is_local(settings.api_base) else REMOTE_TIMEOUT_S


def _is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host in ("localhost", "host.docker.internal") or host.endswith(".local"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The settings the model layer uses (`ModelSettings.of`), and nothing else of `Settings`."""

    api_base: str | None
    api_key: SecretStr | None
    rpm: int | None
    """`model_rpm`: requests per minute for the provider, shared by the whole process."""
    tpm: int | None
    """`model_tpm`: tokens per minute, likewise."""
    timeout_s: float
    """Seconds one model request may take (`model_timeout_s`)."""
    retry: RetryPolicy
    """The `retry_*` settings (`Settings.model_retry_policy`)."""
    breaker: BreakerPolicy
    """The `breaker_*` settings: the provider's shared circuit breaker."""
    endpoint_probe: bool
    cache_dir: Path
    """Where an endpoint's probed capabilities are kept."""
    message_content: str
    tool_choice: str
    structured_output: str
    context_window: int | None

    @classmethod
    def of(cls, settings: Settings) -> ModelSettings:
        """The model layer's part of `settings`."""
        return cls(
            api_base=settings.api_base, api_key=settings.api_key, rpm=settings.model_rpm, tpm=settings.model_tpm,
            timeout_s=model_timeout_s(settings), retry=settings.model_retry_policy(),
            breaker=BreakerPolicy(failures=settings.breaker_failures, cooldown_s=settings.breaker_cooldown_s,
                                  max_wait_s=settings.breaker_max_wait_s),
            endpoint_probe=settings.endpoint_probe, cache_dir=settings.cache_dir,
            message_content=settings.message_content, tool_choice=settings.tool_choice,
            structured_output=settings.structured_output, context_window=settings.context_window,
        )

    def endpoint(self, model_id: str) -> EndpointCapabilities | None:
        """What the `api_base` endpoint accepts for `model_id` (see `endpoint_for`)."""
        if not self.api_base:
            return None
        if self.endpoint_probe:
            key = self.api_key.get_secret_value() if self.api_key else NO_KEY
            found = endpoint_capabilities(self.api_base, model_id, cache_dir=self.cache_dir, api_key=key,
                                          timeout_s=min(60.0, self.timeout_s))
        else:
            found = OPENAI_DIALECT.model_copy(update={"base_url": self.api_base, "model_id": model_id})
        update: dict[str, object] = {}
        if self.message_content != "detect":
            update["list_content"] = self.message_content == "list"
        if self.tool_choice != "detect":
            update["tool_choices"] = {"required": ("required", "auto", "named"), "auto": ("auto", "named"),
                                      "off": ()}[self.tool_choice]
        if self.structured_output != "detect":
            update["structured"] = self.structured_output
        if self.context_window is not None:
            update["context_window"] = self.context_window
        return found.model_copy(update=update) if update else found

    def spec(self, model_id: str, capabilities: EndpointCapabilities | None) -> ModelSpec:
        """How to reach `model_id` with these settings."""
        return ModelSpec(model_id=model_id, api_base=self.api_base, api_key=self.api_key, rpm=self.rpm, tpm=self.tpm,
                         timeout_s=self.timeout_s, capabilities=capabilities)


def endpoint_for(settings: Settings, model_id: str) -> EndpointCapabilities | None:
    """What the settings' `api_base` endpoint accepts for `model_id` (None without an `api_base`):
    probed once and kept in the cache folder (`llm.endpoint.endpoint_capabilities`), or OpenAI's
    dialect with `endpoint_probe` off; then each setting that names a trait overrides the finding
    (`message_content`, `tool_choice`, `structured_output`, `context_window`).

    Raises:
        ConfigError: the endpoint cannot be reached or refuses a plain chat request (pre-flight: exit 2).
    """
    return ModelSettings.of(settings).endpoint(model_id)


def new_meter(settings: Settings, *, prices_by_prefix: Mapping[str, Price] | None = None) -> UsageMeter:
    """A usage meter with the settings' budget and price overrides, plus `prices_by_prefix` for a
    family of models the caller brings (the demo's simulated ones)."""
    overrides = load_price_overrides(settings.prices_file) if settings.prices_file else None
    return UsageMeter(
        budget=Budget(max_cost_usd=settings.max_cost_usd, max_tokens=settings.max_tokens),
        prices=PriceTable(overrides, by_prefix=prices_by_prefix),
    )


@dataclass(frozen=True)
class RoleModels:
    """Which model id serves each role, resolved once from the settings (`RoleModels.of`): the role's
    override, else the default model; a role whose model is `none` (or unset) has none."""

    ids: Mapping[str, str]
    """Model id by role, for the roles that have one."""

    @classmethod
    def of(cls, settings: Settings) -> RoleModels:
        """The roles' models of `settings`."""
        overrides = {
            "subagent": settings.subagent_model,
            "extraction": settings.extraction_model,
            "memory": settings.memory_model,
            "judge": settings.judge_model,
        }
        chosen = {role: overrides.get(role) or settings.model for role in ROLES}
        return cls({role: model for role, model in chosen.items() if model is not None and model.lower() != "none"})

    def get(self, role: str) -> str | None:
        """The model id serving `role` (None: the role has no model)."""
        return self.ids.get(role)


def model_for_role(settings: Settings, role: str) -> str | None:
    """Which model id serves `role` (role override, else the default model; `none` disables), for a
    caller that needs one role once; a run resolves them all once (`ModelFactory.roles`)."""
    return RoleModels.of(settings).get(role)


class ModelFactory:
    """The model layer of one run or command, from its settings read once.

    Built where the run (or command) starts, before anything is written: every key the settings
    know (`Settings.secret_values`, a LiteLLM provider's key from the environment included, which
    no spec sees) is registered for redaction by value here, once; the role models are resolved
    once (`roles`); each model id's endpoint is asked once however many roles it serves (`endpoint`).
    """

    def __init__(self, settings: Settings) -> None:
        register_secrets(settings.secret_values())
        self.roles = RoleModels.of(settings)
        self.config = ModelSettings.of(settings)
        self._endpoints: dict[str, EndpointCapabilities | None] = {}

    def endpoint(self, model_id: str) -> EndpointCapabilities | None:
        """What the `api_base` endpoint accepts for `model_id` (`endpoint_for`), asked once."""
        if model_id not in self._endpoints:
            self._endpoints[model_id] = self.config.endpoint(model_id)
        return self._endpoints[model_id]

    def build(
        self,
        role: str,
        model_id: str,
        *,
        meter: UsageMeter,
        inner: Model | None = None,
        trace: Trace | None = None,
        on_retry: ProviderRetryHandler | None = None,
        capabilities: EndpointCapabilities | None = None,
    ) -> ManagedModel:
        """One role's managed model (see `build_role_model`)."""
        if capabilities is None and inner is None:
            capabilities = self.endpoint(model_id)
        return build_model(self.config.spec(model_id, capabilities), role=role, meter=meter, retry=self.config.retry,
                           inner=inner, trace=trace, on_retry=on_retry, breaker=self.config.breaker)


def build_role_model(
    settings: Settings,
    role: str,
    model_id: str,
    *,
    meter: UsageMeter,
    inner: Model | None = None,
    trace: Trace | None = None,
    on_retry: ProviderRetryHandler | None = None,
    capabilities: EndpointCapabilities | None = None,
) -> ManagedModel:
    """One role's managed model, for a command that needs one: the settings' endpoint, key,
    provider rate limits, circuit breaker and retry policy, and `meter` (with its budget) charged
    for every call (`ModelFactory(settings).build`: every key the settings know is registered first).

    Args:
        settings: where the endpoint (`api_base`), key, `model_rpm`/`model_tpm`, the
            `breaker_*` policy and the `retry_*` policy come from.
        role: one of `ROLES`.
        model_id: the model serving the role (see `model_for_role`).
        meter: the usage meter the calls are charged to (see `new_meter`).
        inner: replaces the provider client (a simulated model in the demo and tests).
        trace: where every call and retry is recorded (`model_call`, `model_retry` events).
        on_retry: told of each provider retry.
        capabilities: what the `api_base` endpoint accepts (`endpoint_for`); None: found now
            (probed, or read from the cache folder) when the settings name an `api_base` and no
            `inner` replaces the client.
    """
    return ModelFactory(settings).build(role, model_id, meter=meter, inner=inner, trace=trace, on_retry=on_retry,
                                        capabilities=capabilities)
