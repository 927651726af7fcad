"""The Evaluation page: an `eval run` folder's summary, per-task table, report plots, and memory
on vs off.

The numbers come from the same reader as `eval report` (`evaluation.report_data.load_eval_run`:
headline means over tasks, Pass@N, the two halves of the task order) and the plots are the
report's own, drawn by `evaluation.report.write_report` into a cache folder of the server (never
into the evaluation folder, which the UI only reads). A folder with the other memory setting on
the same benchmark (typically the same evaluation run with `--no-memory`) is compared beside it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from amapreduce.errors import ConfigError, UserError
from amapreduce.evaluation.report import EvalRun, load_eval_run, split_halves, write_report
from amapreduce.evaluation.report_data import MEMORY_LOG_FILE, RESULTS_FILE, as_float
from amapreduce.evaluation.report_plots import COST_PLOT, HINT_POOL_PLOT, LEARNING_PLOT, PER_TASK_PLOT
from amapreduce.llm.meter import format_recorded_cost
from amapreduce.ui.runs import as_dict, as_list

__all__ = ["NO_COMPARE", "PLOTS", "eval_list", "eval_view", "plot_file"]

PLOTS = {"per_task_f1": PER_TASK_PLOT, "cost_vs_f1": COST_PLOT, "learning_curve": LEARNING_PLOT,
         "hint_pool": HINT_POOL_PLOT}
"""The report's plots by the name the page's URLs use."""

NO_COMPARE = -1
"""`?compare=none`: show the evaluation alone."""

_DRAWING = threading.Lock()
"""matplotlib's pyplot state is process-wide: one drawing at a time."""


def _raw(folder: Path) -> dict[str, Any]:
    return as_dict(json.loads((folder / RESULTS_FILE).read_text(encoding="utf-8")))


def eval_list(folders: tuple[Path, ...]) -> list[dict[str, Any]]:
    """One line per served evaluation folder: its benchmark, tasks, memory label and Item F1, or
    why it cannot be read (an evaluation still running has no results.json yet)."""
    rows: list[dict[str, Any]] = []
    for index, folder in enumerate(folders):
        try:
            run = load_eval_run(folder)
        except UserError as exc:
            rows.append({"index": index, "folder": str(folder), "error": str(exc)})
            continue
        rows.append({"index": index, "folder": str(folder), "benchmark": run.benchmark, "tasks": len(run.order),
                     "trials": run.trials, "label": run.label, "item_f1": run.headline(lambda t: t.f1_by_item),
                     "unfinished": len(run.unfinished)})
    return rows


def _partner(index: int, run: EvalRun, folders: tuple[Path, ...], compare: int | None) -> int | None:
    """The folder to compare with: the one asked for, else the first with the other memory
    setting on the same benchmark; `NO_COMPARE` for none."""
    if compare == NO_COMPARE:
        return None
    if compare is not None:
        if not 0 <= compare < len(folders) or compare == index:
            raise UserError(f"cannot compare with evaluation {compare}: choose another served folder.")
        return compare
    for other, folder in enumerate(folders):
        if other == index:
            continue
        try:
            candidate = load_eval_run(folder)
        except UserError:
            continue
        if candidate.benchmark == run.benchmark and candidate.label != run.label:
            return other
    return None


def _headline(run: EvalRun) -> dict[str, Any]:
    first, second = split_halves(run)
    return {
        "label": run.label, "folder": str(run.folder), "tasks": len(run.order), "trials": run.trials,
        "item_f1": run.headline(lambda t: t.f1_by_item), "row_f1": run.headline(lambda t: t.f1_by_row),
        "success": run.headline(lambda t: t.score), "pass_at_n": run.pass_at_n(),
        "subagents": run.headline(lambda t: as_float(t.subagents)),
        "tokens": run.headline(lambda t: as_float(t.tokens)),
        "cost": run.headline(lambda t: t.cost_usd), "wall_s": run.headline(lambda t: t.wall_s),
        "halves": [{"part": name, "tasks": h.tasks, "item_f1": h.item_f1, "subagents": h.subagents, "tokens": h.tokens}
                   for name, h in (("first half", first), ("second half", second))],
        "memory": run.memory.model_dump() if run.memory is not None else None,
    }


def eval_view(folders: tuple[Path, ...], index: int, *, compare: int | None, plot_dir: Path) -> dict[str, Any]:
    """Everything the Evaluation page shows for served folder `index`.

    Raises:
        UserError: the folder is not an `eval run` output, or `compare` names no other folder.
    """
    folder = folders[index]
    run = load_eval_run(folder)
    raw = _raw(folder)
    partner = _partner(index, run, folders, compare)
    runs = [run] if partner is None else [run, load_eval_run(folders[partner])]
    per_task = []
    raw_tasks = as_dict(raw.get("per_task"))
    for task_id in run.order:
        for trial in as_list(raw_tasks.get(task_id)):
            if isinstance(trial, dict):
                per_task.append({**trial, "task_id": task_id,
                                 "cost": format_recorded_cost(trial.get("cost_usd"), None),
                                 "run_dir": trial.get("run_dir") if isinstance(trial.get("run_dir"), str) else None})
    plots, plots_error = _plots(runs, plot_dir)
    summary = as_dict(raw.get("summary"))
    return {
        "index": index, "folder": str(folder), "benchmark": run.benchmark, "model": raw.get("model"),
        "metrics": {k: v for k, v in summary.items() if isinstance(v, dict)},
        "facts": {k: v for k, v in summary.items() if not isinstance(v, dict)},
        "utility": run.utility, "per_task": per_task, "unfinished": list(run.unfinished),
        "compared": [_headline(r) for r in runs], "partner": partner,
        "log": [entry.model_dump() for entry in run.log], "plots": plots, "plots_error": plots_error,
        "others": [i for i in range(len(folders)) if i != index],
    }


def _plot_folder(runs: list[EvalRun], plot_dir: Path) -> Path:
    """The cache folder of these runs' plots: named by the folders and their files' change times,
    so a finished or resumed evaluation is drawn again."""
    stamp = []
    for run in runs:
        for name in (RESULTS_FILE, MEMORY_LOG_FILE):
            file = run.folder / name
            stamp.append([str(file.resolve()), file.stat().st_mtime_ns if file.is_file() else 0])
    return plot_dir / hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:20]


def _plots(runs: list[EvalRun], plot_dir: Path) -> tuple[list[str], str | None]:
    """The plots drawn for `runs` (drawing them once), or why there are none."""
    target = _plot_folder(runs, plot_dir)
    with _DRAWING:
        if not (target / "report.md").is_file():
            try:
                write_report(runs[0].folder, compare=runs[1].folder if len(runs) > 1 else None, out_dir=target)
            except (ConfigError, UserError, OSError) as exc:
                return [], str(exc)
    return [name for name, file in PLOTS.items() if (target / file).is_file()], None


def plot_file(folders: tuple[Path, ...], index: int, name: str, *, compare: int | None, plot_dir: Path) -> Path:
    """The PNG of plot `name` for served folder `index` (as its page drew it).

    Raises:
        UserError: an unknown plot, or one this evaluation has none of.
    """
    if name not in PLOTS:
        raise UserError(f"no plot {name!r}: the plots are {', '.join(PLOTS)}.")
    run = load_eval_run(folders[index])
    partner = _partner(index, run, folders, compare)
    runs = [run] if partner is None else [run, load_eval_run(folders[partner])]
    drawn, error = _plots(runs, plot_dir)
    if name not in drawn:
        raise UserError(error or f"this evaluation has no {name} plot (no run committed to a memory).")
    return _plot_folder(runs, plot_dir) / PLOTS[name]
