"""`amapreduce mapreduce run`: a decision straight through the engine (no manager), kept in a run folder.

For users who already know their entity list, like a DocETL/LOTUS map operation, or who can
name where it is listed (`discover`), or who nest a decision per task (`child`): the decision
runs through `mapreduce.compose.run_decision`. The run directory and its `result.json` (on
success or failure) come from `run.lifecycle`, shared with `amapreduce ask`. A killed or
interrupted run goes on where it stopped with `resume_decision_run` (`amapreduce runs resume`):
its journal's finished batches are not run again.

A composed decision is not itself an engine execution (its discovery map, fill and children
are), so the journal's first execution is not the decision the user gave: it is kept in the
run directory as `decision.json` before anything runs, and a resume reads it from there.

With `--executor ray`, a plain decision whose plan is more than one chunk (`run.wide_ray`) runs as
chunks of batches in Ray tasks, merged by the driver; a composed one, or one that fits a chunk,
runs here as with `local`. Its journal records each chunk as it comes back, and a resume of it
runs on Ray again (on the cluster it ran on), its finished chunks replayed, not run.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import atomic_open
from amapreduce.errors import RunCancelled, UserError
from amapreduce.llm.factory import model_for_role
from amapreduce.mapreduce.checkpoint import plan_from_manifest
from amapreduce.mapreduce.result import RunEnding, completeness_record
from amapreduce.run.lifecycle import ActiveRun, resume_run, start_run
from amapreduce.run.progress import RunProgress
from amapreduce.run.run_journal import RunKind
from amapreduce.run.wiring import MERGE_CACHE_DIR, InnerFactory, build_parts
from amapreduce.settings import Settings

if TYPE_CHECKING:
    from pathlib import Path

    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.result import MapReduceResult
    from amapreduce.run.eval_ray import ExecutorSpec
    from amapreduce.run.run_journal import RunJournal
    from amapreduce.run.rundir import RunDir

__all__ = ["DECISION_FILE", "MapReduceRunOutcome", "resume_decision_run", "run_decision"]

DECISION_FILE = "decision.json"
"""Where a composed decision (`discover` or `child`) is kept in its run directory, for a resume."""


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
    executor: ExecutorSpec | None = None,
) -> MapReduceRunOutcome:
    """Execute `decision` with sub-agents from `settings`; always leaves a complete run directory.

    A budget stop or Ctrl-C keeps the partial table (status `stopped: <reason>` or
    `stopped: interrupted`). `label` names the
    run directory and is recorded as the run's `query`. The decision is the user's, so its batch
    plan is capped only when `settings` set `max_batches` explicitly (`Settings.batch_cap`).
    `executor` `ray[:ADDRESS]`: a plain decision of more batches than one chunk runs in chunks on
    Ray (see the module doc), a plan over the cap included; None or `local`: in this process.

    Raises:
        DecisionError: the batch plan (a discovery's: its map's) is larger than the cap; checked
            before a run directory is made, since it is a usage mistake, not a run that failed.
        ConfigError: `ray` was asked for and the `ray` extra is missing.
    """
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.mapreduce.discover import discovery_plan

    cap = settings.batch_cap("user")
    if executor is not None and executor.kind == "ray" and not decision.composed:
        from amapreduce.run.eval_ray import require_ray
        from amapreduce.run.wide_ray import chunk_batches

        whole = plan_batches(decision, max_batches=None)
        if len(whole.batches) > chunk_batches(settings):
            require_ray()
            with start_run(settings, kind=RunKind.MAPREDUCE_RUN, query=label) as run:
                return _execute_wide(run, decision, settings, plan=whole, address=executor.address)
    if decision.discover is not None:
        discovery_plan(decision.discover, max_batches=cap)  # the fill and children are planned as they run
    plan = None if decision.discover is not None else plan_batches(decision, max_batches=cap)
    with start_run(settings, kind=RunKind.MAPREDUCE_RUN, query=label) as run:
        if decision.composed:
            with atomic_open(run.run_dir.path / DECISION_FILE) as handle:
                json.dump(decision.model_dump(mode="json"), handle, ensure_ascii=False)
        return _execute(
            run, decision, settings, plan=None if decision.composed else plan, inner=inner, web_tools=web_tools,
            show_progress=show_progress,
        )


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

    A composed decision (`decision.json`, see the module doc) runs again from the top: each of
    its executions the journal holds is replayed, the rest run.

    Raises:
        UserError: the run stopped before its decision was journaled, or its `decision.json` is
            unreadable.
    """
    from amapreduce.decision.model import Decision

    kept = path / DECISION_FILE
    if kept.is_file():
        try:
            decision = Decision.parse(json.loads(kept.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:  # DecisionError is a UserError; JSON errors are ValueErrors
            raise UserError(f"the run's {str(kept)!r} cannot be read ({exc}); start the run again.") from None
        with resume_run(path, saved, settings) as run:
            return _execute(run, decision, settings, plan=None, inner=inner, web_tools=web_tools,
                            show_progress=show_progress)
    wide = saved.wide
    if wide is not None:  # a wide run on Ray: its chunks that came back are replayed, the rest run
        from amapreduce.run.eval_ray import require_ray

        require_ray()
        with resume_run(path, saved, settings) as run:
            return _execute_wide(run, Decision.parse(wide.decision), settings, plan=plan_from_manifest(wide.plan),
                                 address=wide.address, saved=saved)
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
    plan: BatchPlan | None,
    inner: InnerFactory | None,
    web_tools: list[Tool] | None,
    show_progress: bool | None,
) -> MapReduceRunOutcome:
    """Run `decision` (on its batch `plan`; None: planned as it runs) in `run` and record how it ended."""
    from amapreduce.mapreduce.compose import run_decision as run_composed

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
            merge_cache=run.run_dir.path / MERGE_CACHE_DIR,
        )
        held.callback(parts.close)  # MCP sessions and server processes end with the run
        try:
            window = parts.context_window() if decision.discover is not None else None
            result = run_composed(parts.engine, decision, plan=plan, checkpoint=run.checkpoint, merger=parts.merger,
                                  context_window=window)
        except RunCancelled as exc:
            result = exc.partial
    return _finish(run, decision, result, {
        "web": parts.web_usage(), **({"discovery": result.discovery.to_json()} if result.discovery is not None else {}),
    })


def _finish(run: ActiveRun, decision: Decision, result: MapReduceResult, extra: dict[str, Any]) -> MapReduceRunOutcome:
    """Record how the run ended (`result.json`, the table files) and hand back its outcome."""
    record = run.finish(
        result.table,
        completeness_record(result.summary.completeness, [result.summary]),
        ending=result.ending,
        executions=[result.summary.timings],
        extra={"decision": decision.model_dump(mode="json"), **extra},
    )
    return MapReduceRunOutcome(result=result, run_dir=run.run_dir, record=record, meter=run.meter)


def _execute_wide(run: ActiveRun, decision: Decision, settings: Settings, *, plan: BatchPlan,
                  address: str | None, saved: RunJournal | None = None) -> MapReduceRunOutcome:
    """Run `decision`'s `plan` in chunks on Ray (`run.wide_ray.run_wide`), journaled in the run's
    journal (`saved`: the journal of the run resumed), and record how it ended."""
    from amapreduce.run.wide_ray import run_wide

    roles = {role: model for role in ("subagent", "extraction") if (model := model_for_role(settings, role))}
    wide = run_wide(decision, plan, settings, meter=run.meter, trace=run.run_dir.trace, address=address,
                    role_models=roles, journal=run.journal, saved=saved.entries if saved is not None else ())
    return _finish(run, decision, wide.result, {
        "web": wide.web, "executor": {"kind": "ray", "chunks": wide.chunks, "finished": wide.finished},
    })
