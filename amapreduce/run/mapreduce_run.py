"""`amapreduce mapreduce run`: a decision straight through the engine (no manager), kept in a run folder.

For users who already know their entity list, like a DocETL/LOTUS map operation. The run
directory and its `result.json` (on success or failure) come from `run.lifecycle`, shared with
`amapreduce ask`. A killed or interrupted run goes on where it stopped with `resume_decision_run`
(`amapreduce runs resume`): its journal's finished batches are not run again.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amapreduce.errors import RunCancelled, UserError
from amapreduce.mapreduce.checkpoint import plan_from_manifest
from amapreduce.mapreduce.result import RunEnding, completeness_record
from amapreduce.run.lifecycle import ActiveRun, resume_run, start_run
from amapreduce.run.progress import RunProgress
from amapreduce.run.run_journal import RunKind
from amapreduce.run.wiring import InnerFactory, build_parts
from amapreduce.settings import Settings

if TYPE_CHECKING:
    from pathlib import Path

    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.result import MapReduceResult
    from amapreduce.run.run_journal import RunJournal
    from amapreduce.run.rundir import RunDir

__all__ = ["MapReduceRunOutcome", "resume_decision_run", "run_decision"]


@dataclass(kw_only=True)
class MapReduceRunOutcome:
    """What a finished (or stopped) `mapreduce run` produced."""

    result: MapReduceResult
    run_dir: RunDir
    record: dict[str, Any]
    """The content of `result.json`."""
    meter: UsageMeter
    """Usage and cost of the run, by role."""

    @property
    def ending(self) -> RunEnding:
        """`COMPLETE`, `INCOMPLETE` (cells missing or tasks short), `STOPPED` or `INTERRUPTED`."""
        return self.result.ending

    @property
    def status(self) -> str:
        """The `status` string of `result.json` (`ending.label`)."""
        return self.ending.label


def run_decision(
    decision: Decision,
    settings: Settings,
    *,
    label: str,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    show_progress: bool | None = None,
) -> MapReduceRunOutcome:
    """Execute `decision` with sub-agents from `settings`; always leaves a complete run directory.

    A budget stop or Ctrl-C keeps the partial table (status `stopped: <reason>` or
    `stopped: interrupted`). `label` names the
    run directory and is recorded as the run's `query`. The decision is the user's, so its batch
    plan is capped only when `settings` set `max_batches` explicitly (`Settings.batch_cap`).

    Raises:
        DecisionError: the batch plan is larger than the cap; checked before a run directory is
            made, since it is a usage mistake, not a run that failed.
    """
    from amapreduce.mapreduce.batching import plan_batches

    plan = plan_batches(decision, max_batches=settings.batch_cap("user"))
    with start_run(settings, kind=RunKind.MAPREDUCE_RUN, query=label) as run:
        return _execute(run, decision, settings, plan=plan, inner=inner, web_tools=web_tools, show_progress=show_progress)


def resume_decision_run(
    path: Path,
    saved: RunJournal,
    settings: Settings,
    *,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    show_progress: bool | None = None,
) -> MapReduceRunOutcome:
    """Finish the interrupted `mapreduce run` in `path` (its journal: `saved`) in place.

    The saved decision runs on its saved batch plan; the batches the journal marks done are not
    run again (their rows are replayed), then the patch rounds and the final table follow, written
    to the same directory. `settings` are the run's own (see `run.resume.resume`).

    Raises:
        UserError: the run stopped before its decision was journaled.
    """
    from amapreduce.decision.model import Decision

    executions = saved.executions
    if not executions:
        raise UserError(f"the run in {str(path)!r} stopped before its decision was recorded; start it again.")
    decision = Decision.parse(executions[0].decision)
    with resume_run(path, saved, settings) as run:
        return _execute(
            run, decision, settings, plan=plan_from_manifest(executions[0].plan), inner=inner,
            web_tools=web_tools, show_progress=show_progress,
        )


def _execute(
    run: ActiveRun,
    decision: Decision,
    settings: Settings,
    *,
    plan: BatchPlan,
    inner: InnerFactory | None,
    web_tools: list[Tool] | None,
    show_progress: bool | None,
) -> MapReduceRunOutcome:
    """Run `decision` on its batch `plan` in `run` and record how it ended."""
    with RunProgress(run.meter, enabled=show_progress) as progress, contextlib.ExitStack() as held:
        parts = build_parts(
            settings,
            trace=run.run_dir.trace,
            meter=run.meter,
            progress=progress,
            on_provider_retry=progress.on_provider_retry,
            inner=inner,
            web_tools=web_tools,
            roles=("subagent", "extraction"),
        )
        held.callback(parts.close)  # MCP sessions and server processes end with the run
        try:
            result = parts.engine.run(decision, plan=plan, checkpoint=run.checkpoint)
        except RunCancelled as exc:
            result = exc.partial
    record = run.finish(
        result.table,
        completeness_record(result.summary.completeness, [result.summary]),
        ending=result.ending,
        executions=[result.summary.timings],
        extra={"decision": decision.model_dump(mode="json"), "web": parts.web_usage()},
    )
    return MapReduceRunOutcome(result=result, run_dir=run.run_dir, record=record, meter=run.meter)
