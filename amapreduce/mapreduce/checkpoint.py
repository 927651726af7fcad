"""What the engine writes to a run's journal, and how a resumed run replays it.

Why here, in the engine's package: the engine is the one that knows when a batch attempt is
settled and which rows it merged, and it must not import the run layer. So the engine's journal
entries live here, and a run hands the engine a per-run `Checkpoint` (over any `EntrySink`, in
practice the run directory's `amapreduce.journal.JournalWriter`).

Entries (one journal format for runs and evaluations: see `amapreduce.journal`):

* `ExecutionStarted`: one per engine execution, the validated decision and its batch plan.
* `BatchAttempt`: one per settled attempt, written by the engine's loop when it settles it,
  before the batch counts as done: the rows it merged (task index, values, source), its outcome,
  usage, and whether the batch is `done` (it needs no further attempt).

Resuming: a `Checkpoint` made over the entries already in the journal hands each execution
that runs the same decision again its saved attempts. The engine replays their merged rows in
journal order, which is the order it merged them (its loop settles one attempt at a time), so the
per-task tables are rebuilt exactly; it then runs only the batches not done, a partly done batch
continuing like a retry.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from amapreduce.decision.model import Decision
from amapreduce.errors import UserError
from amapreduce.journal import JournalEntry
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import Batch, BatchPlan
from amapreduce.mapreduce.replies import ProjectedRow
from amapreduce.mapreduce.result import SUPERSEDED, AttemptRecord
from amapreduce.mapreduce.work import MATRIX_SOURCE, WorkItem
from amapreduce.table.evidence import Evidence
from amapreduce.table.table import Table

__all__ = [
    "ENGINE_ENTRIES",
    "BatchAttempt",
    "Checkpoint",
    "EntrySink",
    "ExecutionCheckpoint",
    "ExecutionStarted",
    "MergedRow",
    "plan_from_manifest",
    "plan_manifest",
]


class EntrySink(Protocol):
    """Where entries go (a `JournalWriter`); `append` returns once the entry is durable."""

    def append(self, entry: JournalEntry) -> None:
        """Record `entry`."""
        ...


class MergedRow(BaseModel):
    """One reply row as the engine merged it into a task's table: enough to merge it again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_index: int
    values: dict[str, str]
    """The row's cells, the item's forced cells already written over the reply's."""
    source: str | None
    matrix_columns: tuple[str, ...]
    """Cells the item forced (their source is the task matrix)."""
    cell_sources: dict[str, str] = {}
    """Column → the URL its quote came from, where it is not the row's `source`."""
    quotes: dict[str, str] = {}
    """Column → the sub-agent's verbatim quote for the value (journals before quotes have none)."""
    evidence: dict[str, Evidence] = {}
    """Column → what checking the quote found, in the attempt that fetched the pages (a resumed
    run replays it: the fetched text is gone by then)."""

    @classmethod
    def of(cls, item: WorkItem, row: ProjectedRow) -> MergedRow:
        """The merge of reply row `row` into the table of `item`'s task."""
        def answered(cells: dict[str, Any]) -> dict[str, Any]:
            return {c: v for c, v in cells.items() if c not in item.forced}

        return cls(
            task_index=item.task_index,
            values={**row.values, **item.forced},
            source=row.source,
            matrix_columns=tuple(item.forced),
            cell_sources=answered(row.cell_sources),
            quotes=answered(row.quotes),
            evidence=answered(row.evidence),
        )

    def apply(self, tables: dict[int, Table]) -> bool:
        """Merge the row into its task's table; False when it had no usable key (not placed)."""
        sources = {**self.cell_sources, **dict.fromkeys(self.matrix_columns, MATRIX_SOURCE)}
        placed = tables[self.task_index].upsert(
            self.values, task_index=self.task_index, source=self.source, sources=sources, quotes=self.quotes,
            evidence=self.evidence,
        )
        return placed is not None


class ExecutionStarted(JournalEntry):
    """An engine execution began: its decision and batch plan."""

    type: Literal["execution"] = "execution"
    execution: int
    """1, 2, ... in the order executions began in the run."""
    decision: dict[str, Any]
    """The validated decision as JSON (`Decision.model_dump(mode="json")`)."""
    plan: dict[str, Any]
    """The batch plan: `strategy`, `num_rows` and each batch's manifest (see `plan_manifest`)."""


class BatchAttempt(JournalEntry):
    """One settled attempt of one batch, with the rows it merged."""

    type: Literal["batch_attempt"] = "batch_attempt"
    execution: int
    batch_id: str
    phase: str
    """`map` or `patch<k>`."""
    attempt: int
    outcome: str
    """`ok`, `parse_error`, `error`, `timeout` or `superseded` (as `AttemptRecord.outcome`)."""
    done: bool
    """The batch needs no further attempt (nothing missing, or its attempts are spent)."""
    rows: tuple[MergedRow, ...] = ()
    """The rows merged, in merge order."""
    parsed_rows: int = 0
    dropped_rows: int = 0
    error: str | None = None
    elapsed_s: float = 0.0
    usage: Usage = Usage()
    backup: bool = False
    """The attempt was a straggler's backup (journals before backups have none)."""

    def record(self) -> AttemptRecord:
        """The attempt as the engine's own record of it."""
        return AttemptRecord(
            batch_id=self.batch_id, phase=self.phase, attempt=self.attempt, outcome=self.outcome,
            elapsed_s=self.elapsed_s, rows=self.parsed_rows, dropped_rows=self.dropped_rows, error=self.error,
            usage=self.usage, backup=self.backup,
        )


ENGINE_ENTRIES: tuple[type[JournalEntry], ...] = (ExecutionStarted, BatchAttempt)
"""The entry types the engine writes (a reader passes them to `read_journal` with its own)."""


def plan_manifest(plan: BatchPlan) -> dict[str, Any]:
    """The plan as `ExecutionStarted.plan` holds it (every batch's manifest)."""
    return {"strategy": plan.strategy, "num_rows": plan.num_rows, "batches": [b.manifest() for b in plan.batches]}


def plan_from_manifest(manifest: dict[str, Any]) -> BatchPlan:
    """The batch plan `plan_manifest` wrote."""
    return BatchPlan(
        strategy=manifest["strategy"],
        num_rows=manifest["num_rows"],
        batches=tuple(
            Batch(
                batch_id=b["batch_id"], indices=tuple(b["source_indices"]), rationale=b["rationale"],
                shared_context=dict(b["shared_context"]),
            )
            for b in manifest["batches"]
        ),
    )


class ExecutionCheckpoint:
    """One engine execution's part of the journal: its saved attempts and where new ones go."""

    def __init__(self, sink: EntrySink, number: int, saved: Sequence[BatchAttempt]) -> None:
        self._sink = sink
        self.number = number
        self._saved = list(saved)

    def saved(self, phase: str) -> list[BatchAttempt]:
        """The attempts of `phase` a previous process settled, in the order it settled them."""
        return [a for a in self._saved if a.phase == phase]

    def replay(
        self, phase: str, batch_ids: Sequence[str], tables: dict[int, Table], records: list[AttemptRecord]
    ) -> dict[str, BatchAttempt]:
        """Merge the rows of the phase's saved attempts into `tables` again, in the order they were
        merged, and add their records; return each attempted batch's last attempt. A `superseded`
        attempt (the loser of a straggler and its backup) counts for its usage only: the batch's
        state is its winner's, so a resumed run never counts the batch twice.

        Raises:
            UserError: the journal holds an attempt of a batch this run does not plan.
        """
        known = set(batch_ids)
        last: dict[str, BatchAttempt] = {}
        for attempt in self.saved(phase):
            if attempt.batch_id not in known:
                raise UserError(
                    f"the journal holds an attempt of batch {attempt.batch_id!r} in {phase}, which this run does not "
                    "plan; it cannot be resumed by this version of amapreduce."
                )
            for row in attempt.rows:
                row.apply(tables)
            records.append(attempt.record())
            if attempt.outcome != SUPERSEDED:
                last[attempt.batch_id] = attempt
        return last

    def record(self, attempt: BatchAttempt) -> None:
        """Append a settled attempt (durable when this returns)."""
        self._sink.append(attempt)


class Checkpoint:
    """A run's journal as the engine sees it: executions begin here and their attempts are saved.

    Made over the entries a journal already holds (`saved`), it resumes: the first execution
    (in journal order) of the same decision that has not been claimed yet is continued rather
    than started again. Thread-safe (a manager may run two executions at once).
    """

    def __init__(self, sink: EntrySink, saved: Sequence[JournalEntry] = ()) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self.executions = [e for e in saved if isinstance(e, ExecutionStarted)]
        """The executions the journal already holds, in order."""
        self._attempts = [e for e in saved if isinstance(e, BatchAttempt)]
        self._unclaimed = list(self.executions)
        self._next = max((e.execution for e in self.executions), default=0) + 1

    def begin(self, decision: Decision, plan: BatchPlan) -> ExecutionCheckpoint:
        """Continue the saved execution of `decision`, or record a new one.

        Raises:
            UserError: a saved execution of this decision planned other batches (the journal
                does not belong to this code or decision).
        """
        decision_json = decision.model_dump(mode="json")
        manifest = plan_manifest(plan)
        with self._lock:
            for saved in self._unclaimed:
                if saved.decision == decision_json:
                    self._unclaimed.remove(saved)
                    if saved.plan != manifest:
                        raise UserError(
                            f"execution {saved.execution} of the journal planned other batches than this decision "
                            "plans now; it cannot be resumed by this version of amapreduce."
                        )
                    attempts = [a for a in self._attempts if a.execution == saved.execution]
                    return ExecutionCheckpoint(self._sink, saved.execution, attempts)
            number, self._next = self._next, self._next + 1
            self._sink.append(ExecutionStarted(execution=number, decision=decision_json, plan=manifest))
        return ExecutionCheckpoint(self._sink, number, ())
