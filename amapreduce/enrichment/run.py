"""Running an enrichment as one `Session`, and writing the enriched list again after a resume.

An enrichment is a run of kind `enrich`: pre-flight (models, search backend, memory store, the
decision's batch plan under the cap) before anything is made; then the run directory, which keeps
the request (`enrich.json`: the input rows and what was asked) beside the journal; the plan stage
(the decision's batch plan and the experiential memory's prior for it, traced and recorded in
`result.json`); the engine (batches, retries, patch rounds, evidence, budgets, progress, the
journal that a resume replays); and the enriched list, written as `enriched.csv` (every evidence
column included) in the run directory.

A killed enrichment is finished by `amapreduce runs resume RUN` (`session.resume`: its finished
batches are replayed from the journal, not run again); `resumed_enrichment` then reads
`enrich.json` and writes the enriched list of the resumed run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import write_json
from amapreduce.enrichment.listfile import write_list
from amapreduce.enrichment.output import RowCounts, enriched_frame, row_counts
from amapreduce.enrichment.request import EnrichRequest
from amapreduce.errors import UserError

if TYPE_CHECKING:
    import pandas as pd
    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.prior import PriorProvider
    from amapreduce.mapreduce.solver import BatchSolver
    from amapreduce.progress import ProgressSink
    from amapreduce.session import Session
    from amapreduce.session.outcome import RunOutcome
    from amapreduce.session.parts import InnerFactory
    from amapreduce.settings import Settings

__all__ = ["ENRICHED_FILE", "ENRICH_FILE", "Enrichment", "resumed_enrichment", "run_enrichment"]

ENRICH_FILE = "enrich.json"
"""The request of an enrich run, kept in its run directory for a resume."""
ENRICHED_FILE = "enriched.csv"
"""The enriched list (with every evidence column) in the run directory."""


@dataclass(frozen=True)
class Enrichment:
    """A finished (or stopped) enrichment: what was asked and the run's outcome."""

    request: EnrichRequest
    outcome: RunOutcome

    def frame(self, *, evidence: bool = False) -> pd.DataFrame:
        """The enriched list (see `enrichment.output.enriched_frame`)."""
        return enriched_frame(self.request, self.outcome.table, evidence=evidence)

    def rows(self) -> RowCounts:
        """Rows by `enrich_status`: `complete`, `partial`, `failed`."""
        return row_counts(self.frame())

    def write(self, path: str | Path, *, evidence: bool = False) -> None:
        """Write the enriched list to `path` atomically, in the format its suffix names."""
        write_list(self.frame(evidence=evidence), path)

    def to_json(self) -> dict[str, Any]:
        """The `enrich --json` fields: rows by status, key, new columns, the run directory."""
        return {"rows": len(self.request.frame), "row_status": self.rows(),
                "key_columns": list(self.request.key_columns), "key_inferred": self.request.key_inferred,
                "columns": list(self.request.columns), "batch_size": self.request.batch_size,
                "completeness": self.outcome.record.completeness.model_dump(mode="json"),
                "enriched": str(self.outcome.run_dir.path / ENRICHED_FILE)}


def run_enrichment(
    request: EnrichRequest,
    settings: Settings,
    *,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    meter: UsageMeter | None = None,
    memory_store: Path | None = None,
    prior_provider: PriorProvider | None = None,
    solver: BatchSolver | None = None,
    show_progress: bool | None = False,
    task_id: str | None = None,
    query: str | None = None,
    on_progress: ProgressSink | None = None,
) -> Enrichment:
    """Enrich `request`'s rows as one `Session` of kind `enrich` (see the module's docstring).
    `query` is what the run records as asked (default `EnrichRequest.query`; a benchmark task's: its question).

    Raises:
        ConfigError, UserError: pre-flight refused the run (nothing is made).
        DecisionError: the decision made from the rows is invalid or over the batch cap.
        KeyboardInterrupt: Ctrl-C; the run directory keeps the partial table.
    """
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind

    decision = request.decision()
    session = Session(settings, RunOptions(
        kind=RunKind.ENRICH, query=query or request.query, decision=decision, inner=inner, web_tools=web_tools,
        meter=meter, memory_store=memory_store, prior_provider=prior_provider, solver=solver,
        show_progress=show_progress, task_id=task_id, on_progress=on_progress,
    ))
    with session:
        write_json(session.run_dir / ENRICH_FILE, request.to_json())
        outcome = session.run(decision, _plan_stage(session, decision))
        done = Enrichment(request, outcome)
        done.write(outcome.run_dir.path / ENRICHED_FILE, evidence=True)
    return done


def _plan_stage(session: Session, decision: Decision) -> BatchPlan:
    """The plan stage of an enrichment (its decision is made in code, so no manager revises it):
    the batch plan under the run's cap and the experiential memory's prior for the decision,
    traced and recorded in `result.json` (`prior`). A memory that fails is traced and the run goes
    on without its prior, as the `mapreduce` tool's plan stage goes on.

    Raises:
        DecisionError: the plan is larger than the cap.
    """
    from amapreduce.errors import AmapreduceError
    from amapreduce.mapreduce.prior import Prior

    session.progress.set_stage("plan")
    plan = session.plan_of(decision)
    try:
        prior = session.prior_for(decision)
    except AmapreduceError as exc:
        session.trace.write("prior_error", error=str(exc))
        prior = session.prior = Prior(text=f"Experiential memory is unavailable for this run ({exc}).")
    session.trace.write("plan_stage", batches=len(plan.batches), rows=plan.num_rows, strategy=plan.strategy,
                        prior=prior.text, hint_ids=list(prior.hint_ids))
    return plan


def resumed_enrichment(outcome: RunOutcome) -> Enrichment:
    """The enrichment of a resumed `enrich` run (its request read from `enrich.json`), its
    `enriched.csv` written again.

    Raises:
        UserError: the run directory has no readable `enrich.json`.
    """
    kept = outcome.run_dir.path / ENRICH_FILE
    try:
        request = EnrichRequest.from_json(json.loads(kept.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise UserError(f"the enrich run's {str(kept)!r} cannot be read ({exc}); run enrich again.") from None
    done = Enrichment(request, outcome)
    done.write(outcome.run_dir.path / ENRICHED_FILE, evidence=True)
    return done
