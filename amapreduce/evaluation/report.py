"""`amapreduce eval report`: turn an `eval run` folder into `report.md` and PNG plots.

Why a module of its own: `eval run` writes numbers (`results.json`, `memory_log.jsonl`); whether
the memory learned is a question about their *shape over the task order* (does the second half
of the tasks use fewer sub-agents at the same Item F1? does the hint pool grow, and do its hints
earn weight?), which tables of means hide. The report only reads those two files and draws; it
never runs a model or touches a memory store, so a report can be rebuilt at any time, also from
a folder copied off another machine.

The work is split in three: `report_data` reads and checks the folder (and says what "per task"
means), `report_plots` draws the PNGs with matplotlib (an optional dependency), and this module
renders `report.md` and is the entry point. The input models and `load_eval_run` are re-exported
here, so callers import the whole report API from `amapreduce.evaluation.report`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amapreduce._atomic import atomic_open
from amapreduce.errors import UserError
from amapreduce.evaluation.report_data import (
    MEMORY_LOG_FILE,
    EvalRun,
    HalfStats,
    MemoryBlock,
    MemoryLogEntry,
    TrialResult,
    as_float,
    load_eval_run,
    split_halves,
)
from amapreduce.evaluation.report_plots import draw_plots

__all__ = [
    "ROLLING_WINDOW",
    "EvalReportFiles",
    "EvalRun",
    "HalfStats",
    "MemoryBlock",
    "MemoryLogEntry",
    "TrialResult",
    "load_eval_run",
    "split_halves",
    "write_report",
]

ROLLING_WINDOW = 5
"""Tasks in the trailing mean of the learning curve: enough to smooth one lucky task, short
enough that a change halfway through a 40-task order still shows."""

REPORT_FILE = "report.md"


# --- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalReportFiles:
    """What `write_report` wrote: the markdown report and its plots (`hint_pool` is None when
    no run committed any instance to a memory, so there was no pool to draw)."""

    report: Path
    per_task_f1: Path
    cost_vs_f1: Path
    learning_curve: Path
    hint_pool: Path | None

    @property
    def plots(self) -> tuple[Path, ...]:
        """Every PNG written, in the order the report shows them."""
        drawn = (self.per_task_f1, self.cost_vs_f1, self.learning_curve, self.hint_pool)
        return tuple(p for p in drawn if p is not None)


def write_report(
    eval_dir: Path,
    *,
    compare: Path | None = None,
    out_dir: Path | None = None,
    window: int = ROLLING_WINDOW,
) -> EvalReportFiles:
    """Write `report.md` and its PNG plots for the `eval run` folder `eval_dir`.

    Args:
        eval_dir: an `amapreduce eval run --out` folder.
        compare: a second such folder (typically the same evaluation with `--no-memory`), drawn
            beside the first on every plot and set side by side in the tables.
        out_dir: where to write (default: `eval_dir`); the report links its images relatively.
        window: tasks in the trailing mean of the learning curve.

    Raises:
        UserError: a folder is not an `eval run` output (see `load_eval_run`), or `window` < 1.
        ConfigError: matplotlib is not installed.
    """
    if window < 1:
        raise UserError(f"`window` must be >= 1, got {window}. Use a positive number of tasks.")
    runs = [load_eval_run(eval_dir)]
    if compare is not None:
        runs.append(load_eval_run(compare))
    labels = _labels(runs)
    target = Path(out_dir) if out_dir is not None else Path(eval_dir)
    use_cost = any(
        (t.cost_usd or 0.0) > 0 for run in runs for trials in run.per_task.values() for t in trials
    )
    plots = draw_plots(runs, labels, target, use_cost=use_cost, window=window)
    files = EvalReportFiles(
        report=target / REPORT_FILE,
        per_task_f1=plots.per_task_f1,
        cost_vs_f1=plots.cost_vs_f1,
        learning_curve=plots.learning_curve,
        hint_pool=plots.hint_pool,
    )
    markdown = _markdown(runs, labels, files, use_cost, window)
    with atomic_open(files.report) as handle:
        handle.write(markdown)
    return files


def _labels(runs: Sequence[EvalRun]) -> list[str]:
    """Each run's memory label; the folder name is added when two runs would read the same."""
    labels = [run.label for run in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({run.folder.name})" for label, run in zip(labels, runs, strict=True)]
    return labels


# --- markdown -----------------------------------------------------------------------------------


def _markdown(
    runs: Sequence[EvalRun], labels: Sequence[str], files: EvalReportFiles, use_cost: bool, window: int
) -> str:
    main = runs[0]
    lines = [f"# Evaluation report: {main.folder.name}", ""]
    for run, label in zip(runs, labels, strict=True):
        lines.append(
            f"- **{label}**: `{run.folder}` — benchmark {run.benchmark or 'unknown'}, "
            f"{len(run.order)} tasks, {run.trials} trial(s)"
            + (
                f"; {len(run.unfinished)} task(s) of its task order have no result yet"
                if run.unfinished
                else ""
            )
            + (
                f"; {run.not_run} trial(s) were scored but never ran (no cost, tokens or sub-agents)"
                if run.not_run
                else ""
            )
            + _utility_note(run.utility)
        )
    if len(runs) == 2 and set(runs[0].order) != set(runs[1].order):
        lines.append("- The two runs cover different tasks: compare their means with care.")
    lines += [
        "",
        '"Per task" is one run of one task: each task\'s mean over its trials, then the mean over '
        "tasks (for the metrics, the Avg@N of `eval score`).",
        "",
    ]
    lines += _headline_section(runs, labels)
    lines += _memory_section(runs, labels)
    lines += _halves_section(runs, labels)
    lines += _plots_section(runs, files, use_cost, window)
    return "\n".join(lines) + "\n"


def _utility_note(utility: dict[str, Any] | None) -> str:
    """The utility weights the run committed with (paper Eq. 1, u = Q − λ_c·C − λ_t·D)."""
    if not utility:
        return ""
    return "; utility weights " + ", ".join(f"{k}={v}" for k, v in utility.items())


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, text_columns: int = 1) -> list[str]:
    """A markdown table: the first `text_columns` columns left-aligned, the numbers right-aligned."""
    rule = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return [*out, ""]


def _headline_section(runs: Sequence[EvalRun], labels: Sequence[str]) -> list[str]:
    n = str(runs[0].trials) if len({r.trials for r in runs}) == 1 else "N"
    metrics: list[tuple[str, Callable[[EvalRun], float | None], Callable[[float | None], str]]] = [
        ("tasks", lambda r: float(len(r.order)), _fmt_int),
        ("trials", lambda r: float(r.trials), _fmt_int),
        (f"Avg@{n} item F1", lambda r: r.headline(lambda t: t.f1_by_item), _fmt_f1),
        (f"Avg@{n} row F1", lambda r: r.headline(lambda t: t.f1_by_row), _fmt_f1),
        (f"Avg@{n} success rate", lambda r: r.headline(lambda t: t.score), _fmt_f1),
        (f"Pass@{n}", lambda r: r.pass_at_n(), _fmt_f1),
        ("cost per task (USD)", lambda r: r.headline(lambda t: t.cost_usd), _fmt_usd),
        (
            "tokens per task (prompt + completion)",
            lambda r: r.headline(lambda t: as_float(t.tokens)),
            _fmt_count,
        ),
        (
            "model calls per task",
            lambda r: r.headline(lambda t: as_float(t.model_calls)),
            _fmt_count,
        ),
        ("sub-agents per task", lambda r: r.headline(lambda t: as_float(t.subagents)), _fmt_count),
        ("wall per task (s)", lambda r: r.headline(lambda t: t.wall_s), _fmt_count),
    ]
    rows: list[list[str]] = []
    for name, get, fmt in metrics:
        values = [get(run) for run in runs]
        row = [name, *(fmt(v) for v in values)]
        if len(runs) == 2:
            row.append("" if name in ("tasks", "trials") else _fmt_ratio(values[0], values[1]))
        rows.append(row)
    header = ["", *labels] + ([f"{labels[0]} / {labels[1]}"] if len(runs) == 2 else [])
    return ["## Headline", "", *_table(header, rows)]


def _memory_section(runs: Sequence[EvalRun], labels: Sequence[str]) -> list[str]:
    def before_after(before: int | None, after: int | None) -> str:
        return "—" if before is None and after is None else f"{_or_dash(before)} → {_or_dash(after)}"

    def cells(run: EvalRun) -> list[str]:
        memory = run.memory
        if memory is None or memory.store is None:
            return ["none", "—", "—", "—", _fmt_int(float(len(run.log))), "—", "—"]
        distilled = [e.distillation for e in run.log if e.distillation is not None and e.distillation.what]
        counts = {
            key: sum(getattr(d, key) for d in distilled) for key in ("created", "edited", "removed", "merged")
        }
        distillations = f"{len(distilled)} (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")"
        return [
            f"`{memory.store}`",
            "yes" if memory.learn else "no (read only)",
            before_after(memory.records_before, memory.records_after),
            before_after(memory.hints_before, memory.hints_after),
            str(len(run.log)),
            distillations,
            str(sum(len(e.pruned) for e in run.log)),
        ]

    names = [
        "store",
        "learn",
        "records before → after",
        "hints before → after",
        "committed instances",
        "distillations (hints created, edited, removed, merged)",
        "hints pruned",
    ]
    columns = [cells(run) for run in runs]
    rows = [[name, *(col[i] for col in columns)] for i, name in enumerate(names)]
    return ["## Memory", "", *_table(["", *labels], rows)]


def _halves_section(runs: Sequence[EvalRun], labels: Sequence[str]) -> list[str]:
    halves = [split_halves(run) for run in runs]
    out = ["## First half vs second half of the task order", ""]
    for label, (first, second) in zip(labels, halves, strict=True):
        out.append(
            f"- {label}: first half = tasks 1–{first.tasks}, second half = tasks "
            f"{first.tasks + 1}–{first.tasks + second.tasks} of its task order."
        )
    out.append("")
    fields: list[tuple[str, Callable[[HalfStats], float | None], Callable[[float | None], str]]] = [
        ("mean item F1", lambda h: h.item_f1, _fmt_f1),
        ("sub-agents per task", lambda h: h.subagents, _fmt_count),
        ("tokens per task", lambda h: h.tokens, _fmt_count),
    ]
    rows: list[list[str]] = []
    if len(runs) == 1:
        first, second = halves[0]
        for name, get, fmt in fields:
            rows.append([name, fmt(get(first)), fmt(get(second)), _fmt_ratio(get(second), get(first))])
        return out + _table(["", "first half", "second half", "second / first"], rows)
    for index, half in enumerate(("first half", "second half")):
        for name, get, fmt in fields:
            on, off = get(halves[0][index]), get(halves[1][index])
            rows.append([half, name, fmt(on), fmt(off), _fmt_ratio(on, off)])
    return out + _table(["half", "", *labels, f"{labels[0]} / {labels[1]}"], rows, text_columns=2)


def _plots_section(runs: Sequence[EvalRun], files: EvalReportFiles, use_cost: bool, window: int) -> list[str]:
    spend = "cost (USD)" if use_cost else "tokens (prompt + completion; every cost is 0)"
    out = [
        "## Plots",
        "",
        "### Per-task Item F1",
        "",
        "Each task's mean over its trials (line), and each trial (markers), in task order.",
        "",
        f"![per-task Item F1]({files.per_task_f1.name})",
        "",
        "### Cost vs Item F1",
        "",
        f"One point per (task, trial): {spend} against Item F1.",
        "",
        f"![cost vs Item F1]({files.cost_vs_f1.name})",
        "",
        "### Learning curve",
        "",
        f"Trailing mean over {window} tasks, in task order: Item F1, {spend} and sub-agents per task.",
        "",
        f"![learning curve]({files.learning_curve.name})",
        "",
        "### Hint pool",
        "",
    ]
    if files.hint_pool is not None:
        out += [
            "Hints in the memory and their mean weight w after each committed instance, in commit order.",
            "",
            f"![hint pool]({files.hint_pool.name})",
        ]
    else:
        out.append(f"Not drawn: {_no_pool_reason(runs[0])}.")
    return out


def _no_pool_reason(run: EvalRun) -> str:
    memory = run.memory
    if memory is None or memory.store is None:
        return "the run used no memory, so no hint pool evolved"
    if not memory.learn:
        return "the run read its memory without learning (`--no-learn`), so the hint pool did not change"
    return f"no instance was committed ({MEMORY_LOG_FILE} is absent or empty)"


def _or_dash(value: int | None) -> str:
    return "—" if value is None else str(value)


def _fmt_int(value: float | None) -> str:
    return "n/a" if value is None else str(round(value))


def _fmt_f1(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _fmt_usd(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6f}"


def _fmt_count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _fmt_ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or denominator is None or denominator == 0:
        return "n/a"
    return f"{numerator / denominator:.2f}"
