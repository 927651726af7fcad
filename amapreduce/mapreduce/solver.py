"""The `BatchSolver` seam: one fresh sub-agent per batch attempt.

The engine hands a solver a `BatchRequest` (the prompt plus what the batch is about) and gets
back the sub-agent's final answer and its usage. The default solver runs a smolagents
`ToolCallingAgent` (never a CodeAgent: no model-written code is executed); tests and
benchmarks plug in scripted solvers with the same interface.

Attempts run by the hundred on many threads, so everything an attempt would otherwise redo is
done once, when the solver is built, before the engine fans out: the sub-agent's system prompt
is ours (`prompts/search_agent.yaml`, rendered once instead of smolagents' long default prompt
compiled by Jinja for every agent), smolagents' remaining templates are parsed once, the agents
share one silent logger and one `final_answer` tool, the LiteLLM price map a metered model needs
is loaded up front (an `--api-base` model's client is ours, `amapreduce.llm.chat_client`, with no
types to build on first use). Work left for the first attempt would run in
every worker thread of the first wave at once, holding the import lock or the GIL while the
other workers wait.
"""

from __future__ import annotations

import functools
import gc
import importlib.resources
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import yaml
from smolagents import FinalAnswerTool, Model, ToolCallingAgent
from smolagents.memory import ActionStep
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.utils import AgentError, AgentMaxStepsError

from amapreduce.decision.columns import ColumnSpec
from amapreduce.errors import BatchTimeout, SolverError, find_cause
from amapreduce.llm.models import ManagedModel
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.result import RUN_STOPPING_ERRORS
from amapreduce.prompts import render_prompt
from amapreduce.settings import default_setting
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from smolagents import Tool
    from smolagents.agents import PromptTemplates

__all__ = ["SUBAGENT_NAME", "BatchRequest", "BatchSolver", "SmolagentsSolver", "SolverReply", "reply_tokens"]

SUBAGENT_NAME = "amapreduce_subagent"
"""The sub-agents' name: what tracing tools show them as (`amapreduce_subagent.run`)."""


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
    forced: tuple[Mapping[str, str], ...] = ()
    """Each sub-question's cells the task matrix fixes (column → value: the entity it is about; a
    patch's target row key), in the order of `tasks`; empty when not known. The engine keeps these
    cells whatever a reply says, so a solver need not ask for them."""
    expected_rows: int = 0
    """Rows the batch's answer should hold, for bounding its reply (`reply_tokens`): one per
    sub-question of a one-row decision, `rows_per_task` each where the decision names it; 0: unknown
    (a sub-question may yield any number)."""
    deadline: float = float("inf")
    """`clock()` value after which the attempt should stop."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when the engine gives up on this attempt (timeout or cancellation)."""
    clock: Callable[[], float] = time.monotonic
    """The engine's clock, which `deadline` is measured on."""

    def expired(self) -> bool:
        """True once the engine gave up on the attempt or its deadline has passed."""
        return self.cancel.is_set() or self.clock() > self.deadline


REPLY_TOKENS_PER_CELL = 40
"""A cell's value and its verbatim quote, in tokens (measured replies: 8-30 each)."""
MAX_REPLY_TOKENS = 8192
"""The most `reply_tokens` gives one call (an endpoint's context window may cap it lower: `llm.dialect`)."""
UNKNOWN_ROWS_PER_TASK = 8
"""Rows a sub-question is budgeted for when the decision does not say how many it yields."""


def reply_tokens(request: BatchRequest) -> int:
    """The `max_tokens` one model call of `request`'s attempt is given: enough for its JSON rows
    (columns plus quotes, a task number and source per row) and some room, never the whole context
    a weak model would otherwise generate into."""
    rows = request.expected_rows or UNKNOWN_ROWS_PER_TASK * max(1, len(request.tasks))
    per_row = REPLY_TOKENS_PER_CELL * (len(request.column_specs) + 1)
    return min(MAX_REPLY_TOKENS, 256 + rows * per_row)


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


@functools.cache
def _smolagents_templates() -> PromptTemplates:
    """smolagents' own ToolCallingAgent templates, parsed once per process: it renders the
    max-steps `final_answer` messages itself, and an agent without them would re-parse the YAML."""
    text = importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    return cast("PromptTemplates", yaml.safe_load(text))


class _TextFinalAnswerTool(FinalAnswerTool):  # type: ignore[misc,unused-ignore]  # smolagents may be untyped
    """`final_answer` whose output is always text: rows given as JSON come back as JSON text.

    smolagents passes every non-text output through `handle_agent_output_types`, which imports
    torch (whenever it is installed) to check for a tensor: seconds of CPU under the import lock
    inside a worker thread. Text never reaches that check, and the engine reads JSON text anyway.
    """

    output_type = "string"

    def forward(self, answer: Any) -> str:
        return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False, default=str)


class _SearchAgent(ToolCallingAgent):  # type: ignore[misc,unused-ignore]  # smolagents may be untyped
    """A `ToolCallingAgent` with a system prompt rendered beforehand, not recompiled per agent."""

    def __init__(self, *, system_prompt: str, **kwargs: Any) -> None:
        self._rendered_system_prompt = system_prompt  # read by `MultiStepAgent.__init__`
        super().__init__(**kwargs)

    def initialize_system_prompt(self) -> str:
        return self._rendered_system_prompt


@functools.cache
def _collect_start_up_garbage() -> None:
    """One full garbage collection, once per process, before the fan-out.

    Why: start-up allocates hundreds of thousands of objects (modules, classes, the SDK's types),
    so the first full collection otherwise falls inside the first wave of calls and holds the GIL
    for a quarter of a second on the oracle benchmark, stalling every worker thread. (`gc.freeze()`
    would also spare later collections that walk, but it changes the whole interpreter of a
    program that merely uses amapreduce: cyclic garbage among frozen objects is never collected.
    A library must not do that to its caller's process.)
    """
    gc.collect()


def _load_what_calls_need(model: Model | Callable[[], Model]) -> None:
    """Do now what a managed model's first call would do inside every worker thread of the first
    wave: load the meter's price map; then collect the start-up garbage
    (`_collect_start_up_garbage`)."""
    if not isinstance(model, ManagedModel):
        return
    model.meter.prices.preload()
    _collect_start_up_garbage()


class SmolagentsSolver:
    """The default solver: a fresh smolagents `ToolCallingAgent` per attempt.

    Args:
        model: the sub-agent model (shared; smolagents API models and scripted models are
            thread-safe), or a factory returning one per attempt.
        tools: the sub-agent's tools (e.g. `web_search`, `crawl_page`), or a factory.
        max_steps: agent steps per attempt.
        instructions: the search guidance in the sub-agent's system prompt; default the
            `instructions` of `prompts/search_agent.yaml`.
    """

    def __init__(
        self,
        *,
        model: Model | Callable[[], Model],
        tools: Sequence[Tool] | Callable[[], Sequence[Tool]] = (),
        max_steps: int = default_setting("subagent_max_steps"),
        instructions: str | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"`max_steps` must be >= 1, got {max_steps}")
        self._model = model
        self._tools = tools
        self.max_steps = max_steps
        self.instructions = render_prompt("search_agent", "instructions") if instructions is None else instructions
        self.system_prompt = render_prompt("search_agent", "system_prompt", instructions=self.instructions)
        """The sub-agents' system prompt, the same for every attempt."""
        self._prompt_templates: PromptTemplates = {**_smolagents_templates(), "system_prompt": self.system_prompt}
        self._final_answer = _TextFinalAnswerTool()
        self._logger = AgentLogger(level=LogLevel.OFF)
        _load_what_calls_need(model)

    def _resolve_model(self) -> Model:
        return self._model if isinstance(self._model, Model) else self._model()

    def solve(self, request: BatchRequest) -> SolverReply:
        """Run a fresh `ToolCallingAgent` on the request's prompt."""
        tools = list(self._tools() if callable(self._tools) else self._tools)
        if all(tool.name != self._final_answer.name for tool in tools):
            tools.append(self._final_answer)
        agent = _SearchAgent(
            system_prompt=self.system_prompt,
            tools=tools,
            model=self._resolve_model(),
            prompt_templates=self._prompt_templates,
            max_steps=self.max_steps,
            logger=self._logger,
            name=SUBAGENT_NAME,
        )

        def check_deadline(step: ActionStep, **_: Any) -> None:
            if request.expired():
                agent.interrupt()

        agent.step_callbacks.register(ActionStep, check_deadline)

        def stop_on_run_stopping_error(step: ActionStep, **_: Any) -> None:
            # smolagents shows a tool's exception to the model and goes on; one that stops the run
            # (the search backend's breaker gave up, the budget is spent) must end this attempt now.
            stopping = find_cause(step.error, *RUN_STOPPING_ERRORS) if step.error is not None else None
            if stopping is not None:
                raise stopping

        agent.step_callbacks.register(ActionStep, stop_on_run_stopping_error)
        try:
            # The output only: a full `RunResult` would serialise every step's input messages.
            output = agent.run(request.prompt)
        except AgentError as exc:
            stopping = find_cause(exc, *RUN_STOPPING_ERRORS)
            if stopping is not None:  # the whole run stops (budget spent, provider down): not this attempt's failure
                raise stopping from None
            if request.expired():
                raise BatchTimeout(
                    f"sub-agent for {request.batch_id} attempt {request.attempt} was stopped at its deadline",
                    batch_id=request.batch_id,
                    attempt=request.attempt,
                ) from None
            raise SolverError(
                f"sub-agent for {request.batch_id} attempt {request.attempt} failed: {redact_secrets(str(exc))}",
                batch_id=request.batch_id,
                attempt=request.attempt,
            ) from None
        steps = [step for step in agent.memory.steps if isinstance(step, ActionStep)]
        # smolagents' own token count. A metered model's calls are counted once, by the engine's
        # usage scope around the attempt (priced, failed attempts included), which is preferred.
        usage = Usage(
            requests=len(steps) or 1,
            input_tokens=sum(step.token_usage.input_tokens for step in steps if step.token_usage),
            output_tokens=sum(step.token_usage.output_tokens for step in steps if step.token_usage),
        )
        state = "max_steps_error" if steps and isinstance(steps[-1].error, AgentMaxStepsError) else "success"
        tool_calls = [{"name": call.name, "arguments": call.arguments} for step in steps for call in step.tool_calls or []]
        return SolverReply(
            output=str(output) if isinstance(output, str) else output,
            usage=usage,
            steps=len(steps),
            trace={"state": state, "tool_calls": tool_calls},
        )
