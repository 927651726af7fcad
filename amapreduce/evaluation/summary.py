"""Aggregate trials like the official `calc_summary_results`, and render the result tables.

Per task and metric: mean, max and min over the trials; then the plain mean over tasks (a macro
average). Avg@N = `avg_n`, Pass@N = `max_n` of `score`, Max@N = `max_n` of an F1
(docs/scorer-rules.md §6). Unlike the official script, a missing trial result is not an
error here: the runner scores a missing answer as the official zero, so every task always has
one result per trial.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_per_task", "render_summary", "summarize"]


def summarize(
    per_task: Mapping[str, Sequence[Mapping[str, Any]]], metrics: Sequence[str]
) -> dict[str, dict[str, float]]:
    """`{metric: {"avg_n", "max_n", "min_n"}}` over tasks (each task: its trials' mean/max/min).

    Raises:
        ValueError: a task has no trial result.
    """
    summary: dict[str, dict[str, float]] = {}
    if not per_task:
        return summary
    for metric in metrics:
        avg: list[float] = []
        high: list[float] = []
        low: list[float] = []
        for iid, trials in per_task.items():
            values = [float(t[metric]) for t in trials]
            if not values:
                raise ValueError(f"task {iid} has no trial result")
            avg.append(sum(values) / len(values))
            high.append(max(values))
            low.append(min(values))
        summary[metric] = {
            "avg_n": sum(avg) / len(avg),
            "max_n": sum(high) / len(high),
            "min_n": sum(low) / len(low),
        }
    return summary


def render_summary(
    summary: Mapping[str, Mapping[str, float]],
    *,
    tasks: int,
    trials: int,
    successes: Sequence[int],
    title: str,
) -> Any:
    """A rich table: one row per metric with Avg@N / Max@N / Min@N, plus the success counts."""
    from rich.table import Table

    n = trials
    table = Table(
        title=title, caption=f"{tasks} tasks x {trials} trial(s); successes per trial: {list(successes)}"
    )
    table.add_column("metric")
    table.add_column(f"Avg@{n}", justify="right")
    table.add_column(f"Max@{n} (Pass@{n} for score)", justify="right")
    table.add_column(f"Min@{n}", justify="right")
    for metric, values in summary.items():
        table.add_row(metric, f"{values['avg_n']:.4f}", f"{values['max_n']:.4f}", f"{values['min_n']:.4f}")
    return table


def render_per_task(per_task: Mapping[str, Sequence[Mapping[str, Any]]], trial_labels: Sequence[str]) -> Any:
    """A rich table: one row per task, one `SR / row F1 / item F1` cell per trial."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="per task: SR / row F1 / item F1")
    table.add_column("instance_id")
    for label in trial_labels:  # ids and labels come from file names: literal text, never markup
        table.add_column(Text(label), justify="right")
    for iid, trials in per_task.items():
        table.add_row(
            Text(iid), *(f"{t['score']:.0f} / {t['f1_by_row']:.3f} / {t['f1_by_item']:.3f}" for t in trials)
        )
    return table
