"""Every tool call of every agent, recorded: one `tool` line in the run's trace per call.

Why: a sub-agent's `crawl_page` and `web_search` calls (refused SSRF attempts included) used to leave
no record; they were visible only inside the next prompt. `record_tool_calls` wraps a tool so that
each call writes, whatever its outcome:

- `tool`, `agent` (`subagent` inside a batch attempt, else `manager`) and the attempt's labels
  (`batch_id`, `attempt`);
- `args`: the arguments, configured secrets masked and credential-named keys redacted (the trace's
  one redaction), each text cut at `ARG_CHARS`;
- `outcome`: `ok`, `refused` (the tool turned the call away on purpose: a URL the policy refuses, bad
  arguments, a call limit) with `reason`, the tool's own message (the policy's reason), or `error`
  (the call was valid but failed, or raised anything else) with `error`;
- `duration_s` and `bytes` (UTF-8 bytes of what the call returned to the model);
- `shared: true` when its search or crawl was served by an identical one already in flight (`web.flight`).

Each call is one typed event (`ToolCalled`), emitted once on the run's stream (`tool_trace`); the
trace and the call's OpenTelemetry span are its subscribers. On the span, when tracing is on: openinference's smolagents
instrumentation already opens one `TOOL` span per call around `Tool.__call__`, and the wrapper runs
inside it, so it sets `amapreduce.tool.*` attributes on that span instead of opening a second one.

The wrapper replaces the instance's `forward` (smolagents calls `self.forward`), so the tool keeps its
class, name, inputs and description: the model sees the same tool. (The manager's `mapreduce` tool
also keeps writing its own `tool_call` lines, one per stage with the decision and its output.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from amapreduce import telemetry
from amapreduce.errors import ToolCallRefused, UserError
from amapreduce.events import Event, EventStream, trace_channel
from amapreduce.llm.scope import scope_labels
from amapreduce.web.flight import call_shares

if TYPE_CHECKING:
    from smolagents import Tool

    from amapreduce.trace import Trace

__all__ = ["ARG_CHARS", "ToolCalled", "record_tool_calls", "tool_trace"]

ARG_CHARS = 2_000
"""Longest text kept of one argument in the trace (a decision's matrix can be megabytes; the whole
argument is in the journal or the run's files where it matters)."""

_RECORDED = "_amapreduce_recorded"


def _short(value: Any) -> Any:
    """`value` with every text cut at `ARG_CHARS` (marked), at any depth."""
    if isinstance(value, str):
        return value if len(value) <= ARG_CHARS else f"{value[:ARG_CHARS]}… [{len(value) - ARG_CHARS} more chars]"
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_short(v) for v in value]
    return value


def _size(output: Any) -> int:
    """UTF-8 bytes of what the tool returned (its text for anything that is not a string)."""
    text = output if isinstance(output, str) else str(output)
    return len(text.encode("utf-8", errors="replace"))


@dataclass(frozen=True, kw_only=True)
class ToolCalled(Event):
    """One tool call of an agent, whatever its outcome (see the module doc for the fields)."""

    trace_event: ClassVar[str | None] = "tool"
    tool: str
    agent: str
    """`subagent` inside a batch attempt, else `manager`."""
    labels: Mapping[str, Any] = field(default_factory=dict)
    """The open usage scope's labels (`batch_id`, `attempt`)."""
    args: Mapping[str, Any] = field(default_factory=dict)
    outcome: str = "ok"
    """`ok`, `refused` (with `reason`) or `error` (with `error`)."""
    reason: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    bytes: int = 0
    shared: bool = False
    """Its search or crawl was served by an identical one already in flight (`web.flight`)."""

    def trace_fields(self) -> dict[str, Any]:
        why = {k: v for k, v in (("reason", self.reason), ("error", self.error)) if v is not None}
        return {"tool": self.tool, "agent": self.agent, **self.labels, "args": dict(self.args), "outcome": self.outcome,
                **why, "duration_s": self.duration_s, "bytes": self.bytes, **({"shared": True} if self.shared else {})}


def _on_span(event: ToolCalled) -> None:
    """The call's facts on its OpenTelemetry span (the current one: handlers run in the calling thread)."""
    if telemetry.active():
        telemetry.current_span().set(telemetry.ours(
            tool_outcome=event.outcome, tool_reason=event.reason, tool_error=event.error,
            tool_duration_s=event.duration_s, tool_bytes=event.bytes, tool_agent=event.agent))


_EVENTS: ContextVar[EventStream | None] = ContextVar("amapreduce_tool_events", default=None)
"""Where the tool calls of the run whose work runs in this context are emitted (its engine's worker
threads run in copies of the run's context, so a sub-agent's calls reach its run's trace)."""


@contextlib.contextmanager
def tool_trace(trace: Trace) -> Iterator[EventStream | None]:
    """Record the tool calls made in this block (and in work it hands to the engine) in `trace`: each
    call is one `ToolCalled` on the stream this yields (None: `trace` is off, nothing is recorded),
    whose subscribers are the trace and the call's OpenTelemetry span."""
    stream: EventStream | None = None
    if trace.enabled:
        stream = EventStream()
        trace_channel(stream, trace)
        stream.subscribe(ToolCalled, _on_span)
    token = _EVENTS.set(stream)
    try:
        yield stream
    finally:
        _EVENTS.reset(token)


def record_tool_calls(tool: Tool) -> Tool:
    """Make `tool` record each call in the current run's trace (`tool_trace`) and on its
    OpenTelemetry span; returns `tool`. Outside a run (no `tool_trace`) a call records nothing.

    Idempotent: a tool already recording is left as it is, so a tool shared by the manager and the
    sub-agents, or by several runs (`RunOptions.web_tools`), is recorded once per call, in the
    trace of the run that made it.
    """
    if getattr(tool, _RECORDED, False):
        return tool
    forward = tool.forward
    name = str(tool.name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        stream = _EVENTS.get()
        if stream is None:
            return forward(*args, **kwargs)
        labels = scope_labels()
        call = {"tool": name, "agent": "subagent" if "batch_id" in labels else "manager", "labels": labels,
                "args": _short({**{str(i): a for i, a in enumerate(args)}, **kwargs})}
        started = time.perf_counter()
        with call_shares() as flight:
            try:
                output = forward(*args, **kwargs)
            except BaseException as exc:
                refused = isinstance(exc, ToolCallRefused | UserError)
                stream.emit(ToolCalled(**call, outcome="refused" if refused else "error",
                                       reason=str(exc) if refused else None,
                                       error=None if refused else f"{type(exc).__name__}: {exc}",
                                       duration_s=round(time.perf_counter() - started, 6), shared=flight.shared))
                raise
        stream.emit(ToolCalled(**call, duration_s=round(time.perf_counter() - started, 6), bytes=_size(output),
                               shared=flight.shared))
        return output

    tool.forward = recorded
    setattr(tool, _RECORDED, True)
    return tool
