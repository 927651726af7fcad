"""`amapreduce ask`: a wide-search question in, a complete table out, end to end.

The manager agent discovers the entities and writes the decision; the `mapreduce` tool runs it
(plan stage first, with the experiential prior when a memory is given); the final table is the
reducer's table rendered in code. Whatever happens — a budget stop, Ctrl-C, a model failure,
a setup error — the run directory gets a `result.json` with what was found (or why it failed).

Resuming (`runs resume`) runs the manager's decisions again without the manager. A plain
decision is one engine execution, which the journal records; a composed one (`discover`,
`child`) is several, none of which is the manager's decision. So once the manager executes a
composed decision, the run keeps the decisions it executed, in order, in `executed.json`
(`EXECUTED_FILE`), and a resume runs those. An `ask --executor ray` keeps them from the first
one: a decision run in chunks on Ray is not journaled, so a resume runs it again, here.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce._atomic import atomic_open
from amapreduce.errors import RunCancelled, UserError, find_cause
from amapreduce.mapreduce.result import (
    INTERRUPTED,
    RUN_STOPPING_ERRORS,
    Completeness,
    MapReduceResult,
    RunEnding,
    RunStatus,
    completeness_record,
    stop_ending,
)
from amapreduce.run.lifecycle import ActiveRun, resume_run, start_run
from amapreduce.run.progress import RunProgress
from amapreduce.run.run_journal import RunKind
from amapreduce.run.wiring import MERGE_CACHE_DIR, InnerFactory, build_parts
from amapreduce.settings import Settings
from amapreduce.table.render import to_markdown
from amapreduce.table.table import Table

if TYPE_CHECKING:
    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.prior import PriorProvider
    from amapreduce.mapreduce.tool import MapReduceTool
    from amapreduce.run.eval_ray import ExecutorSpec
    from amapreduce.run.run_journal import RunJournal
    from amapreduce.run.rundir import RunDir
    from amapreduce.run.wide_ray import WideSession

__all__ = ["EXECUTED_FILE", "AskOutcome", "check_memory_store", "resume_ask_run", "run_ask"]

EXECUTED_FILE = "executed.json"
"""The manager's executed decisions (with plain ones' batch plans), kept once one is composed."""


class _Executed:
    """Keeps the decisions the `mapreduce` tool executes, in order; from the first composed one on
    (`always`: from the first; an `ask` on Ray, whose wide executions are not journaled), writes
    them all to the run directory (atomically) before each runs."""

    def __init__(self, path: Path, *, always: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []
        self._composed = always

    def __call__(self, decision: Decision, plan: BatchPlan | None) -> None:
        from amapreduce.mapreduce.checkpoint import plan_manifest

        with self._lock:
            self._entries.append({"decision": decision.model_dump(mode="json"),
                                  "plan": None if plan is None else plan_manifest(plan)})
            self._composed = self._composed or decision.composed
            if self._composed:
                with atomic_open(self.path) as handle:
                    json.dump(self._entries, handle, ensure_ascii=False)


def _saved_decisions(path: Path, saved: RunJournal) -> list[tuple[Decision, BatchPlan | None]]:
    """The decisions a killed run executed: `executed.json`'s when the run kept one, else the
    journal's executions (each plain). Raises `UserError` when there are none or the file is damaged."""
    from amapreduce.decision.model import Decision
    from amapreduce.mapreduce.checkpoint import plan_from_manifest

    kept = path / EXECUTED_FILE
    if kept.is_file():
        try:
            entries = json.loads(kept.read_text(encoding="utf-8"))
            return [(Decision.parse(e["decision"]), None if e["plan"] is None else plan_from_manifest(e["plan"]))
                    for e in entries]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"the run's {str(kept)!r} cannot be read ({exc}); ask the question again.") from None
    return [(Decision.parse(e.decision), plan_from_manifest(e.plan)) for e in saved.executions]


@dataclass(kw_only=True)
class AskOutcome:
    """The answer to one question."""

    table: Table
    markdown: str
    """The table as WideSearch-readable markdown (or the manager's own answer when no table was built)."""
    ending: RunEnding
    """`COMPLETE`, `INCOMPLETE`, `NO_TABLE`, `STOPPED` or `INTERRUPTED`, with the reason of a stop."""
    completeness: Completeness
    """The final table against every decision the manager executed."""
    run_dir: RunDir
    meter: UsageMeter
    record: dict[str, Any]
    tool: MapReduceTool

    @property
    def status(self) -> str:
        """The `status` string of `result.json` (`ending.label`)."""
        return self.ending.label


def _manager_stop_ending(exc: BaseException) -> RunEnding:
    """How a manager run that raised `exc` (smolagents' wrapper of a tool's or model's error) ended."""
    cause = find_cause(exc, RunCancelled, *RUN_STOPPING_ERRORS)
    if isinstance(cause, RunCancelled) and isinstance(cause.partial, MapReduceResult):
        return cause.partial.ending  # the engine knows why it stopped: budget, cancel or Ctrl-C
    if cause is not None:
        return stop_ending(cause)
    return RunEnding(RunStatus.FAILED, f"manager failed: {exc}")


def check_memory_store(store: Path) -> None:
    """Refuse a `--memory` folder that holds no store (or a file that is not one), before a run
    directory is made.

    Why here and as a `UserError`: a mistyped path is a usage mistake (exit 2), not a run
    failure, and the memory layer's own message speaks of its `--store` flag, which `ask` has not.
    """
    from amapreduce.memory.schema import DB_NAME, connect

    if not (store / DB_NAME).is_file():
        raise UserError(
            f"--memory {str(store)!r} holds no experiential-memory store (no {DB_NAME} there). "
            "Point --memory at a store folder (one made by `amapreduce memory import` or `memory add`), "
            "or use --no-memory."
        )
    connect(store, create=False, readonly=True).close()  # an empty or foreign file: NotAMemoryStore, exit 2


def run_ask(
    query: str,
    settings: Settings,
    *,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    meter: UsageMeter | None = None,
    prior_provider: PriorProvider | None = None,
    memory_store: Path | None = None,
    task_id: str | None = None,
    show_progress: bool | None = None,
    kind: RunKind = RunKind.ASK,
    executor: ExecutorSpec | None = None,
) -> AskOutcome:
    """Answer `query` with the manager, the mapreduce tool and search sub-agents.

    Args:
        query: the wide-search question.
        settings: models, limits, budgets, search backend.
        inner: replaces provider clients (the offline demo's simulated model).
        web_tools: replaces the web tools (e.g. the sandbox corpus).
        meter: the run's usage meter (default: `new_meter(settings)`; the demo's also prices its
            simulated model).
        prior_provider: a plan-stage prior provider (overrides `memory_store`).
        memory_store: an experiential-memory folder to draw the plan-stage prior from (opened
            read-only: a run never changes the memory; learning happens after scoring).
        task_id: benchmark instance id, passed to the memory.
        show_progress: False: no progress; True: force the live display; None (default): the live
            display on a terminal, else plain timestamped lines on stderr (`run.progress`).
        kind: what the run is listed as (`demo` and `eval` for the demo's and an evaluation's runs).
        executor: `ray[:ADDRESS]`: the manager runs here, and an execution whose plan is more than
            one chunk runs its chunks on Ray (`run.wide_ray.WideSession`); the manager, the
            sub-agents here and every chunk share one cluster limiter and budget. None or `local`:
            everything runs here.

    Raises:
        UserError: `memory_store` holds no store (checked before a run directory is made).
        Exception: any other setup or run failure, re-raised after `result.json` is written with
            status `failed` and the error message.
    """
    if prior_provider is None and memory_store is not None:
        check_memory_store(memory_store)
    with contextlib.ExitStack() as cluster:
        session: WideSession | None = None
        if executor is not None and executor.kind == "ray":  # before the run directory: Ray unreachable is a usage error
            from amapreduce.llm.factory import new_meter
            from amapreduce.run.wide_ray import wide_session

            session = cluster.enter_context(wide_session(meter or new_meter(settings), address=executor.address))
            meter = session.meter
        return _ask(query, settings, session=session, inner=inner, web_tools=web_tools, meter=meter,
                    prior_provider=prior_provider, memory_store=memory_store, task_id=task_id,
                    show_progress=show_progress, kind=kind)


def _ask(
    query: str,
    settings: Settings,
    *,
    session: WideSession | None,
    inner: InnerFactory | None,
    web_tools: list[Tool] | None,
    meter: UsageMeter | None,
    prior_provider: PriorProvider | None,
    memory_store: Path | None,
    task_id: str | None,
    show_progress: bool | None,
    kind: RunKind,
) -> AskOutcome:
    """`run_ask` in its run directory (on `session`'s Ray when given)."""
    from smolagents.utils import AgentError

    from amapreduce.agents.manager import build_manager
    from amapreduce.mapreduce.tool import MapReduceTool

    answer: Any = None
    stopped: RunEnding | None = None
    interrupted: BaseException | None = None
    with start_run(settings, kind=kind, query=query, meter=meter) as run:
        with RunProgress(run.meter, enabled=show_progress) as progress, contextlib.ExitStack() as held:
            roles = ("manager", "subagent", "extraction", *(("memory",) if memory_store is not None else ()))
            parts = build_parts(
                settings, trace=run.run_dir.trace, meter=run.meter, progress=progress,
                on_provider_retry=progress.on_provider_retry, inner=inner, web_tools=web_tools, roles=roles,
                merge_cache=run.run_dir.path / MERGE_CACHE_DIR,
            )
            held.callback(parts.close)  # MCP sessions and server processes end with the run
            if prior_provider is None and memory_store is not None:
                from amapreduce.memory import ExperientialMemory

                prior_provider = ExperientialMemory(memory_store, model=parts.models.get("memory"), readonly=True)
            tool = MapReduceTool(
                parts.engine,
                query=query,
                task_id=task_id,
                prior_provider=prior_provider,
                max_calls=settings.max_tool_calls,
                checkpoint=run.checkpoint,
                merger=parts.merger,
                context_window=parts.context_window,
                on_execute=_Executed(run.run_dir.path / EXECUTED_FILE, always=session is not None),
                wide=session.executor(settings, run.run_dir.trace) if session is not None else None,
            )
            manager = build_manager(
                parts.models["manager"], [*parts.manager_tools, tool],
                max_steps=settings.manager_max_steps, max_batches=settings.max_batches, trace=run.run_dir.trace,
            )
            progress.set_stage("manager")
            try:
                answer = manager.run(query)
            except AgentError as exc:
                stopped = _manager_stop_ending(exc)
            except KeyboardInterrupt as exc:
                stopped, interrupted = INTERRUPTED, exc
        outcome = _finish(run, tool, answer=answer, stopped=stopped, web_usage=parts.web_usage())
    if interrupted is not None:
        raise interrupted
    return outcome


def resume_ask_run(
    path: Path,
    saved: RunJournal,
    settings: Settings,
    *,
    inner: InnerFactory | None = None,
    web_tools: list[Tool] | None = None,
    show_progress: bool | None = None,
) -> AskOutcome:
    """Finish the interrupted `ask` run in `path` (its journal: `saved`) in place.

    The manager is not asked again and scouting is not repeated: the decisions it had executed
    (journaled with their batch plans) run again through the `mapreduce` tool's own path, their
    finished batches replayed from the journal, then their patch rounds; the table is rendered
    and recorded as `ask` does. The manager's final answer of the killed run is lost, and so is
    the usage of its own calls (the journal records the sub-agents' usage only).

    Raises:
        UserError: the run was killed before the manager executed any decision.
    """
    from amapreduce.mapreduce.tool import MapReduceTool

    executions = _saved_decisions(path, saved)
    if not executions:
        raise UserError(
            f"the run in {str(path)!r} stopped before the manager executed a decision, so there is nothing to "
            "resume; ask the question again."
        )
    stopped: RunEnding | None = None
    interrupted: BaseException | None = None
    with resume_run(path, saved, settings) as run:
        with RunProgress(run.meter, enabled=show_progress) as progress, contextlib.ExitStack() as held:
            parts = build_parts(
                settings, trace=run.run_dir.trace, meter=run.meter, progress=progress,
                on_provider_retry=progress.on_provider_retry, inner=inner, web_tools=web_tools,
                roles=("subagent", "extraction"), merge_cache=run.run_dir.path / MERGE_CACHE_DIR,
            )
            held.callback(parts.close)
            tool = MapReduceTool(parts.engine, query=saved.first.query, plan_stage=False, max_calls=len(executions),
                                 checkpoint=run.checkpoint, merger=parts.merger, context_window=parts.context_window)
            try:
                for decision, plan in executions:
                    tool.execute(decision, plan)
            except RunCancelled as exc:
                stopped = _manager_stop_ending(exc)
            except KeyboardInterrupt as exc:
                stopped, interrupted = INTERRUPTED, exc
        outcome = _finish(run, tool, answer=None, stopped=stopped, web_usage=parts.web_usage())
    if interrupted is not None:
        raise interrupted
    return outcome


def _finish(
    run: ActiveRun, tool: MapReduceTool, *, answer: Any, stopped: RunEnding | None, web_usage: dict[str, Any]
) -> AskOutcome:
    """Render and record how an `ask` run ended: the table the tool accumulated, its completeness
    over every executed decision, and `result.json`."""
    table = tool.table if tool.table is not None else Table(["answer"], ["answer"])
    completeness = Completeness.of(table, tool.filled)
    if stopped is not None:
        ending = stopped
    else:
        ending = RunEnding(completeness.status if len(table) else RunStatus.NO_TABLE)
    markdown = to_markdown(table) if len(table) else str(answer or "")
    summaries = [r.summary for r in tool.results]
    record = run.finish(
        table, completeness_record(completeness, summaries, mapreduce_calls=tool.calls), ending=ending,
        executions=[s.timings for s in summaries],
        extra={
            "task_id": tool.task_id,
            "manager_answer": None if answer is None else str(answer),
            "decisions": [d.model_dump(mode="json") for d in tool.decisions],
            # one `DiscoverySummary` per executed decision that discovered its matrix (none: no key)
            **({"discoveries": found} if (found := [r.discovery.to_json() for r in tool.results if r.discovery]) else {}),
            "prior": None if tool.prior is None else {"text": tool.prior.text, "hint_ids": list(tool.prior.hint_ids)},
            "web": web_usage,
        },
    )
    return AskOutcome(
        table=table, markdown=markdown, ending=ending, completeness=completeness, run_dir=run.run_dir,
        meter=run.meter, record=record, tool=tool,
    )
