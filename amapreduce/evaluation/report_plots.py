"""The PNG plots of `amapreduce eval report`: per-task Item F1, cost vs Item F1, the learning
curve and the hint pool, drawn from checked `EvalRun`s (see `report_data`).

Why a module of its own: drawing is the only part of the report that needs matplotlib, an
optional dependency (`pip install 'amapreduce[report]'`), imported only when a report is drawn.
The plots use matplotlib's object API with the Agg canvas and never import `pyplot`: no display
is needed, and no process-wide backend or figure registry is changed for the program that
called us.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from amapreduce._atomic import atomic_open
from amapreduce.errors import ConfigError
from amapreduce.evaluation.report_data import EvalRun, TrialResult, as_float, mean

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

__all__ = [
    "COST_PLOT",
    "HINT_POOL_PLOT",
    "LEARNING_PLOT",
    "PER_TASK_PLOT",
    "DrawnPlots",
    "draw_plots",
]

PER_TASK_PLOT = "per_task_f1.png"
COST_PLOT = "cost_vs_f1.png"
LEARNING_PLOT = "learning_curve.png"
HINT_POOL_PLOT = "hint_pool.png"

_COLORS = ("tab:blue", "tab:orange")
"""The main run, then the compared run: the same colour for a run on every plot."""


@dataclass(frozen=True)
class DrawnPlots:
    """The PNGs `draw_plots` wrote (`hint_pool` is None when no run committed any instance to a
    memory, so there was no pool to draw)."""

    per_task_f1: Path
    cost_vs_f1: Path
    learning_curve: Path
    hint_pool: Path | None


def draw_plots(
    runs: Sequence[EvalRun], labels: Sequence[str], target: Path, *, use_cost: bool, window: int
) -> DrawnPlots:
    """Draw every plot of the report for `runs` (the main run, then the compared one) into `target`.

    Raises:
        ConfigError: matplotlib is not installed (checked before anything is drawn or written).
    """
    figures = _Figures()
    per_task = figures.save(_per_task_figure(figures, runs, labels), target / PER_TASK_PLOT)
    cost = figures.save(_cost_figure(figures, runs, labels, use_cost), target / COST_PLOT)
    learning = figures.save(_learning_figure(figures, runs, labels, use_cost, window), target / LEARNING_PLOT)
    hint_pool = None
    if any(run.log for run in runs):
        hint_pool = figures.save(_hint_pool_figure(figures, runs, labels), target / HINT_POOL_PLOT)
    return DrawnPlots(per_task_f1=per_task, cost_vs_f1=cost, learning_curve=learning, hint_pool=hint_pool)


def _task_points(run: EvalRun, value: Callable[[TrialResult], float | None]) -> tuple[list[int], list[float]]:
    """(1-based positions in the task order, task means) of the tasks that have the value."""
    xs: list[int] = []
    ys: list[float] = []
    for position, task_mean in enumerate(run.task_values(value), start=1):
        if task_mean is not None:
            xs.append(position)
            ys.append(task_mean)
    return xs, ys


def _rolling(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean: point i averages tasks max(0, i - window + 1) .. i."""
    return [mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _require_matplotlib() -> None:
    """Fail early, with the install command, when the optional plotting dependency is missing."""
    try:
        import matplotlib  # noqa: F401  (the availability check: a missing package fails here)
    except ImportError as exc:
        raise ConfigError(
            "`eval report` draws its plots with matplotlib, which is not installed. "
            "Install it with: pip install 'amapreduce[report]'"
        ) from exc


class _Figures:
    """Make figures on the Agg canvas (no pyplot, no display) and save them atomically."""

    def __init__(self) -> None:
        _require_matplotlib()
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        self._figure_cls = Figure
        self._canvas = FigureCanvasAgg
        self._locator = MaxNLocator

    def new(self, width: float, height: float) -> Figure:
        figure = self._figure_cls(figsize=(width, height), layout="constrained")
        self._canvas(figure)
        return figure

    def integer_ticks(self) -> MaxNLocator:
        """A tick locator for counts and positions: no 2.5th task."""
        return self._locator(integer=True)

    @staticmethod
    def save(figure: Figure, path: Path) -> Path:
        """PNG into a temporary file beside `path`, then `os.replace`: never half an image."""
        with atomic_open(path, "wb") as handle:
            figure.savefig(handle, format="png", dpi=100)
        return path


def _width(tasks: int) -> float:
    return min(40.0, max(7.0, 0.28 * tasks))


def _per_task_figure(figures: _Figures, runs: Sequence[EvalRun], labels: Sequence[str]) -> Figure:
    ids = list(dict.fromkeys(iid for run in runs for iid in run.order))
    position = {iid: i for i, iid in enumerate(ids)}
    figure = figures.new(_width(len(ids)), 4.5)
    ax = figure.add_subplot()
    offset = 0.12 if len(runs) == 2 else 0.0
    for index, (run, label) in enumerate(zip(runs, labels, strict=True)):
        color = _COLORS[index]
        shift = offset * (index * 2 - 1) if offset else 0.0
        xs = [position[iid] + shift for iid in run.order]
        means = [mean([t.f1_by_item for t in run.per_task[iid]]) for iid in run.order]
        ax.plot(xs, means, color=color, marker="o", linewidth=1.2, label=f"{label}: mean over trials")
        trial_x = [position[iid] + shift for iid in run.order for _ in run.per_task[iid]]
        trial_y = [t.f1_by_item for iid in run.order for t in run.per_task[iid]]
        ax.scatter(trial_x, trial_y, color=color, marker="x", s=22, alpha=0.6, label=f"{label}: each trial")
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels(ids, rotation=90, fontsize=7 if len(ids) > 20 else 9)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("task (task order)")
    ax.set_ylabel("Item F1")
    ax.set_title("Per-task Item F1")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return figure


def _spend(trial: TrialResult, use_cost: bool) -> float | None:
    return trial.cost_usd if use_cost else as_float(trial.tokens)


def _spend_label(use_cost: bool) -> str:
    return "cost (USD)" if use_cost else "tokens (prompt + completion; every cost is 0)"


def _cost_figure(figures: _Figures, runs: Sequence[EvalRun], labels: Sequence[str], use_cost: bool) -> Figure:
    figure = figures.new(7.0, 5.0)
    ax = figure.add_subplot()
    for index, (run, label) in enumerate(zip(runs, labels, strict=True)):
        points = [(_spend(t, use_cost), t.f1_by_item) for iid in run.order for t in run.per_task[iid]]
        ran = [(x, y) for x, y in points if x is not None]
        ax.scatter(
            [x for x, _ in ran],
            [y for _, y in ran],
            color=_COLORS[index],
            alpha=0.7,
            s=24,
            label=label,
        )
    ax.set_xlabel(f"{_spend_label(use_cost)} per run of a task")
    ax.set_ylabel("Item F1")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Cost vs Item F1, one point per (task, trial) that ran")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure


def _learning_figure(
    figures: _Figures, runs: Sequence[EvalRun], labels: Sequence[str], use_cost: bool, window: int
) -> Figure:
    figure = figures.new(_width(max(len(r.order) for r in runs)) * 0.8 + 2.0, 8.5)
    axes: list[Axes] = list(figure.subplots(3, 1, sharex=True))
    panels: list[tuple[str, Callable[[TrialResult], float | None]]] = [
        ("Item F1", lambda t: t.f1_by_item),
        (
            "cost per task\n(USD)"
            if use_cost
            else "tokens per task\n(prompt + completion;\nevery cost is 0)",
            lambda t: _spend(t, use_cost),
        ),
        ("sub-agents per task", lambda t: as_float(t.subagents)),
    ]
    for ax, (name, value) in zip(axes, panels, strict=True):
        for index, (run, label) in enumerate(zip(runs, labels, strict=True)):
            xs, per_task = _task_points(run, value)
            color = _COLORS[index]
            ax.scatter(xs, per_task, color=color, alpha=0.25, s=14)
            ax.plot(xs, _rolling(per_task, window), color=color, linewidth=2.0, label=label)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].set_title(f"Learning curve: trailing mean over {window} tasks (dots: each task)")
    axes[0].legend(fontsize=8, loc="lower right")
    axes[-1].set_xlabel("position in the task order")
    axes[-1].xaxis.set_major_locator(figures.integer_ticks())
    return figure


def _hint_pool_figure(figures: _Figures, runs: Sequence[EvalRun], labels: Sequence[str]) -> Figure:
    figure = figures.new(8.0, 6.0)
    count_ax, weight_ax = figure.subplots(2, 1, sharex=True)
    for index, (run, label) in enumerate(zip(runs, labels, strict=True)):
        if not run.log:
            continue
        xs = list(range(1, len(run.log) + 1))
        color = _COLORS[index]
        count_ax.step(xs, [e.hints for e in run.log], where="post", color=color, marker=".", label=label)
        weights = [math.nan if e.mean_w is None else e.mean_w for e in run.log]
        weight_ax.plot(xs, weights, color=color, marker=".", label=label)
    count_ax.set_ylabel("hints in the memory")
    count_ax.set_title("Hint pool after each committed instance")
    count_ax.grid(alpha=0.3)
    count_ax.legend(fontsize=8, loc="upper left")
    weight_ax.set_ylabel("mean hint weight w")
    weight_ax.set_xlabel("committed instances (commit order)")
    weight_ax.xaxis.set_major_locator(figures.integer_ticks())
    count_ax.yaxis.set_major_locator(figures.integer_ticks())
    weight_ax.grid(alpha=0.3)
    return figure
