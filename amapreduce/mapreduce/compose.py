"""Composed execution: a decision that discovers its matrix, or runs a child decision per task.

Why here and not in the engine: the engine runs one flat decision (and is at its size limit);
composition only needs to run several of them, one after another, through the same engine. So
every child run shares the engine's rate limiter, usage meter and budget, trace and executor
settings, and the run's checkpoint: a resumed run finds each child's execution in the journal
(its decision, with the parent's cells filled in, identifies it) and replays it.

* plain decision: `engine.run`, unchanged.
* `discover`: `mapreduce.discover.discover` finds the entities, `Decision.with_matrix` makes
  them the task matrix, the fill runs (with its child, if any), and the `DiscoverySummary`
  rides on the result (`MapReduceResult.discovery`, `result.json`'s `"discovery"`).
* `child`: for each parent task i, in matrix order, `Decision.child_for(i)` runs recursively (each
  child is parallel inside; tasks are sequential, so the `workers` limit holds for the whole
  tree). Its rows merge into the parent's table with the parent's matrix-mapped cells forced
  (source `task_matrix`) and `Row.origin` naming the path (`top10[2019]/fill[Paris]`).

The combined summary adds up the parts' effort, usage and timings; its completeness is that of
the combined table, with the parts' expected rows and short tasks added up (a discovery that
found nothing is one short task). A part that stops early (its result's `ending`) or fails (an
amapreduce error, as a `failed` ending) stops the whole run: the combined result so far is
returned, its ending the part's with the part's path in front of its reason. Nothing here raises a stop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from amapreduce.decision.discover_spec import DiscoverSpec
from amapreduce.decision.model import Decision
from amapreduce.errors import AmapreduceError
from amapreduce.mapreduce.batching import BatchPlan
from amapreduce.mapreduce.checkpoint import Checkpoint
from amapreduce.mapreduce.discover import DEFAULT_CONTEXT_WINDOW, DiscoveryResult, discover
from amapreduce.mapreduce.engine import MapReduceEngine
from amapreduce.mapreduce.merge import Merger
from amapreduce.mapreduce.result import (
    CANCELLED,
    INTERRUPTED,
    Completeness,
    DiscoverySummary,
    MapReduceResult,
    RunEnding,
    RunStatus,
    RunSummary,
)
from amapreduce.table.table import MATRIX_SOURCE, Cell, CellStatus, Row, Table
from amapreduce.trace import redact_secrets

__all__ = ["execute_decision"]


def execute_decision(
    engine: MapReduceEngine,
    decision: Decision,
    *,
    plan: BatchPlan | None = None,
    checkpoint: Checkpoint | None = None,
    merger: Merger | None = None,
    context_window: int | None = None,
) -> MapReduceResult:
    """Execute `decision`, composed or not (see the module doc).

    Args:
        engine: runs every flat decision of the composition.
        decision: the validated decision Θ.
        plan: the batch plan of a plain decision (as `engine.run`); not used for a decision with
            `discover` or `child`, whose parts plan their own batches under the engine's cap.
        checkpoint: the run's journal, shared by every part.
        merger: merges fuzzy duplicates for a `discover` with `merge: "model"`.
        context_window: the merge model's context window (tokens), for a discovery's token budget;
            None: discovery's default.

    Returns:
        The combined result; a run that stopped (budget, `cancel()`, Ctrl-C, a provider down) or
        whose child failed is returned too, its `ending` saying why, with the path of the part.

    Raises:
        DecisionError: a plain decision's batch plan exceeds the engine's `max_batches`.
    """
    return _Composer(engine, checkpoint, merger, context_window, engine.cancels).run(decision, plan)


@dataclass(frozen=True)
class _Composer:
    engine: MapReduceEngine
    checkpoint: Checkpoint | None
    merger: Merger | None
    context_window: int | None
    cancels: int
    """`engine.cancels` when the run started: a cancel that came while no part was in flight
    (between two children, or after discovery) reached no engine run, so the next part must not start."""

    def cancelled(self) -> bool:
        return self.engine.cancels != self.cancels

    def run(self, decision: Decision, plan: BatchPlan | None = None) -> MapReduceResult:
        if decision.discover is not None:
            return self._discover(decision, decision.discover)
        if decision.child is not None:
            return self._nested(decision)
        return self.engine.run(decision, plan=plan, checkpoint=self.checkpoint)

    def _table(self, decision: Decision) -> Table:
        return self.engine.config.table_for(decision)

    # -- discover, then fill -----------------------------------------------------------------------

    def _discover(self, decision: Decision, spec: DiscoverSpec) -> MapReduceResult:
        window = DEFAULT_CONTEXT_WINDOW if self.context_window is None else self.context_window
        found = discover(self.engine, spec, merger=self.merger, checkpoint=self.checkpoint,
                         trace=self.engine.trace, context_window=window)
        if found.stopped:
            stopped = found.map_result
            table = self._table(decision)
            for row in stopped.table.rows:  # the candidates found so far, as rows of this table
                table.merge_row(row)
            ending = _prefixed(stopped.ending, "discovery")
            return _result(table, Completeness.of(table, []), [("discover", stopped)], ending)
        if not found.rows:
            table = self._table(decision)
            nothing = Completeness(rows=0, expected_rows=0, missing_cells=0, incomplete_tasks=1)
            return _with_discovery(_result(table, nothing, [], None), found)
        if self.cancelled():
            empty = self._table(decision)
            return _with_discovery(_result(empty, Completeness.of(empty, []), [], CANCELLED), found)
        return _with_discovery(self.run(decision.with_matrix(found.rows)), found)

    # -- a child per task --------------------------------------------------------------------------

    def _nested(self, parent: Decision) -> MapReduceResult:
        name = parent.child if isinstance(parent.child, str) else None
        table = self._table(parent)
        parts: list[tuple[str, MapReduceResult]] = []
        for i, cells in enumerate(parent.task_matrix):
            step = f"{name or 'child'}[{', '.join(cells)}]"
            where = f"{f'child {name}' if name else 'the child'} of task {i} ({', '.join(cells)})"
            if self.cancelled():
                return self._combined(parent, table, parts, CANCELLED)
            try:
                result = self.run(parent.child_for(i))
            except (AmapreduceError, KeyboardInterrupt) as exc:
                self.engine.trace.write("child_run", path=step, task=i, status="failed", error=redact_secrets(str(exc)))
                ending = INTERRUPTED if isinstance(exc, KeyboardInterrupt) else RunEnding(
                    RunStatus.FAILED, redact_secrets(f"{where}: {exc}"))
                return self._combined(parent, table, parts, ending)
            parts.append((step, result))
            self._merge(table, parent, i, step, result)
            self.engine.trace.write("child_run", path=step, task=i, status=result.ending.label, rows=len(result.table))
            if result.ending.status.ended_early:  # a child that stopped stops the whole run
                return self._combined(parent, table, parts, _prefixed(result.ending, where))
        return self._combined(parent, table, parts, None)

    def _merge(self, table: Table, parent: Decision, i: int, step: str, result: MapReduceResult) -> None:
        """Merge a child's rows into the parent's table: parent task `i`'s matrix cells forced."""
        forced = {c: Cell(value=v, status=CellStatus.FOUND, source=MATRIX_SOURCE) for c, v in parent.forced_values(i).items()}
        for row in result.table.rows:
            cells = {c: forced.get(c) or row.cells[c] for c in table.columns if c in forced or c in row.cells}
            origin = step if row.origin is None else f"{step}/{row.origin}"
            table.merge_row(Row(cells=cells, task_index=i, origin=origin))

    def _combined(
        self, parent: Decision, table: Table, parts: Sequence[tuple[str, MapReduceResult]], ending: RunEnding | None
    ) -> MapReduceResult:
        table.sort_by_task()
        done = [r.summary.completeness for _, r in parts]
        completeness = Completeness(
            rows=len(table),
            expected_rows=sum(c.expected_rows or 0 for c in done),
            missing_cells=len(table.missing_cells()),
            incomplete_tasks=sum(c.incomplete_tasks for c in done),
        )
        return _result(table, completeness, parts, ending, num_rows=len(parent.task_matrix))


def _result(
    table: Table,
    completeness: Completeness,
    parts: Sequence[tuple[str, MapReduceResult]],
    ending: RunEnding | None,
    *,
    num_rows: int = 0,
) -> MapReduceResult:
    """A combined result: `parts`' effort added up, their attempts and batches named by their path."""
    return MapReduceResult(
        table=table,
        summary=RunSummary.combined(table, completeness, [r.summary for _, r in parts]),
        plan=BatchPlan(
            strategy="nested", num_rows=num_rows,
            batches=tuple(dataclasses.replace(b, batch_id=f"{step}/{b.batch_id}") for step, r in parts for b in r.plan.batches),
        ),
        attempts=tuple(dataclasses.replace(a, batch_id=f"{step}/{a.batch_id}") for step, r in parts for a in r.attempts),
        ending=ending or RunEnding(completeness.status),
        discovery=_discoveries([r.discovery for _, r in parts]),
    )


def _with_discovery(result: MapReduceResult, found: DiscoveryResult) -> MapReduceResult:
    """`result` (the fill) with the discovery's map effort added and its summary attached."""
    mapped = found.map_result
    return dataclasses.replace(
        result,
        summary=dataclasses.replace(
            combined := RunSummary.combined(result.table, result.summary.completeness, [mapped.summary, result.summary]),
            usage=combined.usage + found.merge_usage),
        plan=dataclasses.replace(result.plan, batches=(
            *(dataclasses.replace(b, batch_id=f"discover/{b.batch_id}") for b in mapped.plan.batches), *result.plan.batches)),
        attempts=(*(dataclasses.replace(a, batch_id=f"discover/{a.batch_id}") for a in mapped.attempts), *result.attempts),
        discovery=_discoveries([found.summary, result.discovery]),
    )


def _discoveries(found: Sequence[DiscoverySummary | None]) -> DiscoverySummary | None:
    """The discoveries of a run's parts as one summary: counts added up, nodes and warnings in
    run order, the deepest tree and the largest prompt; None when no part discovered."""
    items = [s for s in found if s is not None]
    if len(items) <= 1:
        return items[0] if items else None
    return DiscoverySummary(
        sources=sum(s.sources for s in items),
        candidates=sum(s.candidates for s in items),
        entities=sum(s.entities for s in items),
        merge_calls=sum(s.merge_calls for s in items),
        levels=max(s.levels for s in items),
        nodes=tuple(n for s in items for n in s.nodes),
        peak_prompt_tokens=max(s.peak_prompt_tokens for s in items),
        token_budget=next((s.token_budget for s in items if s.token_budget is not None), None),
        warnings=tuple(w for s in items for w in s.warnings),
    )


def _prefixed(ending: RunEnding, where: str) -> RunEnding:
    """`ending` with `where` (the path of the part that stopped) in front of its reason."""
    return dataclasses.replace(ending, reason=f"{where}: {ending.reason or 'cancelled'}")

