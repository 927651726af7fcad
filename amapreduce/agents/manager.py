"""The manager agent: discovers entities, writes the decision Θ, calls `mapreduce`, finishes.

A smolagents `ToolCallingAgent` (never a CodeAgent: no model-written code is run) with
`web_search`, `crawl_page`, `mapreduce` and `final_answer`. Its instructions live in
`prompts/manager.yaml`. Observations are truncated before they enter the context, and the final
table is the reducer's table rendered in code, never retyped by the model.

A tool error that stops the run ends the manager's run too, at the end of the step that raised it.
smolagents shows every tool exception to the model as an observation and goes on, which is right
for a bad URL and wrong for an outage: with the search backend down, a manager once spent all 31
of its steps (each a paid model call with a real LLM) on the same DNS error and the run then
looked like the model's fault. So when a tool raises one of `mapreduce.result.RUN_STOPPING_ERRORS`
(the search backend's breaker gave up: `SearchUnavailable`; a provider down, or refusing the run's
key or model: `ProviderRejected`; the budget spent) or
the `mapreduce` tool's `RunCancelled`, `manager.run` raises an `AgentError` caused by it, and
`Session.ask` ends the run with that error's status and one-line reason (`failed` for an outage).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from amapreduce.errors import RunCancelled
from amapreduce.mapreduce.result import RUN_STOPPING_ERRORS
from amapreduce.prompts import render_prompt
from amapreduce.settings import default_setting

if TYPE_CHECKING:
    from smolagents import Model, Tool, ToolCallingAgent

    from amapreduce.trace import Trace

__all__ = ["MAX_OBSERVATION_CHARS", "build_manager", "clip_observation"]

MAX_OBSERVATION_CHARS = 12_000
"""Longest tool output the manager sees; the rest is cut with a note. Only the manager's copies of
the tools are cut: the sub-agents' tools return the full text."""


def clip_observation(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """`text` cut to `limit` characters with a note saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit} more characters not shown]"


class _RunStop:
    """The first run-stopping error any of the manager's tools raised (thread-safe: smolagents
    may run one step's tool calls in parallel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: Exception | None = None

    def note(self, exc: Exception) -> None:
        """Keep `exc` when it stops the run. Tools raise these as they are (the web tools let them
        through unwrapped, the `mapreduce` tool raises `RunCancelled` for an execution that stopped),
        so no cause chain is walked."""
        if isinstance(exc, (RunCancelled, *RUN_STOPPING_ERRORS)):
            with self._lock:
                if self.error is None:
                    self.error = exc


def _clipping(tool: Tool, limit: int, stop: _RunStop) -> Tool:
    """A copy of `tool` whose output is cut to `limit` characters; `tool` itself is unchanged.
    A run-stopping error it raises is noted in `stop`, and raised on as before.

    Why a copy: the web tools given to the manager are the very objects the sub-agents' solver
    uses, and a sub-agent reading a page needs all of it (up to `crawl_max_chars`), not the
    manager's context-sized cut. The copy calls the original tool, so the original's setup and
    state (the `mapreduce` tool's table and decisions) are the ones that are used and updated.
    """
    wrapped = copy.copy(tool)
    wrapped.is_initialized = True  # the original sets itself up on its first call, below

    def forward(*args: Any, **kwargs: Any) -> Any:
        try:
            if not tool.is_initialized:
                tool.setup()
            out = tool.forward(*args, **kwargs)  # not `tool(...)`: the agent's call of the copy is the one tool span
        except Exception as exc:
            stop.note(exc)
            raise
        return clip_observation(out, limit) if isinstance(out, str) else out

    wrapped.forward = forward
    return wrapped


def build_manager(
    model: Model,
    tools: Sequence[Tool],
    *,
    max_steps: int = default_setting("manager_max_steps"),
    max_batches: int = default_setting("max_batches"),
    trace: Trace | None = None,
    observation_chars: int = MAX_OBSERVATION_CHARS,
) -> ToolCallingAgent:
    """A manager agent over `tools` (web tools plus the `mapreduce` tool).

    Args:
        model: the manager's model.
        tools: the tools it may call; `final_answer` is added by smolagents.
        max_steps: agent steps before smolagents asks for a final answer (`Settings.manager_max_steps`).
        max_batches: the batch cap quoted in the instructions.
        trace: receives one `manager_step` event per step (tool calls, truncated observations).
        observation_chars: longest tool output shown to the model.

    The agent's `run` raises an `AgentError` caused by the first run-stopping error a tool
    raised (see the module docstring), at the end of that step, after the step is traced.
    """
    from smolagents import ToolCallingAgent
    from smolagents.memory import ActionStep
    from smolagents.utils import AgentError

    stop = _RunStop()
    agent = ToolCallingAgent(
        tools=[_clipping(t, observation_chars, stop) for t in tools],
        model=model,
        max_steps=max_steps,
        instructions=render_prompt("manager", "instructions", max_batches=max_batches),
        verbosity_level=-1,
    )
    if trace is not None and trace.enabled:

        def record(step: ActionStep, **_: Any) -> None:
            trace.write(
                "manager_step",
                step=step.step_number,
                tool_calls=[{"name": c.name, "arguments": c.arguments} for c in step.tool_calls or []],
                observations=clip_observation(step.observations or "", 4000),
                error=str(step.error) if step.error else None,
                at=time.time(),
            )

        agent.step_callbacks.register(ActionStep, record)

    def end_on_stop(step: ActionStep, **_: Any) -> None:
        # Raised from the step's callback: smolagents would catch it inside the step and go on.
        if stop.error is not None:
            raise AgentError(f"the run stops: {stop.error}", agent.logger) from stop.error

    agent.step_callbacks.register(ActionStep, end_on_stop)
    return agent
