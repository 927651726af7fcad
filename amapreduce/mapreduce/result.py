"""What a MapReduce run returns, and the one vocabulary every command uses to say how a run ended.

Why one module: `ask`, `mapreduce run`, `demo`, `result.json` and the `mapreduce` tool's summary
must agree on what "complete" means and on the status strings users read. `Completeness` is the
one definition (a task that yields fewer than `rows_per_task` rows is incomplete, everywhere);
`RunStatus` is the one status enum, and `RunEnding` pairs it with the reason a run stopped and
writes the `status` string of `result.json`; `completeness_record` is the one JSON shape of a
run's `completeness`. `DiscoverySummary` (what `mapreduce.discover` did, `result.json`'s
`"discovery"`) is part of a result, so it lives here too.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from amapreduce.decision.model import Decision
from amapreduce.errors import BudgetExceeded, ProviderRejected, ProviderUnavailable
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import BatchPlan
from amapreduce.table.keys import normalize_value
from amapreduce.table.render import to_csv, to_jsonl, to_markdown
from amapreduce.table.table import Table
from amapreduce.trace import redact_secrets

__all__ = [
    "CANCELLED",
    "INTERRUPTED",
    "RUN_STOPPING_ERRORS",
    "SUPERSEDED",
    "AttemptRecord",
    "Completeness",
    "DiscoverySummary",
    "MapReduceResult",
    "RunEnding",
    "RunStatus",
    "RunSummary",
    "completeness_record",
    "stop_ending",
]


class RunStatus(StrEnum):
    """How a run ended. Code compares these members, never the strings users read."""

    COMPLETE = "complete"
    """Every expected row is there and no cell is missing."""
    INCOMPLETE = "incomplete"
    """The run finished, but cells are missing or some task yielded too few rows."""
    NO_TABLE = "no_table"
    """`ask` only: the manager answered without ever executing a decision."""
    STOPPED = "stopped"
    """A budget stop, `cancel()`, or a run-stopping error; the partial table is kept."""
    INTERRUPTED = "interrupted"
    """Ctrl-C; the partial table is kept."""
    FAILED = "failed"
    """The run raised; `result.json` records the error."""

    @property
    def ended_early(self) -> bool:
        """True when the run did not finish (its exit code: `amapreduce.cli.exit_codes.run_exit_code`)."""
        return self in (RunStatus.STOPPED, RunStatus.INTERRUPTED, RunStatus.FAILED)


@dataclass(frozen=True)
class RunEnding:
    """A run's status and, when it ended early, why."""

    status: RunStatus
    reason: str | None = None
    rejected: bool = field(default=False, compare=False)
    """The run was refused for good (`ProviderRejected`: wrong key, no access, no such model, invalid
    request), so every later run with the same settings would be refused too: a caller that starts
    many (`eval run`) stops on it. Set by `stop_ending` only. Not compared: it says which error the
    `reason` came from, and two endings with the same status and reason read the same."""

    @property
    def label(self) -> str:
        """The `status` string of `result.json` and the commands' `--json`: the status, or
        `stopped: <reason>` for a stop and `stopped: interrupted` for Ctrl-C (strings users
        and scripts already read)."""
        if self.status is RunStatus.INTERRUPTED:
            return "stopped: interrupted"
        if self.status is RunStatus.STOPPED:
            return f"stopped: {self.reason or 'cancelled'}"
        return self.status.value

    @property
    def error(self) -> str | None:
        """Why a `failed` run failed (the `error` of `result.json` and `--json`); None otherwise."""
        return self.reason if self.status is RunStatus.FAILED else None

    @staticmethod
    def status_of_label(label: object) -> RunStatus | None:
        """The status a `label` string (as `result.json` holds it) stands for; None for anything else."""
        if not isinstance(label, str):
            return None
        if label == INTERRUPTED.label:
            return RunStatus.INTERRUPTED
        if label.startswith(f"{RunStatus.STOPPED.value}:"):
            return RunStatus.STOPPED
        try:
            return RunStatus(label)
        except ValueError:
            return None


SUPERSEDED = "superseded"
"""The outcome of a straggler or its backup whose rival replied first (`AttemptRecord.outcome`)."""
INTERRUPTED = RunEnding(RunStatus.INTERRUPTED, "interrupted")
"""How a run stopped by Ctrl-C ends."""
CANCELLED = RunEnding(RunStatus.STOPPED, "the MapReduce run was cancelled")
"""How a run stopped by `MapReduceEngine.cancel()` ends."""


RUN_STOPPING_ERRORS: tuple[type[Exception], ...] = (BudgetExceeded, ProviderUnavailable)
"""Errors of one attempt that stop its whole run and keep its partial table (other runs of the
engine go on): a spent budget ends it `stopped`; a provider or search backend that stays down (its
circuit breaker gave up: `ProviderUnavailable`, `SearchUnavailable`) or that refuses the run for
good (a wrong key, no such model: `ProviderRejected`, never retried) ends it `failed`; the error's
one-line message is the reason. See `stop_ending`. The manager's run ends on them too
(`agents.manager`)."""


def stop_ending(exc: BaseException) -> RunEnding:
    """How a run stopped by `exc` (one of `RUN_STOPPING_ERRORS`) ended (no configured secret in
    the reason, which `result.json` and the journal keep)."""
    status = RunStatus.FAILED if isinstance(exc, ProviderUnavailable) else RunStatus.STOPPED
    return RunEnding(status, redact_secrets(str(exc)), rejected=isinstance(exc, ProviderRejected))


@dataclass(frozen=True, kw_only=True)
class Completeness:
    """How much of the asked-for table a run holds: the one definition of "complete".

    A task's rows are the table's rows whose cells equal the task's matrix values. A task needs
    one row when the matrix fills its key, else `rows_per_task` rows (at least one); a task with
    fewer is incomplete. Tasks with the same matrix values (context-only cells, or a follow-up
    that asks again) cannot be told apart by their rows, so they count as one group that needs
    the most rows any one decision asked of it.
    """

    rows: int
    expected_rows: int | None
    """Rows the decisions ask for (None: no decision ran)."""
    missing_cells: int
    incomplete_tasks: int
    """Tasks that yielded fewer rows than they need (short tasks)."""

    @property
    def complete(self) -> bool:
        """Rows were found, no cell is missing and no task is short."""
        return self.rows > 0 and self.missing_cells == 0 and self.incomplete_tasks == 0

    @property
    def status(self) -> RunStatus:
        """`COMPLETE` or `INCOMPLETE`: the status of a run that finished."""
        return RunStatus.COMPLETE if self.complete else RunStatus.INCOMPLETE

    @classmethod
    def nothing(cls) -> Completeness:
        """The completeness of a run that produced no table (it failed before one existed)."""
        return cls(rows=0, expected_rows=None, missing_cells=0, incomplete_tasks=0)

    @classmethod
    def of(cls, table: Table, decisions: Sequence[Decision]) -> Completeness:
        """The completeness of `table` as the answer to every decision in `decisions`."""
        need: dict[tuple[tuple[str, str], ...], int] = {}
        for decision in decisions:
            per_task = 1 if decision.one_row_per_task else decision.rows_per_task or 1
            asked: Counter[tuple[tuple[str, str], ...]] = Counter()
            for i in range(len(decision.task_matrix)):
                forced = decision.forced_values(i)
                asked[tuple(sorted((c, normalize_value(str(v))) for c, v in forced.items()))] += per_task
            for group, rows in asked.items():
                need[group] = max(need.get(group, 0), rows)
        found: Counter[tuple[tuple[str, str], ...]] = Counter()
        for columns in {tuple(c for c, _ in group) for group in need}:
            for row in table.rows:
                if all(c in row.cells for c in columns):
                    found[tuple((c, normalize_value(row.cells[c].value)) for c in columns)] += 1
        return cls(
            rows=len(table),
            expected_rows=sum(need.values()) if decisions else None,
            missing_cells=len(table.missing_cells()),
            incomplete_tasks=sum(1 for group, rows in need.items() if found[group] < rows),
        )

    def to_json(self) -> dict[str, Any]:
        """`rows`, `expected_rows`, `missing_cells`, `incomplete_tasks`, `complete`."""
        return {
            "rows": self.rows,
            "expected_rows": self.expected_rows,
            "missing_cells": self.missing_cells,
            "incomplete_tasks": self.incomplete_tasks,
            "complete": self.complete,
        }


@dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One sub-agent attempt on one batch."""

    batch_id: str
    phase: str
    attempt: int
    outcome: str
    """`ok`, `parse_error`, `error`, `timeout`, `cancelled`, or `superseded` (a straggler or its
    backup whose rival replied first: cancelled, its rows not merged, its usage still counted)."""
    elapsed_s: float
    rows: int = 0
    """Rows parsed from the reply."""
    dropped_rows: int = 0
    """Rows that fit no sub-question or had no usable key."""
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    backup: bool = False
    """Whether the attempt was a straggler's backup (`mapreduce.backup`); it has its straggler's number."""


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """Completeness and cost of one engine execution."""

    completeness: Completeness
    conflicts: int
    patch_rounds: int
    batches: int
    attempts: int
    retries: int
    timeouts: int
    failures: int
    """Attempts that crashed or returned no readable JSON."""
    usage: Usage
    timings: Mapping[str, float]
    backups: int = 0
    """Backup attempts started for stragglers (`mapreduce.backup`)."""
    """`map_s`, `patch_s`, `wall_s`."""

    @property
    def rows(self) -> int:
        """Rows of the reduced table."""
        return self.completeness.rows

    @property
    def missing_cells(self) -> int:
        """Cells still missing in the reduced table."""
        return self.completeness.missing_cells

    @property
    def incomplete_tasks(self) -> int:
        """Tasks that yielded fewer rows than they need."""
        return self.completeness.incomplete_tasks

    @property
    def complete(self) -> bool:
        """See `Completeness.complete`."""
        return self.completeness.complete

    @classmethod
    def of(
        cls,
        table: Table,
        decision: Decision,
        records: Sequence[AttemptRecord],
        *,
        rounds: int,
        batches: int,
        timings: Mapping[str, float],
    ) -> RunSummary:
        """The summary of `table`, the reduced answer to `decision`."""
        return cls(
            completeness=Completeness.of(table, [decision]),
            conflicts=_conflicts(table),
            patch_rounds=rounds,
            batches=batches,
            attempts=len(records),
            retries=sum(1 for r in records if r.attempt > 1 and not r.backup),
            timeouts=sum(1 for r in records if r.outcome == "timeout"),
            failures=sum(1 for r in records if r.outcome in ("error", "parse_error")),
            usage=sum((r.usage for r in records), Usage()),
            timings={k: round(v, 6) for k, v in timings.items()},
            backups=sum(1 for r in records if r.backup),
        )

    @classmethod
    def combined(cls, table: Table, completeness: Completeness, parts: Sequence[RunSummary]) -> RunSummary:
        """The summary of `table`, made from the executions `parts` (a nested decision's child runs,
        a discovery and its fill): their effort, usage and timings added up."""
        return cls(
            completeness=completeness,
            conflicts=_conflicts(table),
            patch_rounds=sum(s.patch_rounds for s in parts),
            batches=sum(s.batches for s in parts),
            attempts=sum(s.attempts for s in parts),
            retries=sum(s.retries for s in parts),
            timeouts=sum(s.timeouts for s in parts),
            failures=sum(s.failures for s in parts),
            usage=sum((s.usage for s in parts), Usage()),
            timings={k: round(sum(s.timings.get(k, 0.0) for s in parts), 6) for k in ("map_s", "patch_s", "wall_s")},
            backups=sum(s.backups for s in parts),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON fields: the completeness fields, then the effort, usage and timings."""
        return {
            **self.completeness.to_json(),
            "conflicts": self.conflicts,
            "patch_rounds": self.patch_rounds,
            "batches": self.batches,
            "attempts": self.attempts,
            "retries": self.retries,
            "timeouts": self.timeouts,
            "failures": self.failures,
            "backups": self.backups,
            "usage": self.usage.to_json(),
            "timings": dict(self.timings),
        }


def _conflicts(table: Table) -> int:
    return sum(1 for row in table.rows for cell in row.cells.values() if cell.alternatives)


def completeness_record(
    completeness: Completeness, executions: Sequence[RunSummary], *, mapreduce_calls: int | None = None
) -> dict[str, Any]:
    """The `completeness` object of `result.json` and of the commands' `--json`: one shape for
    `ask`, `demo` and `mapreduce run` — the `Completeness` fields, then the effort summed over the
    run's engine executions. `mapreduce_calls` is the manager's tool calls (null without a manager).
    """
    return {
        **completeness.to_json(),
        "mapreduce_calls": mapreduce_calls,
        "executions": len(executions),
        "batches": sum(s.batches for s in executions),
        "patch_rounds": sum(s.patch_rounds for s in executions),
        "attempts": sum(s.attempts for s in executions),
        "retries": sum(s.retries for s in executions),
        "timeouts": sum(s.timeouts for s in executions),
        "failures": sum(s.failures for s in executions),
        "backups": sum(s.backups for s in executions),
    }


@dataclass(frozen=True)
class DiscoverySummary:
    """What discovery did, for `result.json` (`"discovery"`) and the tool's reply."""

    sources: int
    candidates: int
    """Distinct candidates after the code dedup (normalised key), before any model merge."""
    entities: int
    merge_calls: int
    levels: int
    """Intermediate reduce levels of the merge tree (0 without a model merge)."""
    nodes: tuple[str, ...]
    """Node labels in run order: `map` per batch, then `reduce L1` ..., `final`."""
    peak_prompt_tokens: int
    """The largest prompt of any merge call (provider count when reported, else the counter's)."""
    token_budget: int | None
    """Prompt tokens a merge call may use (None: static chunk size, or no model merge)."""
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON object (every field, `nodes` and `warnings` as lists)."""
        return {**dataclasses.asdict(self), "nodes": list(self.nodes), "warnings": list(self.warnings)}


@dataclass(frozen=True, kw_only=True)
class MapReduceResult:
    """The reduced table and how it was obtained."""

    table: Table
    summary: RunSummary
    plan: BatchPlan
    attempts: tuple[AttemptRecord, ...]
    ending: RunEnding
    """`COMPLETE` / `INCOMPLETE` for a run that finished; `STOPPED` or `INTERRUPTED` (with the
    reason) for the partial result a stopped run carries."""
    discovery: DiscoverySummary | None = None
    """How the task matrix was discovered, for a decision with `discover` (`result.json`'s
    `"discovery"`); None when the matrix was given. Set by `mapreduce.compose.execute_decision`."""

    @classmethod
    def empty(cls, table: Table, decision: Decision, plan: BatchPlan, ending: RunEnding) -> MapReduceResult:
        """A result of no attempt: `table` (empty) as the answer to `decision`, ended `ending`."""
        summary = RunSummary.of(table, decision, (), rounds=0, batches=0, timings={})
        return cls(table=table, summary=summary, plan=plan, attempts=(), ending=ending)

    @property
    def cancelled(self) -> bool:
        """True when the run was stopped before it finished."""
        return self.ending.status.ended_early

    def markdown(self) -> str:
        """The table as WideSearch-readable fenced markdown."""
        return to_markdown(self.table)

    def csv(self) -> str:
        """The table as CSV text."""
        return to_csv(self.table)

    def jsonl(self, *, with_status: bool = False) -> str:
        """The table as JSON lines."""
        return to_jsonl(self.table, with_status=with_status)
