"""The `mapreduce` smolagents Tool the manager agent calls.

Stage 1 (plan): the first call validates the draft decision Θ⁽⁰⁾, shows its batch plan and
returns the experiential prior Δ_q from a pluggable provider (the memory, or `NoPrior`).
Stage 2 (execute): the next call runs the decision (`compose.run_decision`: through the engine,
with discovery and nested decisions composed) and returns the completeness summary plus the
reduced rows as JSONL. Later calls are delta follow-ups whose
rows merge into the same table, which the manager's final answer is rendered from in code.

Guards: at most `max_calls` accepted calls per run (plan included), identical execute
arguments refused, invalid decisions refused with the exact problem (they do not use up a
call). Every call is traced; with OpenTelemetry on, the plan stage is a span (`amapreduce.plan`)
under the tool call's span, holding the memory's retrieval span.

Safe under concurrency: smolagents runs a step's tool calls in parallel, so the guards and the
run's table are changed under one lock, and each execution is its own engine run. The table's
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
import threading
from collections.abc import Callable
from typing import Any

from smolagents import Tool

from amapreduce import telemetry
from amapreduce.decision.model import Decision
from amapreduce.errors import AmapreduceError, DecisionError, RunCancelled, ToolCallRefused
from amapreduce.mapreduce.batching import BatchPlan, plan_batches
from amapreduce.mapreduce.checkpoint import Checkpoint
from amapreduce.mapreduce.compose import run_decision
from amapreduce.mapreduce.discover import DEFAULT_CONTEXT_WINDOW, discovery_plan
from amapreduce.mapreduce.engine import MapReduceEngine
from amapreduce.mapreduce.merge import Merger
from amapreduce.mapreduce.prior import NoPrior, Prior, PriorProvider, PriorRequest
from amapreduce.mapreduce.result import MapReduceResult
from amapreduce.table.table import Table
from amapreduce.trace import Trace

__all__ = ["MapReduceTool"]

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


class MapReduceTool(Tool):
    """The manager's `mapreduce` tool (see the module docstring)."""

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
    }
    output_type = "string"

    def __init__(
        self,
        engine: MapReduceEngine,
        *,
        query: str = "",
        task_id: str | None = None,
        prior_provider: PriorProvider | None = None,
        plan_stage: bool = True,
        max_calls: int = 4,
        trace: Trace | None = None,
        preview_rows: int = 5,
        checkpoint: Checkpoint | None = None,
        merger: Merger | None = None,
        context_window: int | Callable[[], int] = DEFAULT_CONTEXT_WINDOW,
        on_execute: Callable[[Decision, BatchPlan | None], None] | None = None,
        wide: Callable[[Decision, BatchPlan], MapReduceResult | None] | None = None,
    ) -> None:
        super().__init__()
        if max_calls < 1:
            raise ValueError(f"`max_calls` must be >= 1, got {max_calls}")
        self.engine = engine
        self.query = query
        self.task_id = task_id
        self.prior_provider = prior_provider or NoPrior()
        self.plan_stage = plan_stage
        self.max_calls = max_calls
        self.trace = trace or engine.trace  # one JSONL for calls, batches and attempts
        self.preview_rows = preview_rows
        self.checkpoint = checkpoint
        """The run's journal: each execution's decision and settled attempts are saved there, so
        `amapreduce runs resume` can finish a killed run without asking the manager again."""
        self.merger = merger
        """Merges fuzzy duplicates of a discovery with `merge: "model"` (None: code dedup only)."""
        self.on_execute = on_execute
        """Told of each decision before it runs (with its plan; None for a composed one): `ask` keeps
        the decisions the manager executed, which a composed one's journal entries do not show."""
        self.wide = wide
        """Runs a plain decision's plan elsewhere when it is too wide for one engine run (`ask
        --executor ray` gives one: its chunks on Ray), returning the merged result, or None to run
        it here. Injected, since this layer knows no executor; its executions are not journaled."""
        self._context_window = context_window
        """The merge model's context window, or how to find it (looked up once, when a discovery runs)."""
        self._lock = threading.Lock()
        self.calls = 0
        self._planned = False
        self._executed: set[str] = set()
        self.prior: Prior | None = None
        self.decisions: list[Decision] = []
        self.filled: list[Decision] = []
        """`decisions` as their tasks ran: a discovery's with the entities it found as its matrix
        (what completeness is measured against; a discovery that found nothing asks for nothing)."""
        self.results: list[MapReduceResult] = []
        self.table: Table | None = None
        self._shape: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        """(columns, key columns) of the run's table, fixed by the first executed call."""

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
            plan = self._plan_of(decision)
        except DecisionError as exc:
            self.trace.write(
                "tool_call", tool=self.name, stage="refused", reason="invalid_decision", error=str(exc), args=raw
            )
            raise ToolCallRefused(f"{exc} Fix the arguments and call mapreduce again.") from None
        signature = json.dumps(decision.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        refusal: tuple[str, str] | None = None
        with self._lock:
            stage = "plan" if self.plan_stage and not self._planned else "execute"
            if self.calls >= self.max_calls:
                refusal = "max_calls", (
                    f"mapreduce may be called at most {self.max_calls} times per run and was already called "
                    f"{self.calls} times. Finish with what the table has; missing cells stay empty."
                )
            elif stage == "execute" and signature in self._executed:
                refusal = "repeated_args", (
                    "these exact arguments were already executed. To fill gaps, call mapreduce with a matrix of "
                    "ONLY the rows still missing, or finish with the table as it is."
                )
            elif stage == "execute" and (mismatch := self._shape_mismatch(decision)) is not None:
                refusal = "other_columns", mismatch
            else:
                self.calls += 1
                if stage == "plan":
                    self._planned = True
                else:
                    self._executed.add(signature)
                    if self._shape is None:
                        self._shape = (tuple(decision.columns), tuple(decision.resolved_key_columns))
        if refusal is not None:
            # Traced like the invalid-decision refusal: a run's trace must show every call the
            # manager made, including the ones the guards turned away.
            reason, message = refusal
            self.trace.write("tool_call", tool=self.name, stage="refused", reason=reason, error=message, args=raw)
            raise ToolCallRefused(message)
        if stage == "plan":
            shown = telemetry.ours(tasks=len(decision.task_matrix), batches=len(plan.batches), strategy=plan.strategy)
            with telemetry.span("amapreduce.plan", shown) as span:
                payload = self._plan(raw, decision, plan)
                prior = self.prior or Prior(text="")
                span.set(telemetry.ours(prior_hints=len(prior.hint_ids), prior_records=len(prior.record_ids)))
            return payload
        return self._execute(raw, decision, plan)

    def _plan_of(self, decision: Decision) -> BatchPlan:
        """The plan the plan stage shows: the decision's own, or for a discovery its map's (the
        fill is planned once the entities are known). Raises `DecisionError` over the batch cap."""
        cap = self.engine.config.max_batches
        if decision.discover is not None:
            return discovery_plan(decision.discover, max_batches=cap)
        return plan_batches(decision, max_batches=cap)

    def context_window(self) -> int:
        """The merge model's context window in tokens (looked up at the first discovery)."""
        if callable(self._context_window):
            self._context_window = self._context_window()
        return self._context_window

    def _shape_mismatch(self, decision: Decision) -> str | None:
        """Why `decision`'s rows could not merge into the run's table (None: they can; columns
        the table lacks are ignored when merging, so only the key columns must match)."""
        if self._shape is None:
            return None
        columns, keys = self._shape
        if tuple(decision.resolved_key_columns) == keys:
            return None
        return (
            f"this run's table has columns {list(columns)} keyed by {list(keys)}; a follow-up must use the same "
            f"key columns (this call is keyed by {list(decision.resolved_key_columns)}) so that its rows fill "
            "the same table. Call mapreduce again with those key columns, or finish with the table as it is."
        )

    def _plan(self, raw: dict[str, Any], decision: Decision, plan: BatchPlan) -> str:
        request = PriorRequest(query=self.query or decision.template, decision=decision, task_id=self.task_id)
        try:
            self.prior = self.prior_provider.prior(request)
            prior_text = self.prior.text
        except AmapreduceError as exc:
            # Surfaced to the manager and the trace, so "no memory" and "memory broken" differ.
            prior_text = f"Experiential memory is unavailable for this run ({type(exc).__name__}: {exc})."
            self.trace.write("prior_error", error=str(exc))
        n = len(decision.task_matrix)
        matrix_preview: list[Any] = list(decision.task_matrix[: self.preview_rows])
        if n > self.preview_rows:
            matrix_preview.append(f"... ({n - self.preview_rows} more rows)")
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
        )
        self.trace.write("tool_call", tool=self.name, stage="plan", args=raw, output=payload)
        return json.dumps(payload, ensure_ascii=False)

    def execute(self, decision: Decision, plan: BatchPlan | None) -> tuple[MapReduceResult, int]:
        """Run `decision` on `plan` (journaled when the tool has a checkpoint) and merge its rows
        into the run's table; return the result and the table's rows. `forward` calls it for the
        manager, `runs resume` for the executions a killed run had begun. A composed decision
        (`discover`, `child`) plans its parts as they run, so its `plan` is not used (None: a plain
        decision is planned here).

        Raises:
            RunCancelled: the execution stopped; its rows are merged all the same.
        """
        composed = decision.composed
        if self.on_execute is not None:
            self.on_execute(decision, None if composed else plan)
        elsewhere = self.wide(decision, plan) if self.wide is not None and plan is not None and not composed else None
        if elsewhere is not None:
            rows = self._accumulate(decision, elsewhere)
            if elsewhere.ending.status.ended_early:
                raise RunCancelled(f"{elsewhere.ending.reason}; `partial` holds the rows found so far", partial=elsewhere)
            return elsewhere, rows
        try:
            result = run_decision(
                self.engine, decision, plan=None if composed else plan, checkpoint=self.checkpoint,
                merger=self.merger, context_window=self.context_window() if decision.discover is not None else None,
            )
        except RunCancelled as exc:
            self._accumulate(decision, exc.partial)  # a stopped run still keeps the rows it found
            raise
        return result, self._accumulate(decision, result)

    def _execute(self, raw: dict[str, Any], decision: Decision, plan: BatchPlan) -> str:
        result, table_rows_total = self.execute(decision, plan)
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
        self.trace.write("tool_call", tool=self.name, stage="execute", args=raw, output=head)
        return "\n".join(line for line in lines if line)

    def _accumulate(self, decision: Decision, result: MapReduceResult) -> int:
        """Record an execution and merge its rows into the run's table (delta follow-ups fill the
        same rows; `forward` refused any whose rows could not merge). Returns the table's rows."""
        table = result.table
        filled = decision
        if decision.discover is not None:
            keys = [c for c in decision.resolved_matrix_columns if c is not None]
            found = list({tuple(row.cells[k].value for k in keys): None for row in table.rows if all(
                k in row.cells for k in keys)})
            try:
                filled = decision.with_matrix([list(k) for k in found]) if found else decision
            except DecisionError:  # keys that differ only in spelling the fill merged: measure as given
                filled = decision
        with self._lock:
            self.decisions.append(decision)
            self.filled.append(filled)
            self.results.append(result)
            if self.table is None:
                self.table = Table(table.columns, table.key_columns, missing_markers=table.missing_markers)
            for row in table.rows:
                self.table.merge_row(row)
            return len(self.table)
