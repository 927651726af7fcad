"""Run one sandbox task end to end with the simulated model, and score it against the gold.

`run_demo` is what `amapreduce demo` runs: the real `run_ask` (manager agent, mapreduce tool,
engine, sub-agents, reducer, run directory) with the provider clients replaced by the
simulated model and the web replaced by the bundled sandbox corpus. Nothing touches the
network, no API key is needed, and the result is scored like `amapreduce eval score` does
(WideSearch metrics, exact judge, identity alignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amapreduce.errors import UserError
from amapreduce.settings import Settings

if TYPE_CHECKING:
    from amapreduce.demo.faults import FaultPlan
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.run.ask import AskOutcome

__all__ = ["DEFAULT_TASK", "DemoOutcome", "demo_settings", "load_sandbox_tasks", "run_demo", "score_answer"]

DEFAULT_TASK = "sbx_en_001"
"""The task `amapreduce demo` runs when none is given (13 countries: quick and readable)."""


@dataclass(kw_only=True)
class DemoOutcome:
    """A finished demo run and its score."""

    task_id: str
    ask: AskOutcome
    score: dict[str, float]
    """The WideSearch metrics of the table against the sandbox gold (exact judge)."""
    faults: dict[str, int]
    """Faults injected, by kind."""

    def to_json(self) -> dict[str, Any]:
        """The `amapreduce demo --json` document."""
        completeness = self.ask.record["completeness"]
        return {
            "task_id": self.task_id,
            "status": self.ask.status,
            "rows": completeness["rows"],
            "missing_cells": completeness["missing_cells"],
            "completeness": completeness,
            "score": self.score,
            "run_dir": str(self.ask.run_dir.path),
            "table_markdown": self.ask.markdown,
        }


def load_sandbox_tasks(settings: Settings) -> tuple[dict[str, TaskSpec], Any]:
    """The sandbox tasks by id, and the sandbox world (its index built under the cache dir)."""
    from amapreduce.evaluation.loaders import load_tasks
    from amapreduce.sandbox import sandbox_world

    world = sandbox_world(settings.cache_dir)
    return load_tasks(world.tasks_file, "widesearch"), world


def demo_settings(base: Settings, index_dir: Any) -> Settings:
    """`base` with the simulated model, the sandbox corpus as search backend and no extraction model."""
    from amapreduce.demo.model import SIMULATED_MODEL_ID

    return base.model_copy(
        update={
            "model": SIMULATED_MODEL_ID,
            "subagent_model": None,
            "extraction_model": "none",
            "search_backend": f"corpus:{index_dir}",
        }
    )


def score_answer(task: TaskSpec, gold_dir: Any, markdown: str) -> dict[str, float]:
    """WideSearch metrics of `markdown` against the task's gold (exact judge, identity alignment)."""
    from amapreduce.evaluation.judges import ExactJudge, IdentityAligner
    from amapreduce.evaluation.loaders import load_gold
    from amapreduce.evaluation.preprocess import DateContext
    from amapreduce.evaluation.score import METRIC_FIELDS, ScoreConfig, score_table

    cfg = ScoreConfig(benchmark="widesearch", judge=ExactJudge(), aligner=IdentityAligner(), dates=DateContext())
    result = score_table(task, load_gold(gold_dir, task), markdown, cfg)
    return {name: float(getattr(result, name)) for name in METRIC_FIELDS}


def run_demo(
    task_id: str | None,
    settings: Settings,
    *,
    faults: FaultPlan | None = None,
    latency_s: float = 0.0,
    show_progress: bool | None = False,
) -> DemoOutcome:
    """Answer one sandbox task with the simulated model through the whole pipeline; score it.

    Args:
        task_id: a sandbox instance id (default `DEFAULT_TASK`).
        settings: run settings (workers, runs dir, budgets ...); the model, the search backend
            and the extraction model are replaced by the demo's.
        faults: seeded fault injection for the simulated model.
        latency_s: fixed sleep per model call.
        show_progress: force the live progress display on/off.

    Raises:
        UserError: `task_id` is not a sandbox task; the message lists the ids.
    """
    from amapreduce.demo.model import SimulatedAtlasModel
    from amapreduce.llm.factory import new_meter
    from amapreduce.run.ask import run_ask
    from amapreduce.testing.scripted import SIMULATED_PRICES

    tasks, world = load_sandbox_tasks(settings)
    chosen = task_id or DEFAULT_TASK
    if chosen not in tasks:
        raise UserError(f"unknown sandbox task {chosen!r}. Sandbox tasks are: {', '.join(sorted(tasks))}.")
    task = tasks[chosen]
    model = SimulatedAtlasModel(faults=faults, latency_s=latency_s)
    run_settings = demo_settings(settings, world.index_dir)
    outcome = run_ask(
        task.query,
        run_settings,
        inner=lambda role: model,
        meter=new_meter(run_settings, prices_by_prefix=SIMULATED_PRICES),
        task_id=chosen,
        show_progress=show_progress,
    )
    score = score_answer(task, world.gold_dir, outcome.markdown)
    return DemoOutcome(task_id=chosen, ask=outcome, score=score, faults=dict(model.faults.injected))
