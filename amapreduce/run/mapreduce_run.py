"""`amapreduce mapreduce run`: a decision straight through the engine (no manager), kept in a run folder.

For users who already know their entity list, like a DocETL/LOTUS map operation. The run
directory and its `result.json` (on success or failure) come from `run.lifecycle`, shared with
`amapreduce ask`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amapreduce.errors import RunCancelled
from amapreduce.mapreduce.result import RunEnding, completeness_record
from amapreduce.run.lifecycle import start_run
from amapreduce.run.progress import RunProgress
from amapreduce.run.wiring import InnerFactory, build_parts
from amapreduce.settings import Settings

if TYPE_CHECKING:
    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.result import MapReduceResult
    from amapreduce.run.rundir import RunDir

__all__ = ["MapReduceRunOutcome", "run_decision"]


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
    """
    with start_run(settings, kind="mapreduce_run", query=label) as run:
        with RunProgress(run.meter, enabled=show_progress) as progress:
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
            try:
                result = parts.engine.run(decision)
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
