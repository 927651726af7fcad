"""Build a run's parts from settings: models per role, web tools, the sub-agent solver, the engine.

One place decides how every part of a run is connected, so `ask`, `mapreduce run` and the
offline demo differ only in what they plug in (the demo swaps the provider clients for a
simulated model and the web for the sandbox corpus). The models themselves come from the one
model factory, `amapreduce.llm.factory`, which the memory CLI and the evaluation judges use too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amapreduce.errors import ConfigError
from amapreduce.llm.factory import build_role_model, model_for_role, new_meter
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.retry import ProviderRetryHandler
from amapreduce.settings import Settings

if TYPE_CHECKING:
    from smolagents import Model, Tool

    from amapreduce.llm.models import ManagedModel
    from amapreduce.mapreduce.engine import MapReduceEngine, ProgressEvent
    from amapreduce.trace import Trace

__all__ = ["NO_MODEL_HELP", "InnerFactory", "RunParts", "build_parts", "require_model"]

NO_MODEL_HELP = (
    "no model is configured. Pass --model, e.g. `--model openai/gpt-5-mini` (with OPENAI_API_KEY set), "
    "or an OpenAI-compatible server: `--model qwen2.5 --api-base http://127.0.0.1:8000/v1`; "
    "or set AMAPREDUCE_MODEL (and AMAPREDUCE_API_BASE). To try everything offline, run `amapreduce demo`."
)

InnerFactory = Callable[[str], "Model"]
"""Given a role, the provider client to wrap (the demo returns simulated models)."""


def require_model(settings: Settings) -> str:
    """The configured default model id, or a `ConfigError` that says how to set one."""
    if not settings.model:
        raise ConfigError(NO_MODEL_HELP)
    return settings.model


@dataclass(kw_only=True)
class RunParts:
    """Everything a run needs, connected."""

    meter: UsageMeter
    models: dict[str, ManagedModel]
    web_tools: list[Tool]
    engine: MapReduceEngine
    web_usage: Callable[[], dict[str, Any]] = field(default=lambda: {})


def build_parts(
    settings: Settings,
    *,
    trace: Trace,
    meter: UsageMeter | None = None,
    progress: Callable[[ProgressEvent], None] | None = None,
    on_provider_retry: ProviderRetryHandler | None = None,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    roles: tuple[str, ...] = ("manager", "subagent", "extraction"),
) -> RunParts:
    """Connect models, tools, solver and engine for one run.

    Args:
        settings: the run's settings (model ids, limits, budgets, search backend).
        trace: where every call is recorded (model calls and retries included).
        meter: the run's usage meter (default: a new one with the settings' budget).
        progress: engine progress callback.
        on_provider_retry: told of every provider retry of the run's models (429s, 5xx, timeouts).
        inner: replaces the provider clients (simulated models in the demo and tests).
        web_tools: replaces the web tools (e.g. a corpus-only set).
        roles: roles that need a model.
    """
    from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
    from amapreduce.mapreduce.solver import SmolagentsSolver

    meter = meter or new_meter(settings)
    models: dict[str, ManagedModel] = {}
    for role in roles:
        model_id = model_for_role(settings, role)
        if model_id is None:
            if role in ("manager", "subagent"):
                raise ConfigError(NO_MODEL_HELP)
            continue
        models[role] = build_role_model(
            settings, role, model_id, meter=meter, inner=inner(role) if inner is not None else None,
            trace=trace, on_retry=on_provider_retry,
        )
    service = None
    if web_tools is None:
        from amapreduce.web.service import WebService
        from amapreduce.web.tools import build_web_tools

        service = WebService.from_settings(settings)
        web_tools = build_web_tools(settings, service=service, model=models.get("extraction"))
    solver = SmolagentsSolver(model=models["subagent"], tools=web_tools, max_steps=settings.subagent_max_steps)
    engine = MapReduceEngine(
        solver,
        # With a manager, the engine runs the decisions the manager writes; without one, the user's.
        config=EngineConfig.from_settings(settings, decisions_by="manager" if "manager" in roles else "user"),
        trace=trace,
        progress=progress,
    )
    usage = (lambda: service.usage().model_dump()) if service is not None else (lambda: {})
    return RunParts(meter=meter, models=models, web_tools=list(web_tools), engine=engine, web_usage=usage)
