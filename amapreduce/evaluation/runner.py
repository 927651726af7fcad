"""Score many tasks over many trials: the library entry point behind `amapreduce eval score`.

Why a separate module: the CLI only parses flags; this module owns the evaluation plan (which
tasks, which trials, which judges), loads each gold table once and reuses it for every trial
(the official code re-reads and mutates it, bug B9), and assembles the results JSON in the
shape the issue fixes: `{"per_task": {id: [trial results...]}, "summary": {...}}`.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from amapreduce.errors import UserError
from amapreduce.evaluation.deepwide import DEEPWIDE_FIELDS, Protocol, configure_protocol, score_deepwide
from amapreduce.evaluation.details import write_details_csv
from amapreduce.evaluation.judges import (
    Aligner,
    ColumnJudge,
    EntityJudge,
    ExactJudge,
    IdentityAligner,
    SubstringEntityJudge,
)
from amapreduce.evaluation.loaders import TaskSpec, load_gold
from amapreduce.evaluation.preprocess import DateCache, DateContext
from amapreduce.evaluation.score import METRIC_FIELDS, ScoreConfig, score_table
from amapreduce.evaluation.summary import summarize
from amapreduce.progress import ProgressEvent, ProgressSink

__all__ = ["EvalOptions", "EvalReport", "Trial", "run_evaluation"]


@dataclass
class Trial:
    """One trial: a label (folder or jsonl trial name) and `{instance_id: answer or None}`."""

    label: str
    answers: dict[str, str | None]


@dataclass
class EvalOptions:
    """How to score (mirrors the CLI flags)."""

    benchmark: Literal["widesearch", "deepwidesearch"] = "widesearch"
    judge: ColumnJudge = field(default_factory=ExactJudge)
    aligner: Aligner = field(default_factory=IdentityAligner)
    entity_judge: EntityJudge = field(default_factory=SubstringEntityJudge)
    protocol: Protocol = "aidc"
    reference_date: dt.date | None = None
    corrected: bool = False
    details_dir: Path | None = None
    date_cache_dir: Path | None = None
    """Keep dateparser results here between runs (None: no disk cache)."""


@dataclass
class EvalReport:
    """Results of a run: the JSON document plus counts for the console."""

    per_task: dict[str, list[dict[str, Any]]]
    summary: dict[str, dict[str, float]]
    successes: list[int]
    corrections: Counter[str]

    def to_json(self) -> dict[str, Any]:
        """The `--out` document."""
        return {"per_task": self.per_task, "summary": self.summary}


def metric_names(benchmark: str) -> list[str]:
    """Summary metrics: the WideSearch fields, plus the DeepWideSearch ones."""
    names = list(METRIC_FIELDS)
    if benchmark == "deepwidesearch":
        names.extend(DEEPWIDE_FIELDS)
    return names


def run_evaluation(
    tasks: dict[str, TaskSpec],
    task_ids: list[str],
    trials: list[Trial],
    gold_dir: Path,
    options: EvalOptions,
    *,
    progress: ProgressSink | None = None,
) -> EvalReport:
    """Score every (task, trial); a missing answer is the official zero ("response is None").

    Raises:
        UserError: an id is not in the tasks file, or a gold table is missing/unreadable.
    """
    unknown = [i for i in task_ids if i not in tasks]
    if unknown:
        raise UserError(f"unknown instance id(s) {unknown[:5]}: not in the tasks file. Check --ids.")
    cfg = ScoreConfig(
        benchmark=options.benchmark,
        judge=options.judge,
        aligner=options.aligner,
        dates=DateContext(
            reference=options.reference_date,
            corrected=options.corrected,
            store=DateCache(options.date_cache_dir) if options.date_cache_dir is not None else None,
        ),
        corrected=options.corrected,
        details=options.details_dir is not None,
    )
    if options.benchmark == "deepwidesearch":
        configure_protocol(cfg, options.protocol)
    per_task: dict[str, list[dict[str, Any]]] = {}
    successes = [0] * len(trials)
    corrections: Counter[str] = Counter()
    for done, iid in enumerate(task_ids, start=1):
        task = tasks[iid]
        gold = load_gold(gold_dir, task, corrected=options.corrected)
        entries: list[dict[str, Any]] = []
        for t_index, trial in enumerate(trials):
            answer = trial.answers.get(iid)
            if options.benchmark == "deepwidesearch":
                dws = score_deepwide(
                    task, gold, answer, cfg, protocol=options.protocol, entity_judge=options.entity_judge
                )
                table, entry = dws.table, dws.metrics()
            else:
                table = score_table(task, gold, answer, cfg)
                entry = table.metrics()
            if table.corrections:
                corrections.update(table.corrections)
                changed = ", ".join(f"{k}={v}" for k, v in sorted(table.corrections.items()) if v)
                if changed:
                    entry["msg"] += f"\ncorrections: {changed}"
            if entry["score"] == 1.0:
                successes[t_index] += 1
            if options.details_dir is not None and table.details is not None:
                name = f"{iid}_trial_{t_index}_{_safe(trial.label)}_eval_result.csv"
                write_details_csv(
                    options.details_dir / name, table.details, list(task.evaluation.unique_columns)
                )
            entries.append(entry)
        per_task[iid] = entries
        if progress is not None:
            progress(ProgressEvent(kind="scored", phase="scoring", done=done, total=len(task_ids), unit="tasks"))
    if cfg.dates.store is not None:
        cfg.dates.store.save()
    summary = summarize(per_task, metric_names(options.benchmark))
    return EvalReport(per_task, summary, successes, corrections)


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60] or "trial"


