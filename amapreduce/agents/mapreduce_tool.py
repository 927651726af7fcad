"""The `mapreduce` smolagents Tool the manager agent calls.

Stage 1 (plan): the first call validates the draft decision Θ⁽⁰⁾, shows its batch plan and
returns the experiential prior Δ_q from a pluggable provider (the memory, or `NoPrior`).
Stage 2 (execute): the next call runs the decision (`compose.execute_decision`: through the engine,
with discovery and nested decisions composed) and returns the completeness summary plus the
reduced rows as JSONL. Later calls are delta follow-ups whose
rows merge into the same table, which the manager's final answer is rendered from in code.
An execution that stopped early (budget, cancel, Ctrl-C, estimate only) comes back from the
session as a result like any other; this tool then raises `RunCancelled`, which carries no result
(the session keeps it), so that smolagents ends the manager's run: the one place a stop is raised.

The tool holds no state of the run: it parses and validates its arguments, asks the run's
session (`ToolSession`, which `session.Session` is) whether the call is admitted, and has the
session plan or execute it; the run's table, its executions and the guards live in the session.
Guards: at most `max_tool_calls` accepted calls per run (plan included), identical execute
arguments refused, invalid decisions refused with the exact problem (they do not use up a
call). Every call is traced; with OpenTelemetry on, the plan stage is a span (`amapreduce.plan`)
under the tool call's span, holding the memory's retrieval span.

Safe under concurrency: smolagents runs a step's tool calls in parallel, so the session changes
the guards and the run's table under one lock, and each execution is its own engine run. The table's
columns and key are fixed by the first executed call: a follow-up with other key columns, whose
rows could not merge into it, is refused with a message saying so, before it runs, rather than
replacing the table and losing the rows already found (columns the table lacks are ignored).

Discovery (`discover`): when the entities are many and spread over many list pages or search
results, the manager gives the sources instead of the matrix; sub-agents list the candidates,
code (and, with `merge: "model"`, a tree of merge calls) dedups them, and the entity list
becomes the matrix of the fill, so it never passes through the manager's context. The plan
stage then shows the discovery's map plan; the fill plan follows discovery.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, Protocol

from smolagents import Tool

from amapreduce import telemetry
from amapreduce.decision.model import Decision
from amapreduce.errors import AmapreduceError, DecisionError, RunCancelled, ToolCallRefused

if TYPE_CHECKING:
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.prior import Prior
    from amapreduce.mapreduce.result import MapReduceResult
    from amapreduce.trace import Trace

__all__ = ["PREVIEW_ROWS", "MapReduceTool", "ToolSession"]

PREVIEW_ROWS = 5
"""Rows of the task matrix the plan stage shows the manager."""


class ToolSession(Protocol):
    """What the `mapreduce` tool needs of its run: `session.Session` is one."""

    trace: Trace

    def plan_of(self, decision: Decision) -> BatchPlan:
        """The plan the plan stage shows (a discovery's: its map's). Raises `DecisionError` over the cap."""

    def admit(self, decision: Decision) -> tuple[Literal["plan", "execute"], tuple[str, str] | None]:
        """Count a call of `decision`: its stage, and (reason, message) when it is refused."""

    def prior_for(self, decision: Decision) -> Prior:
        """The experiential prior for the plan stage. Raises `AmapreduceError` when the memory fails."""

    def advised(self, decision: Decision, use_advice: bool | None) -> Decision:
        """The decision to execute, with the plan stage's proposal applied when accepted or set to apply."""

    def advice_mode(self) -> str:
        """`suggest` or `apply`: what the plan stage does with supported advice."""

    def execute(self, decision: Decision, plan: BatchPlan | None) -> tuple[MapReduceResult, int]:
        """Run `decision` and merge its rows into the run's table; the result and the table's rows."""


_DESCRIPTION = (
    "Execute a wide-search decision. Each row of `task_matrix` fills the placeholders __0__, __1__, ... of "
    "`template` to make one atomic sub-query; the sub-queries are batched by `batch_strategy`, solved in "
    "parallel by fresh search sub-agents, and their rows are reduced into one table in code (deduplicated "
    "by key, retried and patched when rows or cells are missing). The FIRST call is a plan stage: it "
    "validates the decision, shows the batch plan and returns experience from past runs; call again "
    "(revised if the advice says so) to execute. After executing, call again only with a small matrix of "
    "the rows still missing (delta only). Output columns come from `json_schema`; put the columns the "
    "matrix fills first, in matrix order. When the entities are MANY and spread over many list pages or "
    "search results, do not list them yourself: give `discover` instead of `task_matrix`, and the entity "
    "list is found by parallel sub-agents, deduplicated, and used as the task matrix (it never enters your "
    "context). For a task per entity that is itself a wide search (e.g. per year: the top 10, then their "
    "attributes), give `child`."
)


def _without_wall_time(value: Any) -> Any:
    """The typed advice as the manager sees it: without the wall times (`mean_wall_s`), which vary
    with the machine's load from run to run. A plan stage's output depends on the memory's state
    alone, so an evaluation resumed, or run on Ray, gives the manager the same text as one run
    straight through; `result.json` and `memory search --json` keep the wall times."""
    if isinstance(value, dict):
        return {k: _without_wall_time(v) for k, v in value.items() if k != "mean_wall_s"}
    if isinstance(value, list):
        return [_without_wall_time(v) for v in value]
    return value


class MapReduceTool(Tool):
    """The manager's `mapreduce` tool (see the module docstring): stateless over its `session`."""

    name = "mapreduce"
    description = _DESCRIPTION
    inputs = {
        "task_matrix": {
            "type": "array",
            "description": "N rows of strings; row i fills __0__, __1__, ... Include EVERY entity, one row each. "
            "Leave it out (null) with `discover`.",
            "nullable": True,
        },
        "template": {"type": "string", "description": "The atomic sub-query with __0__, __1__, ... placeholders."},
        "json_schema": {
            "type": "object",
            "description": 'Output columns: {"type": "object", "properties": {"col": {"type": "string", '
            '"description": "..."}}}, matrix-filled columns first.',
        },
        "batch_strategy": {
            "type": "object",
            "description": '{"type": "per_atom"|"by_attr"|"open", "rationale": "..."}; by_attr takes '
            '"attribute_index"; open takes "groups" [{"indices": [...]}] and "chunk_size".',
            "nullable": True,
        },
        "batch_size": {"type": "integer", "description": "Tasks per batch for per_atom (default 1).", "nullable": True},
        "key_columns": {
            "type": "array",
            "description": "Columns identifying a row (default: the columns the matrix fills). Include a column the "
            "matrix does not fill (e.g. rank) when one task yields several rows.",
            "nullable": True,
        },
        "matrix_columns": {
            "type": "array",
            "description": "The output column each matrix cell fills, null for context-only cells (default: the first ones).",
            "nullable": True,
        },
        "rows_per_task": {"type": "integer", "description": "Rows each task must yield (e.g. 10 for a top 10).", "nullable": True},
        "discover": {
            "type": "object",
            "description": "Find the task matrix instead of listing it (many entities over many list pages or "
            'search results): {"sources": ["<list page URL or search query>", ...], "template": "List every ... '
            'on __0__", "json_schema": ["Name", "Country"], "key_columns": ["Name", "Country"], "batch_size": 1, '
            '"merge": "model"}. Each source fills __0__ of discover.template; "merge": "model" also merges '
            "spelling variants (St./Saint). The discovered key columns fill the output columns of the same "
            "names and __0__, __1__, ... of `template`.",
            "nullable": True,
        },
        "child": {
            "type": ["string", "object"],
            "description": "Run a whole decision per task instead of one sub-query: a name in `decisions` or an "
            "inline decision; __parent_0__, __parent_1__, ... in it are this task's cells.",
            "nullable": True,
        },
        "decisions": {
            "type": "object",
            "description": "Named decisions a `child` may name (top level only).",
            "nullable": True,
        },
        "max_depth": {"type": "integer", "description": "Nesting depth limit (default 3).", "nullable": True},
        "use_advice": {
            "type": "boolean",
            "description": "On an execute call: true applies the plan stage's `memory_advice.proposal` (its "
            "strategy and batch size; your matrix, template and schema are kept). Use it when the proposal's "
            "numbers (similar past runs with that choice, all passed, cheaper per row) fit this task.",
            "nullable": True,
        },
    }
    output_type = "string"

    def __init__(self, session: ToolSession) -> None:
        super().__init__()
        self.session = session

    def forward(
        self,
        template: str,
        json_schema: dict[str, Any],
        task_matrix: list[list[Any]] | None = None,
        batch_strategy: dict[str, Any] | None = None,
        batch_size: int | None = None,
        key_columns: list[str] | None = None,
        matrix_columns: list[str | None] | None = None,
        rows_per_task: int | None = None,
        discover: dict[str, Any] | None = None,
        child: str | dict[str, Any] | None = None,
        decisions: dict[str, Any] | None = None,
        max_depth: int | None = None,
        use_advice: bool | None = None,
    ) -> str:
        raw: dict[str, Any] = {
            "task_matrix": task_matrix,
            "template": template,
            "json_schema": json_schema,
            "batch_strategy": batch_strategy,
            "batch_size": batch_size,
        }
        optional = {
            "key_columns": key_columns, "matrix_columns": matrix_columns, "rows_per_task": rows_per_task,
            "discover": discover, "child": child, "decisions": decisions, "max_depth": max_depth,
        }
        raw.update({k: v for k, v in optional.items() if v is not None})
        parsed = {k: v for k, v in raw.items() if k != "task_matrix" or v is not None}
        try:
            decision = Decision.parse(parsed)
            plan = self.session.plan_of(decision)
        except DecisionError as exc:
            self.session.trace.write(
                "tool_call", tool=self.name, stage="refused", reason="invalid_decision", error=str(exc), args=raw
            )
            raise ToolCallRefused(f"{exc} Fix the arguments and call mapreduce again.") from None
        stage, refusal = self.session.admit(decision)
        if refusal is not None:
            # Traced like the invalid-decision refusal: a run's trace must show every call the
            # manager made, including the ones the guards turned away.
            reason, message = refusal
            self.session.trace.write("tool_call", tool=self.name, stage="refused", reason=reason, error=message,
                                     args=raw)
            raise ToolCallRefused(message)
        if stage == "execute":
            try:
                advised = self.session.advised(decision, use_advice)
                if advised is not decision:
                    decision, plan = advised, self.session.plan_of(advised)
            except DecisionError as exc:
                self.session.trace.write("tool_call", tool=self.name, stage="refused", reason="invalid_advice",
                                         error=str(exc), args=raw)
                raise ToolCallRefused(str(exc)) from None
        if stage == "plan":
            shown = telemetry.ours(tasks=len(decision.task_matrix), batches=len(plan.batches), strategy=plan.strategy)
            with telemetry.span("amapreduce.plan", shown) as span:
                payload, prior = self._plan(raw, decision, plan)
                span.set(telemetry.ours(prior_hints=len(prior.hint_ids), prior_records=len(prior.record_ids)))
            return payload
        return self._execute(raw, decision, plan)

    def _plan(self, raw: dict[str, Any], decision: Decision, plan: BatchPlan) -> tuple[str, Prior]:
        """The plan stage's answer: the decision as understood, its batch plan and the prior."""
        from amapreduce.mapreduce.prior import Prior

        prior = Prior(text="")
        try:
            prior = self.session.prior_for(decision)
            prior_text = prior.text
        except AmapreduceError as exc:
            # Surfaced to the manager and the trace, so "no memory" and "memory broken" differ.
            prior_text = f"Experiential memory is unavailable for this run ({type(exc).__name__}: {exc})."
            self.session.trace.write("prior_error", error=str(exc))
        n = len(decision.task_matrix)
        matrix_preview: list[Any] = list(decision.task_matrix[: PREVIEW_ROWS])
        if n > PREVIEW_ROWS:
            matrix_preview.append(f"... ({n - PREVIEW_ROWS} more rows)")
        shown_plan = {"strategy": plan.strategy, "num_batches": len(plan.batches), "sizes": [b.size for b in plan.batches]}
        args: dict[str, Any] = {
            "num_rows": n,
            "task_matrix_preview": matrix_preview,
            "template": decision.template,
            "columns": list(decision.columns),
            "key_columns": list(decision.resolved_key_columns),
            "batch_strategy": raw["batch_strategy"],
            "batch_size": raw["batch_size"],
        }
        payload: dict[str, Any] = {"call_stage": "plan", "experiential_prior": prior_text, "current_mapreduce_args": args}
        if prior.advice is not None:
            advice = _without_wall_time(prior.advice)
            applies = self.session.advice_mode() == "apply" and advice.get("proposal") is not None
            payload["memory_advice"] = {**advice, "mode": self.session.advice_mode(),
                                        "applied_at_execute": applies}
        if decision.discover is not None:
            spec = decision.discover
            args["discover"] = {
                "sources": len(spec.sources), "template": spec.template, "key_columns": list(spec.resolved_key_columns),
                "merge": spec.merge,
            }
            payload["discovery_plan"] = shown_plan
            payload["batch_plan"] = "the fill plan follows discovery: one task per discovered entity"
        else:
            payload["batch_plan"] = shown_plan
        if decision.child is not None:
            args["child"] = decision.child if isinstance(decision.child, str) else "(inline decision)"
            payload["child_plan"] = "each task runs the child decision, planned when it runs"
        payload["next"] = (
            "Check the decision against the experience above (all entities present, key columns "
            "filled, one batching mode), revise it if needed, then call mapreduce again to execute."
            + (" `memory_advice.proposal` is a revision measured on similar past runs: pass use_advice: true "
               "to apply it." if payload.get("memory_advice", {}).get("proposal") else "")
        )
        self.session.trace.write("tool_call", tool=self.name, stage="plan", args=raw, output=payload)
        return json.dumps(payload, ensure_ascii=False), prior

    def _execute(self, raw: dict[str, Any], decision: Decision, plan: BatchPlan) -> str:
        result, table_rows_total = self.session.execute(decision, plan)
        summary = result.summary
        head = {
            "call_stage": "execute",
            "status": result.ending.label,
            **summary.completeness.to_json(),
            "patch_rounds": summary.patch_rounds,
            "retries": summary.retries,
            "batches": summary.batches,
            "table_rows_total": table_rows_total,
        }
        if result.discovery is not None:
            found = result.discovery
            head["discovery"] = {"sources": found.sources, "candidates": found.candidates, "entities": found.entities,
                                 "merge_calls": found.merge_calls}
        missing = [
            {"key": {k: row.cells[k].value for k in result.table.key_columns}, "missing": row.missing()}
            for row in result.table.rows
            if row.missing()
        ]
        # What is still missing comes before the rows: the manager's view of a tool's output is
        # clipped, and a long table (hundreds of discovered entities) cut it off the end.
        lines = [json.dumps(head, ensure_ascii=False)]
        if missing:
            lines.append(json.dumps({"still_missing": missing[:50], "count": len(missing)}, ensure_ascii=False))
        lines.append(result.jsonl().rstrip("\n"))
        self.session.trace.write("tool_call", tool=self.name, stage="execute", args=raw, output=head)
        if result.ending.status.ended_early:
            # The tool boundary: smolagents shows a tool's return value to the model and goes on,
            # so a stopped execution (budget, cancel, Ctrl-C, estimate only) is raised here, and
            # only here; the session keeps the result and its ending (`Session.stopped`).
            raise RunCancelled(f"the run stopped: {result.ending.label}")
        return "\n".join(line for line in lines if line)
