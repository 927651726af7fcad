"""The one model factory: which model serves each role, and the managed model built for it.

Every part of the program that talks to a model (a run's manager, sub-agents and extraction,
the experiential memory, the evaluation judges) gets its model here, from `Settings`, so each
one comes with the same retries, the provider's shared rate limits and circuit breaker, a budget and a usage
meter. It lives in the model layer rather than with the runs so that layers below `run` (the
evaluation scorer, the memory CLI) use the very same factory instead of building their own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from amapreduce.llm.breaker import BreakerPolicy
from amapreduce.llm.endpoint import OPENAI_DIALECT, EndpointCapabilities, endpoint_capabilities
from amapreduce.llm.meter import Budget, Price, PriceTable, UsageMeter, load_price_overrides
from amapreduce.llm.models import NO_KEY, ManagedModel, ModelSpec, build_model
from amapreduce.llm.retry import ProviderRetryHandler
from amapreduce.trace import register_secrets

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.settings import Settings
    from amapreduce.trace import Trace

__all__ = ["build_role_model", "endpoint_for", "model_for_role", "model_timeout_s", "new_meter"]

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


def endpoint_for(settings: Settings, model_id: str) -> EndpointCapabilities | None:
    """What the settings' `api_base` endpoint accepts for `model_id` (None without an `api_base`):
    probed once and kept in the cache folder (`llm.endpoint.endpoint_capabilities`), or OpenAI's
    dialect with `endpoint_probe` off; then each setting that names a trait overrides the finding
    (`message_content`, `tool_choice`, `structured_output`, `context_window`).

    Raises:
        ConfigError: the endpoint cannot be reached or refuses a plain chat request (pre-flight: exit 2).
    """
    if not settings.api_base:
        return None
    if settings.endpoint_probe:
        key = settings.api_key.get_secret_value() if settings.api_key else NO_KEY
        found = endpoint_capabilities(settings.api_base, model_id, cache_dir=settings.cache_dir, api_key=key,
                                      timeout_s=min(60.0, model_timeout_s(settings)))
    else:
        found = OPENAI_DIALECT.model_copy(update={"base_url": settings.api_base, "model_id": model_id})
    update: dict[str, object] = {}
    if settings.message_content != "detect":
        update["list_content"] = settings.message_content == "list"
    if settings.tool_choice != "detect":
        update["tool_choices"] = {"required": ("required", "auto", "named"), "auto": ("auto", "named"),
                                  "off": ()}[settings.tool_choice]
    if settings.structured_output != "detect":
        update["structured"] = settings.structured_output
    if settings.context_window is not None:
        update["context_window"] = settings.context_window
    return found.model_copy(update=update) if update else found


def new_meter(settings: Settings, *, prices_by_prefix: Mapping[str, Price] | None = None) -> UsageMeter:
    """A usage meter with the settings' budget and price overrides, plus `prices_by_prefix` for a
    family of models the caller brings (the demo's simulated ones)."""
    overrides = load_price_overrides(settings.prices_file) if settings.prices_file else None
    return UsageMeter(
        budget=Budget(max_cost_usd=settings.max_cost_usd, max_tokens=settings.max_tokens),
        prices=PriceTable(overrides, by_prefix=prices_by_prefix),
    )


def model_for_role(settings: Settings, role: str) -> str | None:
    """Which model id serves `role` (role override, else the default model; `none` disables)."""
    override = {
        "subagent": settings.subagent_model,
        "extraction": settings.extraction_model,
        "memory": settings.memory_model,
        "judge": settings.judge_model,
    }.get(role)
    chosen = override or settings.model
    return None if chosen is None or chosen.lower() == "none" else chosen


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
    """One role's managed model: the settings' endpoint, key, provider rate limits, circuit
    breaker and retry policy, and `meter` (with its budget) charged for every call.

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

    Every key the settings know (`Settings.secret_values`) is registered for redaction by value
    first: a LiteLLM provider reads its key from the environment, where the spec cannot see it.
    """
    register_secrets(settings.secret_values())
    if capabilities is None and inner is None:
        capabilities = endpoint_for(settings, model_id)
    spec = ModelSpec(
        model_id=model_id,
        api_base=settings.api_base,
        api_key=settings.api_key,
        rpm=settings.model_rpm,
        tpm=settings.model_tpm,
        timeout_s=model_timeout_s(settings),
        capabilities=capabilities,
    )
    return build_model(
        spec,
        role=role,
        meter=meter,
        retry=settings.model_retry_policy(),
        inner=inner,
        trace=trace,
        on_retry=on_retry,
        breaker=BreakerPolicy(
            failures=settings.breaker_failures,
            cooldown_s=settings.breaker_cooldown_s,
            max_wait_s=settings.breaker_max_wait_s,
        ),
    )
