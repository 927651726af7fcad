"""The evaluation folder's contract: configuration, journal entries, `results.json`, benchmarks' defaults.

`amapreduce eval run` keeps `DIR/journal.jsonl` in the one journal format (`amapreduce.journal`,
kind `eval`): first the configuration (`EvalStarted`), then one `TrialDone` per finished (task,
trial) with everything the memory commit needs after a crash, one `InstanceCommitted` per
instance the memory protocol handled, and `EvalEnded`. A resume reads these back, validated.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from amapreduce.errors import UserError
from amapreduce.journal import JournalEntry, read_journal
from amapreduce.progress import ProgressEvent
from amapreduce.session.record import PriorRecord

if TYPE_CHECKING:
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.evaluation.runner import EvalOptions

__all__ = [
    "progress_event",
    "learning_halves",
    "BENCHMARKS",
    "ENTRIES",
    "JOURNAL",
    "MEMORY_LOG",
    "RESULTS",
    "BenchmarkDefaults",
    "EvalConfig",
    "EvalEnded",
    "EvalStarted",
    "InstanceCommitted",
    "TrialDone",
    "benchmark_defaults",
    "read_eval_config",
    "results_document",
]

JOURNAL = "journal.jsonl"
RESULTS = "results.json"
MEMORY_LOG = "memory_log.jsonl"
BENCHMARKS = ("widesearch", "deepwidesearch", "sandbox")
Benchmark = Literal["widesearch", "deepwidesearch", "sandbox"]


@dataclass(frozen=True, kw_only=True)
class BenchmarkDefaults:
    """What a benchmark evaluates with unless told otherwise."""

    cost_weight: float
    """λ_c per million tokens."""
    delay_weight: float
    memory: Mapping[str, Any]
    """`MemoryConfig` fields that differ from the paper's defaults."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """`Settings` fields the benchmark's simulated trials run with (none for a real model)."""


BENCHMARK_DEFAULTS: dict[str, BenchmarkDefaults] = {
    # The paper: quality-only utility, the reference's pass rules and distillation schedule.
    "widesearch": BenchmarkDefaults(cost_weight=0.0, delay_weight=0.0, memory={"label_rule": "widesearch"}),
    "deepwidesearch": BenchmarkDefaults(cost_weight=0.0, delay_weight=0.0, memory={"label_rule": "deepwidesearch"}),
    # The sandbox: a cheaper complete decision must earn more (cost weight), only an exact table is
    # a success (its simulated sub-agents lose rows in oversized batches), and with ~60 tasks the
    # memory distils every few commits instead of after 40 records. Its 11 question families
    # outnumber the paper's k_H = 3 hints, so retrieval must choose. Its trials give a batch one
    # retry and no patch round: an oversized batch ends with rows missing (a failed record, −1
    # credit), while one row per sub-agent, or a batch within the capacity, still completes.
    "sandbox": BenchmarkDefaults(cost_weight=1.0, delay_weight=0.0,
                                 memory={"label_rule": "success", "k_pos": 8, "k_hints": 3, "finch_level": 0, "success_chunk": 10,
                                         "distill_start": 3, "distill_every": 3,
                                         "merge_every": 6},
                                 settings={"max_attempts": 2, "patch_rounds": 0}),
}


def benchmark_defaults(benchmark: str) -> BenchmarkDefaults:
    """The defaults of `benchmark` (one of `BENCHMARKS`)."""
    if benchmark not in BENCHMARK_DEFAULTS:
        raise UserError(f"unknown benchmark {benchmark!r}; use one of {', '.join(BENCHMARKS)}.")
    return BENCHMARK_DEFAULTS[benchmark]


class EvalConfig(BaseModel):
    """Everything that decides an evaluation's results: journaled first, checked on resume."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    benchmark: Benchmark
    tasks_file: str
    gold_dir: str
    task_ids: list[str]
    trials: int = Field(ge=1, le=32)
    model: str | None = None
    """The model id, or None for the simulated model (sandbox only)."""
    api_base: str | None = None
    search: str
    memory_store: str | None
    """The memory folder, or None for `--no-memory`."""
    learn: bool
    encoder: str | None = None
    memory_config: dict[str, Any] = Field(default_factory=dict)
    judge: str = "exact"
    align: str = "identity"
    reference_date: str | None = None
    cost_weight: float = Field(ge=0)
    delay_weight: float = Field(ge=0)
    max_cost_usd: float | None = Field(default=None, gt=0)

    def differences(self, other: EvalConfig) -> list[str]:
        """The fields (other than the id) in which `other` asks for a different evaluation."""
        mine, theirs = self.model_dump(exclude={"eval_id"}), other.model_dump(exclude={"eval_id"})
        return [k for k in mine if mine[k] != theirs[k]]


class EvalStarted(JournalEntry):
    """The journal's first entry: the configuration."""

    type: Literal["eval_started"] = "eval_started"
    config: EvalConfig
    memory_before: dict[str, int] = Field(default_factory=dict)
    """Records and hints in the memory when the evaluation started (a resume keeps these)."""


class TrialDone(JournalEntry):
    """One finished (task, trial): its score, usage and what the commit needs."""

    type: Literal["trial_done"] = "trial_done"
    task_id: str
    trial: int
    status: str
    failure: str | None = None
    metrics: dict[str, Any]
    utility: float
    cost_usd: float
    prompt_tokens: int
    completion_tokens: int
    model_calls: int
    subagents: int
    wall_s: float
    run_dir: str | None = None
    prior: PriorRecord | None = None
    decision: dict[str, Any] | None = None
    trace: dict[str, Any] = Field(default_factory=dict)


class InstanceCommitted(JournalEntry):
    """One instance handled by the memory protocol (committed, skipped, or nothing to commit)."""

    type: Literal["instance_committed"] = "instance_committed"
    task_id: str
    log: dict[str, Any]


class EvalEnded(JournalEntry):
    """The evaluation finished (results.json written), or stopped: on its budget, or because the
    provider refused a trial for good (`status` "stopped" and the reason in both cases)."""

    type: Literal["eval_ended"] = "eval_ended"
    status: Literal["complete", "stopped"]
    reason: str | None = None


ENTRIES: tuple[type[JournalEntry], ...] = (EvalStarted, TrialDone, InstanceCommitted, EvalEnded)


def read_eval_config(out: Path) -> EvalConfig | None:
    """The configuration journaled in `out`, or None when `out` holds no evaluation."""
    path = out / JOURNAL
    if not path.exists():
        return None
    _, entries = read_journal(path, ENTRIES, kind="eval")
    for entry in entries:
        if isinstance(entry, EvalStarted):
            return entry.config
    return None


def results_document(config: EvalConfig, out: Path, tasks: Mapping[str, TaskSpec], options: EvalOptions,
                     trials_done: Mapping[tuple[str, int], TrialDone], *, before: dict[str, int],
                     after: dict[str, int]) -> dict[str, Any]:
    """`results.json`: `eval score` over the trial folders, plus each trial's run facts and the memory block."""
    from amapreduce.evaluation.loaders import load_predictions_dir
    from amapreduce.evaluation.runner import Trial, run_evaluation

    ids = [i for i in config.task_ids if any((i, k) in trials_done for k in range(1, config.trials + 1))]
    trials = [Trial(str(out / f"trial{k}"), load_predictions_dir(out / f"trial{k}", ids))
              for k in range(1, config.trials + 1)]
    report = run_evaluation(dict(tasks), ids, trials, Path(config.gold_dir), options)
    per_task: dict[str, list[dict[str, Any]]] = {}
    facts = ("cost_usd", "prompt_tokens", "completion_tokens", "model_calls", "subagents", "wall_s", "status",
             "utility", "run_dir")
    for iid in ids:
        rows = []
        for k, metrics in enumerate(report.per_task[iid], start=1):
            done = trials_done.get((iid, k))
            rows.append({"trial": k, **metrics, **({f: getattr(done, f) for f in facts} if done else {})})
        per_task[iid] = rows
    entries = [r for rows in per_task.values() for r in rows if "subagents" in r]
    count = max(1, len(entries))
    summary: dict[str, Any] = dict(report.summary)
    summary.update({
        "cost_usd": round(sum(r["cost_usd"] for r in entries) / count, 6),
        "cost_usd_total": round(sum(r["cost_usd"] for r in entries), 6),
        "subagents_per_task": round(sum(r["subagents"] for r in entries) / count, 3),
        "model_calls_per_task": round(sum(r["model_calls"] for r in entries) / count, 3),
        "prompt_tokens_per_task": round(sum(r["prompt_tokens"] for r in entries) / count, 1),
        "wall_s_per_task": round(sum(r["wall_s"] for r in entries) / count, 3),
    })
    memory: dict[str, Any] = {"store": config.memory_store, "learn": config.learn and config.memory_store is not None,
                              "records_before": before["records"], "records_after": after["records"],
                              "hints_before": before["hints"], "hints_after": after["hints"],
                              "encoder": config.encoder, "config": config.memory_config}
    from amapreduce.memory.labels import UtilityWeights

    return {
        "benchmark": config.benchmark,
        "trials": config.trials,
        "model": config.model or "simulated",
        "task_order": ids,
        "per_task": per_task,
        "summary": summary,
        "learning": learning_halves(per_task, ids),
        "memory": memory,
        "utility": UtilityWeights(cost=config.cost_weight, delay=config.delay_weight).to_json(),
    }


def _half(per_task: Mapping[str, list[dict[str, Any]]], part: list[str]) -> dict[str, Any]:
    """Sub-agents and Item F1 per task (the mean over its trials) over the tasks `part`."""
    trials = [scored for i in part if (scored := [t for t in per_task.get(i, []) if "subagents" in t])]

    def mean(key: str) -> float | None:
        if not trials:
            return None
        return round(statistics.fmean(statistics.fmean(float(t.get(key) or 0.0) for t in task) for task in trials), 3)

    return {"tasks": len(part), "subagents_per_task": mean("subagents"), "item_f1": mean("f1_by_item")}


def learning_halves(per_task: Mapping[str, list[dict[str, Any]]], ids: list[str]) -> dict[str, Any] | None:
    """The learning figure: sub-agents and Item F1 per task over the first and the second half of the
    task order `ids`, and the second half's sub-agents as a share of the first's (`bench_evolution.py`
    reports the same halves); None with fewer than two tasks."""
    if len(ids) < 2:
        return None
    first, second = _half(per_task, ids[: len(ids) // 2]), _half(per_task, ids[len(ids) // 2:])
    low, high = first["subagents_per_task"], second["subagents_per_task"]
    return {"first_half": first, "second_half": second,
            "second_vs_first_subagents": round(high / low, 3) if low and high is not None else None}


def progress_event(config: EvalConfig, trials: list[TrialDone], committed: int, running: int) -> ProgressEvent:
    """The evaluation's progress: instances committed of all, trials finished and running, cost, mean Item F1."""
    f1 = [float(t.metrics.get("f1_by_item") or 0.0) for t in trials]
    return ProgressEvent(kind="committed", phase="evaluation", done=committed, total=len(config.task_ids), unit="tasks",
                         data={"trials finished": f"{len(trials)}/{len(config.task_ids) * config.trials}",
                               "running": running, "cost": f"${sum(t.cost_usd for t in trials):.4f}",
                               "mean Item F1": f"{sum(f1) / len(f1):.3f}" if f1 else "-"})
