"""The schema of `trace.jsonl`: every event a run writes, and its fields.

One line per event: `{"ts": <unix seconds>, "event": <name>, ...fields}` (`trace.TraceWriter`). This
module is the one list of the names and fields; `docs/reference/trace.md` is made from it
(`markdown`, kept current by a test) and the test suite checks every line any test writes against it
(`problems`), so a new event or field is added here or the suite fails. The engine's events are
typed (`mapreduce.events`), and so are the model stack's (`llm.events`, `llm.retry.ProviderRetry`)
and the agents' tool calls (`agents.tool_calls.ToolCalled`): their lines are their `trace_fields`,
checked against this list too.

Readers should ignore fields they do not know: new fields may be added; a field is never renamed or
given another meaning without a new event name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COMMON_FIELDS", "SCOPE_FIELDS", "TRACE_EVENTS", "TraceEventSpec", "markdown", "problems"]


@dataclass(frozen=True)
class TraceEventSpec:
    """One event of the trace: its name, what it records, who writes it, and its fields."""

    name: str
    doc: str
    writer: str
    fields: Mapping[str, str]
    scoped: bool = False
    """It also carries the labels of the open usage scope (`SCOPE_FIELDS`): which batch attempt or
    merge node made the call."""


COMMON_FIELDS: Mapping[str, str] = {
    "ts": "when the line was written (Unix time, seconds)",
    "event": "the event's name",
    "chunk": "the chunk that wrote it, for an event a chunk of a wide run wrote elsewhere (`cluster.wide`)",
}
"""Fields any line may have."""

SCOPE_FIELDS: Mapping[str, str] = {
    "batch_id": "the batch whose attempt made the call",
    "attempt": "that attempt's number",
    "node": "the merge node that made the call (`reduce L1`, `final`, ...)",
    "level": "the merge node's level",
    "index": "the merge node's index in its level",
}
"""The usage scope's labels, on the events marked scoped (model and tool calls)."""

_MODEL = {"role": "the model's role (`manager`, `subagent`, `extraction`, ...)", "model_id": "the model id"}

TRACE_EVENTS: tuple[TraceEventSpec, ...] = (
    # -- the engine (typed: `mapreduce.events`)
    TraceEventSpec("run_start", "an engine run begins", "mapreduce.events.RunStarted", {
        "num_rows": "tasks (rows of the task matrix)", "strategy": "the batching strategy",
        "batches": "each batch's manifest (id, size, indices)"}),
    TraceEventSpec("patch_round", "a delta-patch round is planned", "mapreduce.events.PatchRound", {
        "round": "its number, from 1", "batches": "its batches' manifests"}),
    TraceEventSpec("attempt", "a sub-agent attempt settled: merged, failed, or superseded by its rival",
                   "mapreduce.events.AttemptSettled", {
        "batch_id": "the batch", "phase": "`map` or `patch<k>`", "attempt": "the attempt's number",
        "outcome": "`ok`, `parse_error`, `error`, `timeout` or `superseded`", "prompt": "the prompt sent",
        "raw_output": "the sub-agent's reply as written", "parsed_rows": "the rows parsed from it (with task and source)",
        "dropped_rows": "rows that fit no sub-question or had no usable key", "error": "why it failed",
        "elapsed_s": "its wall time", "usage": "what its model calls used", "subagent": "the sub-agent's own trace",
        "backup": "whether it was a straggler's backup"}),
    TraceEventSpec("backup_start", "a straggler got a backup attempt", "mapreduce.events.BackupStarted", {
        "batch_id": "the batch", "phase": "its phase", "attempt": "the attempt backed up",
        "running_s": "how long the straggler had run", "threshold_s": "the straggler threshold then"}),
    TraceEventSpec("workers", "the adapted limit of attempts in flight changed (`--workers auto`)",
                   "mapreduce.events.WorkersChanged", {
        "workers": "attempts allowed in flight now", "previous": "before", "why": "throughput rose, a timeout, a 429"}),
    TraceEventSpec("run_end", "an engine run ended (finished or stopped)", "mapreduce.events.RunEnded", {
        "summary": "the run's summary (completeness, effort, usage, timings)", "cancelled": "it stopped early",
        "status": "its status label (`complete`, `incomplete`, `stopped: ...`)"}),
    # -- composition and discovery
    TraceEventSpec("child_run", "a nested decision's child run ended", "mapreduce.compose", {
        "path": "the child's path (`top10[2019]`)", "task": "the parent task", "status": "its status label",
        "rows": "its rows", "error": "why it failed"}),
    TraceEventSpec("tree_node", "a node of a tree reduction was planned", "mapreduce.tree_reduce", {
        "node": "its label", "level": "its level", "index": "its index in the level", "inputs": "its inputs",
        "input_tokens": "their tokens"}),
    TraceEventSpec("merge_call", "a discovery merge call (fuzzy duplicates)", "mapreduce.discover", {
        "node": "its tree node", "level": "the node's level", "index": "the node's index", "candidates": "candidates in",
        "entities": "entities out", "prompt_tokens": "its prompt's tokens", "usage": "what it used",
        "cached": "answered from the cache", "warnings": "problems with its reply", "reply": "the reply text"}),
    TraceEventSpec("discovery", "a discovery finished", "mapreduce.discover", {
        "summary": "sources, candidates, entities, merge calls, tree levels and nodes, warnings"}),
    # -- models
    TraceEventSpec("model_call", "one model call (after its retries)", "llm.events.ModelCalled", {
        **_MODEL, "latency_s": "its wall time, retries included", "retries": "retries it needed",
        "retry_waits": "the waits before them", "usage": "tokens and cost (null when it failed)",
        "error": "why it failed"}, scoped=True),
    TraceEventSpec("model_retry", "a model call failed transiently and is sent again", "llm.retry.ProviderRetry", {
        **_MODEL, "retry": "which retry (1 for the first)", "kind": "`rate_limit`, `server`, `timeout` or `connection`",
        "delay_s": "the backoff", "error": "the failed attempt's error"}, scoped=True),
    TraceEventSpec("model_hedge", "a hedged model call settled", "llm.events.ModelHedged", {
        **_MODEL, "winner": "which copy answered first", "hedges": "extra copies sent", "after_s": "when the hedge went",
        "threshold_s": "the hedge threshold", "losers": "how the other copies ended", "usage": "what all copies used",
        "hedge_error": "a hedge's error"}, scoped=True),
    # -- tools and agents
    TraceEventSpec("tool", "one tool call of an agent (web search, crawl, MCP, mapreduce)", "agents.tool_calls.ToolCalled", {
        "tool": "the tool", "agent": "`manager` or `subagent`", "args": "its arguments (shortened)",
        "outcome": "`ok`, `refused` or `error`", "reason": "a refusal's reason", "error": "an error",
        "duration_s": "its wall time", "bytes": "its output's size",
        "shared": "true when an identical search or crawl in flight served it (no request of its own)"}, scoped=True),
    TraceEventSpec("tool_call", "a `mapreduce` tool call: its stage and what it answered", "agents.mapreduce_tool", {
        "tool": "`mapreduce`", "stage": "`plan`, `execute` or `refused`", "reason": "a refusal's reason",
        "error": "a refusal's message", "args": "the call's arguments", "output": "what it answered (the head)"}),
    TraceEventSpec("prior_error", "the experiential memory could not give a prior", "agents.mapreduce_tool, enrichment", {
        "error": "why"}),
    TraceEventSpec("plan_stage", "an enrich run's plan stage", "enrichment.run", {
        "batches": "its batches", "rows": "its rows", "strategy": "the batching strategy", "prior": "the prior's text",
        "hint_ids": "the hints in it"}),
    TraceEventSpec("advice_applied", "the memory's proposed revision was applied", "session.session", {
        "by": "`manager` (use_advice) or `plan_stage` (advice mode apply)", "strategy": "the strategy applied",
        "batch_size": "the batch size applied"}),
    TraceEventSpec("manager_step", "one step of the manager agent", "agents.manager", {
        "step": "its number", "tool_calls": "the tools it called, with arguments", "observations": "what they answered (cut)",
        "error": "the step's error", "at": "when it ended (Unix time)"}),
    TraceEventSpec("manager", "the manager runs as the planner (no tool calling)", "session.session", {
        "mode": "`planner`", "why": "why the model cannot call tools"}),
    TraceEventSpec("planner_scout", "the planner's scouting", "agents.planner", {
        "budget_chars": "the excerpt budget", "query": "the search query", "results": "the results' URLs",
        "crawled": "the pages read", "excerpt_chars": "excerpt characters kept", "notes": "searches or pages that failed"}),
    TraceEventSpec("planner_reply", "one structured call of the planner", "agents.planner", {
        "call": "its number", "valid": "whether it made a valid decision", "error": "why not", "reply": "the reply (cut)",
        "entities": "the decision's tasks", "grounded": "tasks found in the scouted pages",
        "columns": "its columns", "template": "its template"}),
    # -- the run
    TraceEventSpec("solver", "the sub-agents' solver was chosen", "session.parts", {
        "name": "`read`, `agent`, ...", "why": "why it was chosen"}),
    TraceEventSpec("mcp_tools", "MCP tools were loaded", "session.parts", {
        "config": "the MCP config file", "servers": "its servers", "tools": "tool → server/name"}),
    TraceEventSpec("chunk_retried", "a chunk of a wide run is run again elsewhere", "cluster.wide", {
        "chunk": "the chunk", "attempt": "its next attempt", "error": "why the last one failed"}),
    TraceEventSpec("run_finished", "the run ended; its record is written", "session.lifecycle", {
        "status": "its status label", "usage": "usage by role", "error": "why it failed"}),
)
"""Every event of `trace.jsonl`, by the layer that writes it."""

_BY_NAME = {spec.name: spec for spec in TRACE_EVENTS}


def problems(line: Mapping[str, Any]) -> list[str]:
    """What in one trace line the schema does not have: an unknown event, or fields it does not list."""
    name = line.get("event")
    spec = _BY_NAME.get(name) if isinstance(name, str) else None
    if spec is None:
        return [f"unknown trace event {name!r}"]
    known = {*COMMON_FIELDS, *spec.fields, *(SCOPE_FIELDS if spec.scoped else ())}
    extra = sorted(set(line) - known)
    return [f"{spec.name}: field {field!r} is not in the trace schema" for field in extra]


def markdown() -> str:
    """The schema as the page `docs/reference/trace.md`."""
    out = [
        "# Trace events", "",
        "`trace.jsonl` in a run folder holds one JSON object per line: `ts` (Unix time), `event` (the name",
        "below) and the event's fields. It is made from `amapreduce.trace_schema`; readers should ignore fields they",
        "do not know. Any line may also carry:", "",
        *(f"- `{k}`: {v}" for k, v in COMMON_FIELDS.items()), "",
        "Events marked *scoped* also carry the labels of the usage scope that made the call:", "",
        *(f"- `{k}`: {v}" for k, v in SCOPE_FIELDS.items()), "",
        "The engine's events are typed (`amapreduce.mapreduce.events`), and so are the model calls, retries and hedges",
        "(`amapreduce.llm.events`) and the tool calls (`amapreduce.agents.tool_calls.ToolCalled`): one event per thing that",
        "happened, emitted once; the trace, the progress line, the journal and OpenTelemetry subscribe to them.", "",
    ]
    for spec in TRACE_EVENTS:
        out += [f"## `{spec.name}`", "", f"{spec.doc[0].upper()}{spec.doc[1:]}. Written by `{spec.writer}`"
                + ("; scoped." if spec.scoped else "."), "", "| field | holds |", "|---|---|",
                *(f"| `{k}` | {v} |" for k, v in spec.fields.items()), ""]
    return "\n".join(out).rstrip("\n") + "\n"
