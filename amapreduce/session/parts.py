"""Connect a run's parts around its models: web tools, MCP tools, the sub-agent solver, the engine.

One place decides how every part of a run is connected, so `ask`, `mapreduce run` and the
offline demo differ only in what they plug in (the demo swaps the provider clients for a
simulated model and the web for the sandbox corpus). The models are built once per run by the
run's `session.Session`, from the one model factory (`amapreduce.llm.factory`).

With `settings.mcp`, the MCP servers it names are started here (`agents.mcp`) and their tools are
added to every sub-agent's (and, with `settings.mcp_manager`, to `RunParts.manager_tools`). The
servers live as long as the parts: `RunParts.close()` (or leaving `with parts:`) stops them; a
finalizer does it too if the parts are dropped unclosed, and at the latest when the process exits.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from amapreduce.errors import ConfigError
from amapreduce.llm.factory import ModelFactory
from amapreduce.settings import DecisionAuthor, Settings

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

    from smolagents import Model, Tool

    from amapreduce.agents.mcp import McpToolbox
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.models import ManagedModel
    from amapreduce.llm.wrappers.trace import CallEvents
    from amapreduce.mapreduce.engine import MapReduceEngine
    from amapreduce.mapreduce.merge import Merger
    from amapreduce.mapreduce.read_solver import Reader
    from amapreduce.mapreduce.solver import BatchSolver
    from amapreduce.progress import ProgressEvent
    from amapreduce.trace import Trace
    from amapreduce.web.backends.base import SearchBackend

__all__ = [
    "MERGE_CACHE_DIR",
    "NO_MODEL_HELP",
    "InnerFactory",
    "RunParts",
    "build_models",
    "build_parts",
    "context_window_for",
    "require_model",
]

NO_MODEL_HELP = (
    "no model is configured. Pass --model, e.g. `--model openai/gpt-5-mini` (with OPENAI_API_KEY set), "
    "or an OpenAI-compatible server: `--model qwen2.5 --api-base http://127.0.0.1:8000/v1`; "
    "or set AMAPREDUCE_MODEL (and AMAPREDUCE_API_BASE). To try everything offline, run `amapreduce demo`."
)

MERGE_CACHE_DIR = "merge-cache"
"""The folder of a run directory where discovery's merge replies are kept (see `build_parts`)."""

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

    models: dict[str, ManagedModel]
    web_tools: list[Tool]
    engine: MapReduceEngine
    web_usage: Callable[[], dict[str, Any]] = field(default=lambda: {})
    mcp_tools: list[Tool] = field(default_factory=list)
    """The MCP servers' tools (`settings.mcp`); every sub-agent has them."""
    mcp_for_manager: bool = False
    """Whether the manager gets the MCP tools too (`settings.mcp_manager`)."""
    closers: list[Callable[[], None]] = field(default_factory=list)
    """What `close` runs: stopping the MCP servers."""
    merger: Merger | None = None
    """Merges a discovery's fuzzy duplicates: the sub-agent model behind the merge prompt."""
    context_window: Callable[[], int] = field(default=lambda: 0)
    """The merge model's context window in tokens (looked up when first asked; see `context_window_for`)."""

    @property
    def manager_tools(self) -> list[Tool]:
        """The manager's tools besides `mapreduce`: the web tools, and the MCP tools when asked."""
        return [*self.web_tools, *(self.mcp_tools if self.mcp_for_manager else ())]

    def close(self) -> None:
        """Release what the parts hold open (the MCP sessions and server processes); idempotent."""
        while self.closers:
            self.closers.pop()()

    def __enter__(self) -> RunParts:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def build_models(settings: Settings, roles: Sequence[str], *, meter: UsageMeter, inner: InnerFactory | None = None,
                 trace: Trace | None = None, factory: ModelFactory | None = None) -> dict[str, ManagedModel]:
    """One managed model per role that has a model id (`llm.factory.ModelFactory.build`), charged to
    `meter`; `inner` replaces the provider clients (simulated models in the demo and tests).
    `factory`: the run's model layer, its roles resolved and its keys registered once (default:
    one read from `settings` now); each model id's endpoint is asked once, however many roles it serves."""
    factory = factory or ModelFactory(settings)
    models: dict[str, ManagedModel] = {}
    for role in roles:
        model_id = factory.roles.get(role)
        if model_id is not None:
            client = inner(role) if inner is not None else None
            models[role] = factory.build(role, model_id, meter=meter, inner=client, trace=trace,
                                         capabilities=factory.endpoint(model_id) if client is None else None)
    return models


def build_parts(
    settings: Settings,
    *,
    models: Mapping[str, ManagedModel],
    trace: Trace,
    progress: Callable[[ProgressEvent], None] | None = None,
    web_tools: list[Tool] | None = None,
    search: SearchBackend | None = None,
    decisions_by: DecisionAuthor = "manager",
    merge_cache: Path | None = None,
    solver: BatchSolver | None = None,
) -> RunParts:
    """Connect web tools, MCP tools, solver and engine around a run's models (built once, by its
    `session.Session`).

    Args:
        settings: the run's settings (limits, search backend, MCP config).
        models: the run's role models; `subagent` is required.
        trace: where every call is recorded.
        progress: engine progress callback.
        web_tools: replaces the web tools (e.g. a corpus-only set).
        search: the search backend the session built in pre-flight (None: built from the settings).
        decisions_by: who writes the decisions the engine runs (`manager` or `user`: the batch cap).
        merge_cache: where discovery's merge replies are kept (the run directory's, so a resumed run
            does not ask them again); None: not kept.
        solver: replaces the search sub-agents (a test's, or a user's own `BatchSolver`).

    The solver, unless given, is the one `settings.solver` asks for (`_default_solver`), and a
    `solver` line in the trace says which and why.

    Raises:
        ConfigError: no sub-agent model, an MCP config (`settings.mcp`) whose server did not start,
            or `solver` `read` with web tools that expose no web service to read with.
    """
    from amapreduce.agents.tool_calls import record_tool_calls
    from amapreduce.llm.reply_cache import ReplyCache
    from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
    from amapreduce.mapreduce.merge import ModelMerger

    if "subagent" not in models:
        raise ConfigError(NO_MODEL_HELP)
    service = None
    if web_tools is None:
        from amapreduce.web.service import WebService
        from amapreduce.web.tools import build_web_tools

        service = WebService.from_settings(settings, search=search)
        web_tools = build_web_tools(settings, service=service, model=models.get("extraction"))
    reader = service if service is not None else _reader_of(web_tools)
    toolbox = _start_mcp(settings, reserved={t.name for t in web_tools}, trace=trace)
    try:
        mcp_tools: list[Tool] = list(toolbox.tools) if toolbox is not None else []
        # every call of every agent's tools is a `tool` line in the trace (and on its span)
        web_tools = [record_tool_calls(t) for t in web_tools]
        mcp_tools = [record_tool_calls(t) for t in mcp_tools]
        if solver is None:  # a caller's own solver is the caller's to record
            solver, name, why = _default_solver(settings, models["subagent"], tools=[*web_tools, *mcp_tools],
                                                reader=reader)
            trace.write("solver", name=name, why=why)
        subagent = models["subagent"]
        capabilities = getattr(subagent, "capabilities", None)  # the server's slots, where it reports them
        config = EngineConfig.from_settings(settings, decisions_by=decisions_by,
                                            slots=capabilities.slots if capabilities is not None else None)
        engine = MapReduceEngine(solver, config=config, trace=trace, progress=progress,
                                 backup_gate=subagent.has_room_for)
        unsubscribe = _adapt_to_rate_limits(engine, subagent)
    except BaseException:
        if toolbox is not None:
            toolbox.close()
        raise
    usage = (lambda: service.usage().model_dump()) if service is not None else (lambda: {})
    merge_model = models["subagent"]
    parts = RunParts(
        models=dict(models), web_tools=list(web_tools), engine=engine, web_usage=usage,
        mcp_tools=mcp_tools, mcp_for_manager=settings.mcp_manager and "manager" in models,
        merger=ModelMerger(merge_model, cache=ReplyCache(merge_cache) if merge_cache is not None else None),
        context_window=functools.partial(context_window_for, settings, merge_model.model_id),
    )
    parts.closers.append(unsubscribe)  # a model that outlives the run no longer tells its engine
    if toolbox is not None:
        parts.closers.append(toolbox.close)
        weakref.finalize(parts, toolbox.close)  # parts dropped unclosed, or the process exiting
    return parts


def _adapt_to_rate_limits(engine: MapReduceEngine, model: ManagedModel) -> Callable[[], None]:
    """An adapted engine (`--workers auto`) halves its attempts in flight when the sub-agents'
    provider answers 429: a subscriber of the model's retries (`llm.retry.ProviderRetry`); returns
    the unsubscribe (a no-op for a fixed engine)."""
    from amapreduce.llm.retry import ProviderRetry

    adapted, events = engine.concurrency, cast("CallEvents | None", getattr(model, "events", None))
    if adapted is None or events is None:
        return lambda: None

    def on_retry(retry: ProviderRetry) -> None:
        if retry.kind == "rate_limit":
            adapted.pressure(f"the provider answered 429 ({retry.model_id})")

    return events.stream.subscribe(ProviderRetry, on_retry)


def _reader_of(tools: Sequence[Tool]) -> Reader | None:
    """The web service behind a caller's web tools (`web.tools`' keep theirs as `.service`), or None."""
    for tool in tools:
        service = getattr(tool, "service", None)
        if callable(getattr(service, "search", None)) and callable(getattr(service, "crawl", None)):
            return cast("Reader", service)
    return None


def _default_solver(settings: Settings, model: ManagedModel, *, tools: Sequence[Tool],
                    reader: Reader | None) -> tuple[BatchSolver, str, str]:
    """The solver `settings.solver` asks for, its name and why it was chosen: `agent`, `read`, or for
    `auto` the read solver when the model's endpoint has no reliable agent loop or its id names a
    small model (the rule: `mapreduce.read_solver`'s module doc), else the agent. The read solver
    needs a web service to read with: `auto` without one keeps the agent.

    Raises:
        ConfigError: `read` asked for, and the given web tools expose no web service.
    """
    from amapreduce.mapreduce.read_solver import ReadSolver, looks_small
    from amapreduce.mapreduce.solver import SmolagentsSolver

    capabilities = model.capabilities
    if settings.solver != "auto":
        read, why = settings.solver == "read", f"asked for (solver={settings.solver})"
    elif capabilities is not None and not capabilities.tool_calling:
        calling = ", ".join(capabilities.tool_choices) or "none"
        read, why = True, f"the endpoint has no reliable tool calling (tool_choice values that call a tool: {calling})"
    elif capabilities is not None and capabilities.context_window and capabilities.context_window < AGENT_MIN_CONTEXT:
        read, why = True, (f"the endpoint's context window ({capabilities.context_window} tokens) is below the "
                           f"{AGENT_MIN_CONTEXT} an agent loop's prompts need")
    elif looks_small(model.model_id):
        read, why = True, f"the model id {model.model_id!r} names a size under 3B parameters"
    else:
        read, why = False, "the endpoint calls tools" if capabilities is not None else "tool calling is assumed"
    if read and reader is None:
        if settings.solver == "read":
            raise ConfigError(
                "the read solver (--solver read) searches and reads with the run's web service, but the web tools "
                f"given ({', '.join(str(t.name) for t in tools) or 'none'}) expose none. Leave the web tools to the "
                "settings, give tools that keep their service as `.service` (web_search, crawl_page), or use "
                "--solver agent."
            )
        read, why = False, f"{why}, but the web tools given expose no web service to read with"
    if read and reader is not None:
        return ReadSolver(model=model, reader=reader, crawl_max_chars=settings.crawl_max_chars,
                          context_window=settings.context_window), "read", why
    return SmolagentsSolver(model=model, tools=tools, max_steps=settings.subagent_max_steps), "agent", why


AGENT_MIN_CONTEXT = 4096
"""Tokens of context below which `--solver auto` keeps the agent loop away: its system prompt and tool
schemas, then each page it reads (measured: a sub-agent's prompts were 1,000-2,000 tokens before its first
page, and every batch overflowed llama-cpp-python's default 2,048)."""


def context_window_for(settings: Settings, model_id: str | None) -> int:
    """The context window (tokens) discovery budgets its merge calls by: `settings.context_window`,
    else the model's own from LiteLLM's bundled model info (offline), else 128,000."""
    from amapreduce.mapreduce.discover import DEFAULT_CONTEXT_WINDOW

    if settings.context_window is not None:
        return settings.context_window
    return (_litellm_context_window(model_id) if model_id else None) or DEFAULT_CONTEXT_WINDOW


@functools.cache
def _litellm_context_window(model_id: str) -> int | None:
    """`max_input_tokens` of LiteLLM's bundled model info for `model_id` (with or without its
    provider prefix); None without the `litellm` extra or for a model it does not know."""
    from amapreduce.llm.meter import litellm_model_map

    table = litellm_model_map()
    for key in (model_id, model_id.split("/", 1)[-1]):
        info = table.get(key)
        if isinstance(info, Mapping):
            size = info.get("max_input_tokens") or info.get("max_tokens")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
    return None


def _start_mcp(settings: Settings, *, reserved: set[str], trace: Trace) -> McpToolbox | None:
    """Start the MCP servers `settings.mcp` names (None without one) and record their tools."""
    if settings.mcp is None:
        return None
    from amapreduce.agents.mcp import open_mcp_tools

    # `final_answer` is every agent's, `mapreduce` the manager's: an MCP tool of either name is renamed.
    toolbox = open_mcp_tools(settings.mcp, max_chars=settings.crawl_max_chars,
                             reserved={*reserved, "final_answer", "mapreduce"})
    try:
        trace.write("mcp_tools", config=str(settings.mcp), servers=sorted(toolbox.servers),
                    tools={t.name: f"{t.server}/{t.mcp_name}" for t in toolbox.tools})
    except BaseException:
        toolbox.close()
        raise
    return toolbox
