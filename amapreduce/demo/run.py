"""Run one sandbox task end to end with the simulated model, and score it against the gold.

`run_demo` is what `amapreduce demo` runs: a real `ask` session (manager agent, mapreduce tool,
engine, sub-agents, reducer, run directory) with the provider clients replaced by the
simulated model and the web replaced by the bundled sandbox corpus. Nothing touches the
network, no API key is needed, and the result is scored like `amapreduce eval score` does
(WideSearch metrics, exact judge, identity alignment).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce.errors import UserError
from amapreduce.settings import Settings

if TYPE_CHECKING:
    from amapreduce.demo.discovery import Scouting
    from amapreduce.demo.faults import FaultPlan, WrongCell
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.memory import ExperientialMemory
    from amapreduce.memory.protocol import InstanceSession
    from amapreduce.session.outcome import RunOutcome

__all__ = ["DEFAULT_TASK", "ENRICH_PREFIX", "DemoOutcome", "demo_settings", "gold_dir_of", "load_sandbox_tasks",
           "run_demo", "score_answer", "score_answer_corrected"]

ENRICH_PREFIX = "sbx_enrich_"
"""The ids of the enrichment tasks: a given list enriched as `amapreduce enrich` does (`demo.enrichment`)."""
DEFAULT_TASK = "sbx_en_001"
"""The task `amapreduce demo` runs when none is given (13 countries: quick and readable)."""


@dataclass(kw_only=True)
class DemoOutcome:
    """A finished demo run and its score."""

    task_id: str
    ask: RunOutcome
    score: dict[str, float]
    """The WideSearch metrics of the table against the sandbox gold (exact judge), as the official
    scorer computes them."""
    corrected_score: dict[str, float] = field(default_factory=dict)
    """The same metrics with the scorer's bug fixes (`eval score --corrected`)."""
    corrections: dict[str, int] = field(default_factory=dict)
    """What those fixes changed in this table (the scorer's counts, only the non-zero ones)."""
    faults: dict[str, int]
    """Faults injected, by kind."""
    wrong_cells: frozenset[WrongCell] = frozenset()
    """The cells the simulated sub-agents answered wrong on purpose (`--wrong-values`)."""
    memory: dict[str, Any] | None = None
    """With a demo memory: the prior the run was given and what the memory learned from it."""

    def to_json(self) -> dict[str, Any]:
        """The `amapreduce demo --json` document."""
        record = self.ask.record
        return {
            "task_id": self.task_id,
            "status": self.ask.status,
            "rows": record.completeness.rows,
            "missing_cells": record.completeness.missing_cells,
            "completeness": record.completeness.model_dump(mode="json"),
            "score": self.score,
            "score_corrected": self.corrected_score,
            "score_corrections": self.corrections,
            "run_dir": str(self.ask.run_dir.path),
            "table_markdown": self.ask.markdown,
            "memory": self.memory,
            "evidence": self.evidence(),
            # a discovery task's `DiscoverySummary` per discovering execution (no key for the others)
            **({"discoveries": [d.model_dump(mode="json") for d in found]} if (found := record.discoveries) else {}),
        }

    def evidence(self) -> dict[str, int]:
        """How many of the table's cells the sub-agents answered are `verified`, `unverified` and
        `no_evidence` (`Table.evidence_counts`)."""
        return self.ask.table.evidence_counts()


def load_sandbox_tasks(settings: Settings) -> tuple[dict[str, TaskSpec], Any]:
    """The sandbox tasks by id (the wide-search tasks `sbx_en_*`, then the discovery tasks `sbx_disc_*`, then
    the enrichment tasks `sbx_enrich_*`), and the sandbox world (its index built under the cache dir)."""
    from amapreduce.evaluation.loaders import load_tasks
    from amapreduce.sandbox import sandbox_world

    world = sandbox_world(settings.cache_dir)
    return {**load_tasks(world.tasks_file, "widesearch"), **load_tasks(world.discovery_tasks_file, "widesearch"),
            **load_tasks(world.enrich_tasks_file, "widesearch")}, world


def gold_dir_of(world: Any, task_id: str) -> Path:
    """The folder holding `task_id`'s gold table (the discovery and enrichment tasks keep theirs apart)."""
    for folder in (world.discovery_gold_dir, world.enrich_gold_dir):
        if (Path(folder) / f"{task_id}.csv").is_file():
            return Path(folder)
    return Path(world.gold_dir)


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
    return score_answer_corrected(task, gold_dir, markdown, corrected=False)[0]


def score_answer_corrected(
    task: TaskSpec, gold_dir: Any, markdown: str, *, corrected: bool = True
) -> tuple[dict[str, float], dict[str, int]]:
    """`score_answer`, with the scorer's bug fixes when `corrected` (`eval score --corrected`); also
    what the fixes changed (the scorer's non-zero correction counts, e.g. `B1 cells rendered as
    integers`)."""
    from amapreduce.evaluation.runner import EvalOptions, Trial, run_evaluation
    from amapreduce.evaluation.score import METRIC_FIELDS

    # `eval score`'s own code (its default options: exact judge, identity alignment), so the
    # corrected score also reads the gold and the dates as `--corrected` does.
    iid = task.instance_id
    report = run_evaluation({iid: task}, [iid], [Trial("demo", {iid: markdown})], Path(gold_dir),
                            EvalOptions(corrected=corrected))
    metrics = report.per_task[iid][0]
    changed = {what: int(n) for what, n in sorted(report.corrections.items()) if n}
    return {name: float(metrics[name]) for name in METRIC_FIELDS}, changed


def run_demo(
    task_id: str | None,
    settings: Settings,
    *,
    faults: FaultPlan | None = None,
    latency_s: float = 0.0,
    show_progress: bool | None = False,
    memory_store: Path | None = None,
    sample: int = 0,
    scouting: Scouting = "mapreduce",
) -> DemoOutcome:
    """Answer one sandbox task with the simulated model through the whole pipeline; score it.

    Args:
        task_id: a sandbox instance id (default `DEFAULT_TASK`).
        settings: run settings (workers, runs dir, budgets ...); the model, the search backend
            and the extraction model are replaced by the demo's.
        faults: seeded fault injection for the simulated model.
        latency_s: fixed sleep per model call.
        show_progress: force the live progress display on/off.
        memory_store: a demo memory folder (created with the hashing encoder if missing): the run
            reads its prior from a frozen snapshot, is scored against the sandbox gold, and is then
            committed (record, hint credit, distillation when due) exactly as `eval run` commits.
        sample: the simulated manager's sample number (0: its fixed default; k: another sample, as
            an LLM at temperature > 0 would give).
        scouting: how the simulated manager finds a discovery task's entities (`mapreduce`: a
            decision with `discover`; `sequential`: it reads every list page itself).

    Raises:
        UserError: `task_id` is not a sandbox task; the message lists the ids.
    """
    from amapreduce.demo.model import SimulatedAtlasModel
    from amapreduce.llm.factory import new_meter
    from amapreduce.memory.protocol import InstanceSession
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind
    from amapreduce.testing.scripted import SIMULATED_PRICES

    tasks, world = load_sandbox_tasks(settings)
    chosen = task_id or DEFAULT_TASK
    if chosen not in tasks:
        raise UserError(f"unknown sandbox task {chosen!r}. Sandbox tasks are: {', '.join(sorted(tasks))}.")
    task = tasks[chosen]
    model = SimulatedAtlasModel(faults=faults, latency_s=latency_s, sample=sample, scouting=scouting)
    run_settings = demo_settings(settings, world.index_dir)
    memory = _demo_memory(memory_store) if memory_store is not None else None
    instance = InstanceSession(memory, task_id=chosen, query=task.query) if memory is not None else None
    try:
        meter = new_meter(run_settings, prices_by_prefix=SIMULATED_PRICES)
        prior = instance.snapshot if instance is not None else None
        if chosen.startswith(ENRICH_PREFIX):  # a given list: `amapreduce enrich`'s session, no manager
            from amapreduce.demo.enrichment import sandbox_request
            from amapreduce.enrichment import run_enrichment

            outcome = run_enrichment(sandbox_request(chosen, world, run_settings), run_settings,
                                     inner=lambda role: model, meter=meter, prior_provider=prior,
                                     show_progress=show_progress, task_id=chosen, query=task.query).outcome
        else:
            run = Session(run_settings, RunOptions(
                kind=RunKind.DEMO, query=task.query, task_id=chosen, inner=lambda role: model, meter=meter,
                prior_provider=prior, show_progress=show_progress,
            ))
            with run:
                outcome = run.ask()
        gold = gold_dir_of(world, chosen)
        score = score_answer(task, gold, outcome.markdown)
        corrected, corrections = score_answer_corrected(task, gold, outcome.markdown)
        learned = _learn(memory, instance, outcome, score) if memory is not None and instance is not None else None
    finally:
        if memory is not None:
            memory.close()
    return DemoOutcome(task_id=chosen, ask=outcome, score=score, corrected_score=corrected, corrections=corrections,
                       faults=dict(model.faults.injected), wrong_cells=frozenset(model.faults.wrong_cells), memory=learned)


def _demo_memory(store: Path) -> ExperientialMemory:
    """The demo's memory: the sandbox benchmark's settings (distilling after every run), the
    simulated memory model, and the hashing encoder for a new store (instant, no torch: the
    README's quick start installs no encoder model)."""
    from amapreduce.bench.journal import benchmark_defaults
    from amapreduce.demo.memory_model import SimulatedMemoryModel
    from amapreduce.memory import ExperientialMemory, MemoryConfig
    from amapreduce.memory.schema import DB_NAME

    # The sandbox benchmark's settings, but distilling after every run: a demo shows one run's
    # experience reaching the next at once, not after a few dozen records.
    config = MemoryConfig(**{**benchmark_defaults("sandbox").memory, "distill_start": 1, "distill_every": 1})
    encoder = None if (store / DB_NAME).exists() else "hashing"
    return ExperientialMemory(store, config=config, model=SimulatedMemoryModel(), encoder=encoder)


def _learn(memory: ExperientialMemory, session: InstanceSession, outcome: RunOutcome,
           score: dict[str, float]) -> dict[str, Any]:
    """Commit the demo run as `eval run` commits a trial; return the prior shown and what was learned."""
    from amapreduce.bench.commit import commit_instance
    from amapreduce.bench.journal import benchmark_defaults
    from amapreduce.bench.learn import run_record_id
    from amapreduce.memory.labels import UtilityWeights, utility
    from amapreduce.memory.protocol import TrialOutcome
    from amapreduce.memory.records import TraceSummary

    defaults = benchmark_defaults("sandbox")
    usage, prior = outcome.meter.total(), outcome.prior
    shown = prior.to_json() if prior is not None else {"text": None, "hint_ids": [], "kept_hint_ids": [],
                                                       "record_ids": [], "advice": None, "advice_used": None}
    if not outcome.decisions:
        session.snapshot.close()
        return {"store": str(memory.store.folder), "prior": shown,
                "learned": {"committed": False, "reason": "no decision was executed"}}
    wall = outcome.record.timings.wall_s
    u = utility(score, tokens=usage.total_tokens, delay_s=wall,
                weights=UtilityWeights(cost=defaults.cost_weight, delay=defaults.delay_weight))
    trial = TrialOutcome(trial=1, prior=prior, decision=outcome.decisions[0], metrics={**score, "utility": u},
                         trace=TraceSummary.of(outcome.record.completeness.model_dump(), cost_usd=usage.cost_usd, delay_s=wall,
                                               tokens=usage.total_tokens,
                                               advice=prior.advice_used if prior is not None else None),
                         utility=u)
    record_id = run_record_id(outcome.run_dir.path)  # the id `memory learn` would give it: one commit per run
    learned = commit_instance(memory, session, [trial], record_id=record_id)
    return {"store": str(memory.store.folder), "prior": shown, "utility": round(u, 6), "learned": learned}
