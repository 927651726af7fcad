"""The `BatchSolver` seam: one fresh sub-agent per batch attempt.

The engine hands a solver a `BatchRequest` (the prompt plus what the batch is about) and gets
back the sub-agent's final answer and its usage. The default solver runs a smolagents
`ToolCallingAgent` (never a CodeAgent: no model-written code is executed); tests and
benchmarks plug in scripted solvers with the same interface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from amapreduce.decision.columns import ColumnSpec
from amapreduce.errors import BatchTimeout, BudgetExceeded, SolverError, find_cause
from amapreduce.llm.usage import Usage

if TYPE_CHECKING:
    from smolagents import Model, Tool

__all__ = ["BatchRequest", "BatchSolver", "SmolagentsSolver", "SolverReply"]


@dataclass(frozen=True, kw_only=True)
class BatchRequest:
    """Everything a sub-agent attempt is given."""

    batch_id: str
    attempt: int
    """1-based attempt number."""
    prompt: str
    """The full task text for the sub-agent (first or continuation prompt)."""
    tasks: tuple[str, ...]
    """The batch's sub-questions, numbered from 1 in the prompt."""
    column_specs: tuple[ColumnSpec, ...]
    """The output columns the sub-agent fills (names, types, descriptions)."""
    rationale: str = ""
    shared_context: Mapping[str, Any] = field(default_factory=dict)
    deadline: float = float("inf")
    """`clock()` value after which the attempt should stop."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when the engine gives up on this attempt (timeout or cancellation)."""
    clock: Callable[[], float] = time.monotonic
    """The engine's clock, which `deadline` is measured on."""

    def expired(self) -> bool:
        """True once the engine gave up on the attempt or its deadline has passed."""
        return self.cancel.is_set() or self.clock() > self.deadline


@dataclass(frozen=True, kw_only=True)
class SolverReply:
    """What a sub-agent attempt produced."""

    output: Any
    """The final answer: JSON text, or a list/dict when the agent returned structured data."""
    usage: Usage = field(default_factory=Usage)
    """The solver's own count of the attempt's tokens; the engine uses it only when the model's
    calls were not metered (a metered attempt's usage is what its meter charged)."""
    steps: int = 0
    """Agent steps taken (for the trace)."""
    trace: Mapping[str, Any] = field(default_factory=dict)
    """Sub-agent details worth keeping (tool calls, state)."""


class BatchSolver(Protocol):
    """Solves one batch attempt. Implementations must be safe to call from many threads."""

    def solve(self, request: BatchRequest) -> SolverReply:
        """Run one attempt; raise `SolverError`/`BatchTimeout` (or any exception) on failure."""
        ...


class SmolagentsSolver:
    """The default solver: a fresh smolagents `ToolCallingAgent` per attempt.

    Args:
        model: the sub-agent model (shared; smolagents API models and scripted models are
            thread-safe), or a factory returning one per attempt.
        tools: the sub-agent's tools (e.g. `web_search`, `crawl_page`), or a factory.
        max_steps: agent steps per attempt.
        instructions: extra system instructions; default `prompts/search_agent.yaml`.
    """

    def __init__(
        self,
        *,
        model: Model | Callable[[], Model],
        tools: Sequence[Tool] | Callable[[], Sequence[Tool]] = (),
        max_steps: int = 20,
        instructions: str | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"`max_steps` must be >= 1, got {max_steps}")
        self._model = model
        self._tools = tools
        self.max_steps = max_steps
        if instructions is None:
            from amapreduce.prompts import render_prompt

            instructions = render_prompt("search_agent", "instructions")
        self.instructions = instructions

    def _resolve_model(self) -> Model:
        from smolagents import Model

        return self._model if isinstance(self._model, Model) else self._model()

    def solve(self, request: BatchRequest) -> SolverReply:
        """Run a fresh `ToolCallingAgent` on the request's prompt."""
        from smolagents import ToolCallingAgent
        from smolagents.memory import ActionStep
        from smolagents.utils import AgentError

        tools = list(self._tools() if callable(self._tools) else self._tools)
        model = self._resolve_model()
        agent = ToolCallingAgent(
            tools=tools,
            model=model,
            max_steps=self.max_steps,
            instructions=self.instructions,
            verbosity_level=-1,
        )

        def check_deadline(step: ActionStep, **_: Any) -> None:
            if request.expired():
                agent.interrupt()

        agent.step_callbacks.register(ActionStep, check_deadline)
        try:
            result = agent.run(request.prompt, return_full_result=True)
        except AgentError as exc:
            budget = find_cause(exc, BudgetExceeded)
            if budget is not None:
                raise budget from None
            if request.expired():
                raise BatchTimeout(
                    f"sub-agent for {request.batch_id} attempt {request.attempt} was stopped at its deadline",
                    batch_id=request.batch_id,
                    attempt=request.attempt,
                ) from None
            raise SolverError(
                f"sub-agent for {request.batch_id} attempt {request.attempt} failed: {exc}",
                batch_id=request.batch_id,
                attempt=request.attempt,
            ) from None
        steps = [s for s in result.steps or [] if isinstance(s, dict) and s.get("step_number") is not None]
        # smolagents' own token count. A metered model's calls are counted once, by the engine's
        # usage scope around the attempt (priced, failed attempts included), which is preferred.
        tokens = result.token_usage
        usage = Usage(
            requests=len(steps) or 1,
            input_tokens=tokens.input_tokens if tokens else 0,
            output_tokens=tokens.output_tokens if tokens else 0,
        )
        tool_calls = [
            {"name": call.get("function", {}).get("name"), "arguments": call.get("function", {}).get("arguments")}
            for s in steps
            for call in s.get("tool_calls") or []
            if isinstance(call, dict)
        ]
        return SolverReply(
            output=result.output,
            usage=usage,
            steps=len(steps),
            trace={"state": result.state, "tool_calls": tool_calls},
        )
