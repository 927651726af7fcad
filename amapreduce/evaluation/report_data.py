"""The input side of `amapreduce eval report`: read and check an `eval run` folder.

Why a module of its own: the report's numbers come from two files `eval run` writes
(`results.json`, `memory_log.jsonl`), and reading them is a contract with another command that
can change on its own; drawing and rendering (`report_plots`, `report`) only see the checked
`EvalRun` built here, so a changed file format touches this module alone.

Every number in the report is computed from the per-trial results, one source of truth:
"per task" means one run of one task, so each task's value is the mean over its trials and the
headline is the mean over tasks (for the metrics this is exactly Avg@N of `eval score`, see
`summary.summarize`). Run facts (cost, tokens, sub-agents) are averaged over the trials that ran.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce.errors import UserError

__all__ = [
    "MEMORY_LOG_FILE",
    "RESULTS_FILE",
    "EvalRun",
    "HalfStats",
    "MemoryBlock",
    "MemoryLogEntry",
    "TrialResult",
    "as_float",
    "load_eval_run",
    "max_or_none",
    "mean",
    "mean_or_none",
    "split_halves",
]

RESULTS_FILE = "results.json"
MEMORY_LOG_FILE = "memory_log.jsonl"


# --- the input contract -------------------------------------------------------------------------
# Tolerant of extra keys (`extra="ignore"`): `eval run` may add fields, and a report of an older or
# newer folder should still draw what it can. Only what the report uses is required.


class TrialResult(BaseModel):
    """One (task, trial) entry of results.json `per_task`: the fields the report reads.

    The run facts (sub-agents, cost, tokens) are absent from a trial that never ran (an
    evaluation stopped by `--max-cost`: the scorer counts its missing answer as the official
    zero). Its scores count; the means of run facts are over the trials that have them.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    trial: int = Field(ge=1)
    f1_by_item: float
    subagents: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    f1_by_row: float | None = None
    score: float | None = None
    wall_s: float | None = Field(default=None, ge=0)
    model_calls: int | None = Field(default=None, ge=0)

    @property
    def tokens(self) -> int | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    @property
    def ran(self) -> bool:
        """Whether the trial carries its run facts (it was run, not only scored)."""
        return self.subagents is not None


class MemoryBlock(BaseModel):
    """results.json `memory`: which store the run used and how it changed."""

    model_config = ConfigDict(extra="ignore")

    store: str | None = None
    learn: bool = False
    records_before: int | None = None
    records_after: int | None = None
    hints_before: int | None = None
    hints_after: int | None = None


class _Results(BaseModel):
    model_config = ConfigDict(extra="ignore")

    per_task: dict[str, list[TrialResult]]
    task_order: list[str] | None = None
    memory: MemoryBlock | None = None
    benchmark: str | None = None
    trials: int | None = Field(default=None, ge=1)
    utility: dict[str, Any] | None = None


class _Distillation(BaseModel):
    model_config = ConfigDict(extra="ignore")

    what: str | None = None
    created: int = 0
    edited: int = 0
    removed: int = 0
    merged: int = 0


class MemoryLogEntry(BaseModel):
    """One line of memory_log.jsonl: the memory right after one committed instance."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    task_id: str
    hints: int = Field(ge=0)
    mean_w: float | None
    """None when the pool is empty (a mean of no weights)."""
    pruned: list[str] = Field(default_factory=list)
    distillation: _Distillation | None = None


# --- the loaded run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfStats:
    """Means over the tasks of one half of the task order (None: the half has no task)."""

    tasks: int
    item_f1: float | None
    subagents: float | None
    tokens: float | None


@dataclass(frozen=True)
class EvalRun:
    """One `eval run` folder, read and checked: the per-trial results in task order and the memory log."""

    folder: Path
    order: tuple[str, ...]
    """Task ids with results, in task order."""
    per_task: dict[str, tuple[TrialResult, ...]]
    memory: MemoryBlock | None
    log: tuple[MemoryLogEntry, ...]
    benchmark: str | None
    trials: int
    utility: dict[str, Any] | None
    unfinished: tuple[str, ...]
    """Ids the task order names that have no result (an evaluation still running)."""

    @property
    def label(self) -> str:
        """How the run is named on the plots: from its memory block, as the run was configured."""
        if self.memory is None or self.memory.store is None:
            return "memory off"
        return "memory on" if self.memory.learn else "memory on, no learning"

    @property
    def not_run(self) -> int:
        """Trials without run facts (scored, never run)."""
        return sum(not t.ran for trials in self.per_task.values() for t in trials)

    def task_values(self, value: Callable[[TrialResult], float | None]) -> list[float | None]:
        """Each task's mean of `value` over the trials that have it, in task order (None: no trial has it)."""
        return [mean_or_none([value(t) for t in self.per_task[iid]]) for iid in self.order]

    def headline(self, value: Callable[[TrialResult], float | None]) -> float | None:
        """Mean over tasks of each task's trial mean (Avg@N for a metric); None when no task has the value."""
        return mean_or_none(self.task_values(value))

    def pass_at_n(self) -> float | None:
        """Pass@N: the share of tasks that at least one trial solved exactly (`score` = 1)."""
        return mean_or_none([max_or_none([t.score for t in self.per_task[iid]]) for iid in self.order])


def split_halves(run: EvalRun) -> tuple[HalfStats, HalfStats]:
    """The first `n // 2` tasks of the task order, and the rest (the middle task of an odd
    order counts in the second half, the half where learning should show)."""
    cut = len(run.order) // 2
    f1 = run.task_values(lambda t: t.f1_by_item)
    subagents = run.task_values(lambda t: as_float(t.subagents))
    tokens = run.task_values(lambda t: as_float(t.tokens))

    def stats(part: slice) -> HalfStats:
        chosen = range(len(run.order))[part]
        return HalfStats(
            tasks=len(chosen),
            item_f1=mean_or_none([f1[i] for i in chosen]),
            subagents=mean_or_none([subagents[i] for i in chosen]),
            tokens=mean_or_none([tokens[i] for i in chosen]),
        )

    return stats(slice(0, cut)), stats(slice(cut, None))


def load_eval_run(eval_dir: Path) -> EvalRun:
    """Read `eval_dir/results.json` and, when present, `eval_dir/memory_log.jsonl`.

    Raises:
        UserError: the folder or results.json is missing, a file is not valid JSON, or a field the
            report needs is missing or malformed; the message names the file.
    """
    folder = Path(eval_dir)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder. Pass the --out folder of `amapreduce eval run`.")
    results_path = folder / RESULTS_FILE
    if not results_path.is_file():
        raise UserError(
            f"{results_path} does not exist: {folder} is not an `amapreduce eval run` output folder "
            "(or the evaluation has not written its results yet)."
        )
    try:
        raw = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{results_path} is not readable JSON: {exc}") from exc
    try:
        results = _Results.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"{results_path} is not an `eval run` results file: {_describe(exc)}") from exc
    if not results.per_task:
        raise UserError(f"{results_path} has no task results (per_task is empty): nothing to report.")
    for iid, trials in results.per_task.items():
        if not trials:
            raise UserError(f"{results_path}: task {iid!r} has no trial result.")
    order, unfinished = _task_order(results)
    return EvalRun(
        folder=folder,
        order=order,
        per_task={iid: tuple(results.per_task[iid]) for iid in order},
        memory=results.memory,
        log=_read_log(folder / MEMORY_LOG_FILE),
        benchmark=results.benchmark,
        trials=results.trials or max(len(t) for t in results.per_task.values()),
        utility=results.utility,
        unfinished=unfinished,
    )


def _task_order(results: _Results) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`task_order` when present (ids without results yet set aside), then any other result ids
    in their per_task order; without `task_order`, the per_task order."""
    named = list(dict.fromkeys(results.task_order or []))
    order = [iid for iid in named if iid in results.per_task]
    order += [iid for iid in results.per_task if iid not in set(named)]
    unfinished = tuple(iid for iid in named if iid not in results.per_task)
    return tuple(order), unfinished


def _read_log(path: Path) -> tuple[MemoryLogEntry, ...]:
    if not path.exists():
        return ()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not readable: {exc}") from exc
    entries: list[MemoryLogEntry] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(MemoryLogEntry.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {number} is not valid JSON: {exc}") from exc
        except ValidationError as exc:
            raise UserError(f"{path} line {number} is not a memory log entry: {_describe(exc)}") from exc
    return tuple(entries)


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


# --- means over what is present ---------------------------------------------------------------
# Shared with `report` and `report_plots` so that a table and a plot of the same value agree.


def mean(values: Sequence[float]) -> float:
    """`math.fsum` mean of a non-empty sequence: no rounding drift over many trials."""
    return math.fsum(values) / len(values)


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values present; None when there is none."""
    present = [v for v in values if v is not None]
    return mean(present) if present else None


def max_or_none(values: Sequence[float | None]) -> float | None:
    """The largest value present; None when there is none."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def as_float(value: int | None) -> float | None:
    """A count as a float for the means, keeping None (a trial that never ran has no count)."""
    return None if value is None else float(value)
