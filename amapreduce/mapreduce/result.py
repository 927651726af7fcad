"""What a MapReduce run returns: the reduced table, a summary, and every attempt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import BatchPlan
from amapreduce.table.render import to_csv, to_jsonl, to_markdown
from amapreduce.table.table import Table

__all__ = ["AttemptRecord", "MapReduceResult", "RunSummary"]


@dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One sub-agent attempt on one batch."""

    batch_id: str
    phase: str
    attempt: int
    outcome: str
    """`ok`, `parse_error`, `error`, `timeout`, or `cancelled`."""
    elapsed_s: float
    rows: int = 0
    """Rows parsed from the reply."""
    dropped_rows: int = 0
    """Rows that fit no sub-question or had no usable key."""
    error: str | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """Completeness and cost of a run."""

    rows: int
    missing_cells: int
    incomplete_tasks: int
    """Multi-row tasks that yielded fewer rows than required."""
    conflicts: int
    complete: bool
    patch_rounds: int
    batches: int
    attempts: int
    retries: int
    timeouts: int
    failures: int
    """Attempts that crashed or returned no readable JSON."""
    usage: Usage
    timings: Mapping[str, float]
    """`map_s`, `patch_s`, `wall_s`."""

    @classmethod
    def of(
        cls,
        table: Table,
        task_tables: Mapping[int, Table],
        records: Sequence[AttemptRecord],
        *,
        rows_per_task: int | None,
        rounds: int,
        batches: int,
        timings: Mapping[str, float],
    ) -> RunSummary:
        """The summary of a reduced `table`; `rows_per_task` is None when each task is one row."""
        incomplete = sum(1 for t in task_tables.values() if len(t) < (rows_per_task or 0))
        missing = len(table.missing_cells())
        return cls(
            rows=len(table),
            missing_cells=missing,
            incomplete_tasks=incomplete,
            conflicts=sum(1 for row in table.rows for cell in row.cells.values() if cell.alternatives),
            complete=missing == 0 and incomplete == 0,
            patch_rounds=rounds,
            batches=batches,
            attempts=len(records),
            retries=sum(1 for r in records if r.attempt > 1),
            timeouts=sum(1 for r in records if r.outcome == "timeout"),
            failures=sum(1 for r in records if r.outcome in ("error", "parse_error")),
            usage=sum((r.usage for r in records), Usage()),
            timings={k: round(v, 6) for k, v in timings.items()},
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON fields."""
        return {
            "rows": self.rows,
            "missing_cells": self.missing_cells,
            "incomplete_tasks": self.incomplete_tasks,
            "conflicts": self.conflicts,
            "complete": self.complete,
            "patch_rounds": self.patch_rounds,
            "batches": self.batches,
            "attempts": self.attempts,
            "retries": self.retries,
            "timeouts": self.timeouts,
            "failures": self.failures,
            "usage": self.usage.to_json(),
            "timings": dict(self.timings),
        }


@dataclass(frozen=True, kw_only=True)
class MapReduceResult:
    """The reduced table and how it was obtained."""

    table: Table
    summary: RunSummary
    plan: BatchPlan
    attempts: tuple[AttemptRecord, ...]
    cancelled: bool = False

    def markdown(self) -> str:
        """The table as WideSearch-readable fenced markdown."""
        return to_markdown(self.table)

    def csv(self) -> str:
        """The table as CSV text."""
        return to_csv(self.table)

    def jsonl(self, *, with_status: bool = False) -> str:
        """The table as JSON lines."""
        return to_jsonl(self.table, with_status=with_status)
