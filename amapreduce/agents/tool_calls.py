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
- `duration_s` and `bytes` (UTF-8 bytes of what the call returned to the model).

The same facts go on the call's OpenTelemetry span when tracing is on: openinference's smolagents
instrumentation already opens one `TOOL` span per call around `Tool.__call__`, and the wrapper runs
inside it, so it sets `amapreduce.tool.*` attributes on that span instead of opening a second one.

The wrapper replaces the instance's `forward` (smolagents calls `self.forward`), so the tool keeps its
class, name, inputs and description: the model sees the same tool. (The manager's `mapreduce` tool
also keeps writing its own `tool_call` lines, one per stage with the decision and its output.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from amapreduce import telemetry
from amapreduce.errors import ToolCallRefused, UserError
from amapreduce.llm.scope import scope_labels

if TYPE_CHECKING:
    from smolagents import Tool

    from amapreduce.trace import Trace

__all__ = ["ARG_CHARS", "record_tool_calls", "tool_trace"]

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


_TRACE: ContextVar[Trace | None] = ContextVar("amapreduce_tool_trace", default=None)
"""The trace of the run whose work runs in this context (its engine's worker threads run in copies
of the run's context, so a sub-agent's calls reach its run's trace)."""


@contextlib.contextmanager
def tool_trace(trace: Trace) -> Iterator[None]:
    """Record the tool calls made in this block (and in work it hands to the engine) in `trace`."""
    token = _TRACE.set(trace)
    try:
        yield
    finally:
        _TRACE.reset(token)


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
        trace = _TRACE.get()
        if trace is None or not trace.enabled:
            return forward(*args, **kwargs)
        labels = scope_labels()
        facts: dict[str, Any] = {"tool": name, "agent": "subagent" if "batch_id" in labels else "manager",
                                 **labels, "args": _short({**{str(i): a for i, a in enumerate(args)}, **kwargs})}
        started = time.perf_counter()
        try:
            output = forward(*args, **kwargs)
        except BaseException as exc:
            refused = isinstance(exc, ToolCallRefused | UserError)
            facts.update(outcome="refused" if refused else "error",
                         **({"reason": str(exc)} if refused else {"error": f"{type(exc).__name__}: {exc}"}))
            _record(trace, facts, started, None)
            raise
        facts["outcome"] = "ok"
        _record(trace, facts, started, output)
        return output

    tool.forward = recorded
    setattr(tool, _RECORDED, True)
    return tool


def _record(trace: Trace, facts: dict[str, Any], started: float, output: Any) -> None:
    """Write the call's trace line and set the same facts on the current (the call's) span."""
    facts["duration_s"] = round(time.perf_counter() - started, 6)
    facts["bytes"] = 0 if output is None else _size(output)
    trace.write("tool", **facts)
    if telemetry.active():
        telemetry.current_span().set(telemetry.ours(
            tool_outcome=facts["outcome"], tool_reason=facts.get("reason"), tool_error=facts.get("error"),
            tool_duration_s=facts["duration_s"], tool_bytes=facts["bytes"], tool_agent=facts["agent"]))
