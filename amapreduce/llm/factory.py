"""The one model factory: which model serves each role, and the managed model built for it.

Every part of the program that talks to a model (a run's manager, sub-agents and extraction,
the experiential memory, the evaluation judges) gets its model here, from `Settings`, so each
one comes with the same retries, the provider's shared rate limits and circuit breaker, a budget and a usage
meter. It lives in the model layer rather than with the runs so that layers below `run` (the
evaluation scorer, the memory CLI) use the very same factory instead of building their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from amapreduce.llm.breaker import BreakerPolicy
from amapreduce.llm.meter import Budget, Price, PriceTable, UsageMeter, load_price_overrides
from amapreduce.llm.models import ManagedModel, ModelSpec, build_model
from amapreduce.llm.retry import ProviderRetryHandler
from amapreduce.trace import register_secrets

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.settings import Settings
    from amapreduce.trace import Trace

__all__ = ["build_role_model", "model_for_role", "new_meter"]


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

    Every key the settings know (`Settings.secret_values`) is registered for redaction by value
    first: a LiteLLM provider reads its key from the environment, where the spec cannot see it.
    """
    register_secrets(settings.secret_values())
    spec = ModelSpec(
        model_id=model_id,
        api_base=settings.api_base,
        api_key=settings.api_key,
        rpm=settings.model_rpm,
        tpm=settings.model_tpm,
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
