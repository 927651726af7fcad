"""`Ledger`: what a run executed, and the `mapreduce` tool's guards over it.

The run's `Session` keeps one: the decisions executed (as given, and as their tasks ran), each
execution's result, the run's one table that every execution's rows reduce into, the `mapreduce`
calls counted against the cap, and an `ask`'s executed decisions kept for a resume
(`executed.json`). It is changed under one lock: smolagents runs a step's tool calls in parallel.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from amapreduce._atomic import write_json
from amapreduce.errors import DecisionError

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.result import MapReduceResult
    from amapreduce.table.table import Table

__all__ = ["Ledger"]


@dataclass
class Ledger:
    """A run's executions, its one table and the `mapreduce` tool's guards (see the module doc)."""

    calls: int = 0
    """Accepted `mapreduce` calls (the plan stage included)."""
    planned: bool = False
    executed: set[str] = field(default_factory=set)
    """The executed calls' arguments, canonical JSON: an identical call is refused."""
    shape: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    """(columns, key columns) of the run's table, fixed by the first executed call."""
    decisions: list[Decision] = field(default_factory=list)
    filled: list[Decision] = field(default_factory=list)
    """`decisions` as their tasks ran: a discovery's with the entities it found as its matrix
    (what completeness is measured against; a discovery that found nothing asks for nothing)."""
    results: list[MapReduceResult] = field(default_factory=list)
    table: Table | None = None
    kept: list[dict[str, Any]] = field(default_factory=list)
    """An `ask`'s executions as `executed.json` keeps them."""
    composed: bool = False
    """Whether `kept` is written (from the first composed decision on)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self, decision: Decision, *, cap: int,
              plan_stage: bool) -> tuple[Literal["plan", "execute"], tuple[str, str] | None]:
        """Count one `mapreduce` call of `decision`: its stage (with `plan_stage`, the first call is
        the plan stage), and (reason, message) when a guard refuses it (then it is not counted):
        more than `cap` calls, arguments already executed, or key columns the table is not keyed by."""
        signature = json.dumps(decision.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        with self.lock:
            stage: Literal["plan", "execute"] = "plan" if plan_stage and not self.planned else "execute"
            if self.calls >= cap:
                return stage, ("max_calls", (
                    f"mapreduce may be called at most {cap} times per run and was already called "
                    f"{self.calls} times. Finish with what the table has; missing cells stay empty."))
            if stage == "execute" and signature in self.executed:
                return stage, ("repeated_args", (
                    "these exact arguments were already executed. To fill gaps, call mapreduce with a matrix of "
                    "ONLY the rows still missing, or finish with the table as it is."))
            if stage == "execute" and (mismatch := self._shape_mismatch(decision)) is not None:
                return stage, ("other_columns", mismatch)
            self.calls += 1
            if stage == "plan":
                self.planned = True
            else:
                self.executed.add(signature)
                if self.shape is None:
                    self.shape = (tuple(decision.columns), tuple(decision.resolved_key_columns))
            return stage, None

    def _shape_mismatch(self, decision: Decision) -> str | None:
        """Why `decision`'s rows could not merge into the run's table (None: they can; columns
        the table lacks are ignored when merging, so only the key columns must match)."""
        if self.shape is None:
            return None
        columns, keys = self.shape
        if tuple(decision.resolved_key_columns) == keys:
            return None
        return (
            f"this run's table has columns {list(columns)} keyed by {list(keys)}; a follow-up must use the same "
            f"key columns (this call is keyed by {list(decision.resolved_key_columns)}) so that its rows fill "
            "the same table. Call mapreduce again with those key columns, or finish with the table as it is."
        )

    def keep(self, decision: Decision, plan: BatchPlan | None, path: Path, *, always: bool = False) -> None:
        """Keep `decision` (with its plan; None for a composed one) in order; from the first
        composed one on (`always`: from the first), write them all to `path` (atomically) before
        it runs, for a resume: a composed decision's journal entries are its parts', not itself."""
        from amapreduce.mapreduce.checkpoint import plan_manifest

        with self.lock:
            self.kept.append({"decision": decision.model_dump(mode="json"),
                              "plan": None if plan is None else plan_manifest(plan)})
            self.composed = self.composed or decision.composed or always
            if self.composed:
                write_json(path, self.kept)

    def record(self, decision: Decision, result: MapReduceResult,
               table_for: Callable[[Decision], Table] | None) -> int:
        """Record an execution and merge its rows into the run's table (a delta follow-up fills the
        same rows; `admit` refused any whose rows could not merge), the first execution's table
        built by `table_for` (None: the result's own table is the run's). Returns the table's rows."""
        filled = decision
        if decision.discover is not None:
            keys = [c for c in decision.resolved_matrix_columns if c is not None]
            found = list({tuple(row.cells[k].value for k in keys): None for row in result.table.rows if all(
                k in row.cells for k in keys)})
            try:
                filled = decision.with_matrix([list(k) for k in found]) if found else decision
            except DecisionError:  # keys that differ only in spelling the fill merged: measure as given
                filled = decision
        with self.lock:
            self.decisions.append(decision)
            self.filled.append(filled)
            self.results.append(result)
            if self.table is None:
                self.table = table_for(decision) if table_for is not None else result.table.empty_like()
            for row in result.table.rows:
                self.table.merge_row(row)
            return len(self.table)
