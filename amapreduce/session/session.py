"""`Session`: the one composition root of a run.

Every run — `ask`, `mapreduce run`, `runs resume`, the Python API, the demo, an evaluation's
trial — is one `Session`, built from `Settings` plus one `RunOptions` value:

1. **Pre-flight** (`Session(...)`): the role models, the meter and the search backend are built
   and kept, the MCP config and the memory store checked, tracing turned on. A usage mistake
   fails here with a `ConfigError`/`UserError` (exit 2) and nothing is created; so does a decision
   whose estimate's low end costs more than the cost budget (`EstimateOverBudget`, exit 4). An
   `ask`'s decision is the manager's, so its fan-out is checked when it executes (`execute`).
2. **Open** (`with session:`): the run directory, its journal and the live progress; the parts
   (`session.parts`) are connected around the models built in pre-flight (built once per run).
3. **Work**: `execute(decision)` runs a decision through the engine (composed ones included) and
   reduces its rows into the run's one table; the manager's `mapreduce` tool calls it, and so do
   `run`, `resume` and the API. `ask()` runs the manager; `run(decision)` one decision.
4. **Finish** (`finish()`): `result.json` and the table files, and one `RunOutcome`.

An executor (`RunOptions.executor`, built by the caller: `cluster.executor_for`) runs a plain
decision too wide for one engine run in chunks elsewhere; this package only knows its protocol
(`session.executor.Executor`), never Ray.

Resuming (`session.resume.resume`): a session over a killed run's directory, journal and settings
(`resuming=`), which `run`s its saved decision again or `replay`s an `ask`'s executed decisions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from amapreduce import telemetry
from amapreduce._atomic import write_json
from amapreduce.errors import ConfigError, RunCancelled, UserError, find_cause
from amapreduce.llm.factory import ModelFactory, new_meter
from amapreduce.mapreduce.prior import NoPrior, Prior, PriorRequest
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
from amapreduce.progress import ProgressEvent
from amapreduce.session.estimate import Estimate, check_budget, estimate_for
from amapreduce.session.journal import RunKind
from amapreduce.session.ledger import Ledger
from amapreduce.session.lifecycle import ActiveRun, resume_run, start_run
from amapreduce.session.outcome import RunOutcome
from amapreduce.session.parts import (
    MERGE_CACHE_DIR,
    NO_MODEL_HELP,
    InnerFactory,
    RunParts,
    build_models,
    build_parts,
)
from amapreduce.session.progress import RunProgress
from amapreduce.table.render import to_markdown
from amapreduce.table.table import Table
from amapreduce.trace import NullTrace, Trace

if TYPE_CHECKING:
    from types import TracebackType

    from smolagents import Tool

    from amapreduce.decision.model import Decision
    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.models import ManagedModel
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.mapreduce.prior import PriorProvider
    from amapreduce.mapreduce.solver import BatchSolver
    from amapreduce.progress import ProgressSink
    from amapreduce.session.executor import Executor
    from amapreduce.session.journal import RunJournal
    from amapreduce.settings import Settings
    from amapreduce.web.backends.base import SearchBackend

__all__ = ["DECISION_FILE", "EXECUTED_FILE", "RunOptions", "Session"]

DECISION_FILE = "decision.json"
"""Where a `mapreduce run`'s composed decision (`discover` or `child`) is kept, for a resume."""
EXECUTED_FILE = "executed.json"
"""An `ask`'s executed decisions (with plain ones' batch plans), kept once one is composed."""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What a run is and what it plugs in, beside its `Settings`."""

    kind: RunKind = RunKind.ASK
    """What the run is listed as (`ask`, `mapreduce_run`, `demo`, `eval`, `enrich`)."""
    query: str = ""
    """The question (or the label a `mapreduce run` is named by)."""
    task_id: str | None = None
    """A benchmark instance id, passed to the memory (and set on the run's span, as `trial` is)."""
    trial: int | None = None
    """Which trial of the instance an evaluation runs (1-based), for the run's span."""
    inner: InnerFactory | None = None
    """Replaces provider clients (the offline demo's simulated model)."""
    web_tools: list[Tool] | None = None
    """Replaces the web tools (e.g. the sandbox corpus)."""
    meter: UsageMeter | None = None
    """The run's usage meter (default: `new_meter(settings)`; the demo's also prices its simulated model)."""
    prior_provider: PriorProvider | None = None
    """The plan stage's prior (overrides `memory_store`)."""
    memory_store: Path | None = None
    """An experiential-memory folder the plan stage's prior is drawn from (read-only: a run never
    changes the memory; learning happens after scoring)."""
    show_progress: bool | None = None
    """False: no progress; True: the live display; None: live on a terminal, else plain lines."""
    on_progress: ProgressSink | None = None
    """Also gets the run's progress events, whatever `show_progress` says (an MCP client's progress
    notifications): first `started` (its `data`: `run`, the run folder's name, and `run_dir`), then
    the engine's. Called from the run's threads; it must not block."""
    executor: Executor | None = None
    """Runs a plain decision too wide for one engine run in chunks elsewhere (None: all here)."""
    solver: BatchSolver | None = None
    """Replaces the search sub-agents (a test's, or a user's own `BatchSolver`)."""
    roles: tuple[str, ...] | None = None
    """The roles that get a model (default: by kind; the memory's when there is a store)."""
    decision: Decision | None = None
    """A `mapreduce run`'s decision: its batch plan is checked in pre-flight (`Session.run` runs it),
    and so is its estimate against the cost budget (`session.estimate.check_budget`)."""
    estimate_only: bool = False
    """An `ask` that stops at its first fan-out: the manager scouts and writes its decision, and the
    decision's estimate (`RunOutcome.estimate`) is all the run makes (no sub-agent call)."""


ESTIMATE_ONLY = RunEnding(RunStatus.STOPPED, "estimate only: the manager's decision was estimated; no sub-agent was called")
"""How an estimate-only `ask` ends (`RunOptions.estimate_only`)."""


def _error_ending(exc: BaseException) -> RunEnding:
    """How a manager's run that raised `exc` ended when no execution stopped it: a model's or a web
    tool's run-stopping error (smolagents wraps the model's in an `AgentError`), else `failed`."""
    cause = find_cause(exc, *RUN_STOPPING_ERRORS)
    if cause is not None:
        return stop_ending(cause)
    return RunEnding(RunStatus.FAILED, f"manager failed: {exc}")


class Session:
    """One run: its parts built once, its directory, journal, meter and table (see the module doc)."""

    def __init__(self, settings: Settings, options: RunOptions | None = None, *,
                 resuming: tuple[Path, RunJournal] | None = None) -> None:
        """Pre-flight: check and build what the run needs, creating nothing on disk.

        Raises:
            ConfigError: no model for the manager or sub-agents, a model id, search backend or MCP
                config not usable as given, `--otel` without its extra, an executor that cannot run.
            UserError: `memory_store` holds no store.
            EstimateOverBudget: `RunOptions.decision`'s estimate (`session.estimate`) costs more,
                at its low end, than `settings.max_cost_usd`.
        """
        self.settings = settings
        self.options = options = options or RunOptions()
        self._resuming = resuming
        self.model_factory = ModelFactory(settings)
        """The run's model layer, read from the settings once: every key they know registered (masked
        in every file of the run, whatever echoes them), the role models resolved."""
        if settings.otel:  # before anything is made: without the `otel` extra this is a usage error
            telemetry.enable()
        if options.prior_provider is None and options.memory_store is not None:
            from amapreduce.memory.schema import check_memory_store

            check_memory_store(options.memory_store)
        self.roles = options.roles or _default_roles(options)
        self.meter = options.meter or new_meter(settings)  # a bad price file is a usage error, before the directory
        for role in ("manager", "subagent"):
            if role in self.roles and self.model_factory.roles.get(role) is None:
                raise ConfigError(NO_MODEL_HELP)
        self._search: SearchBackend | None = None
        if options.web_tools is None:  # before the models: checking a backend spec asks no server
            from amapreduce.web.backends import make_backend

            self._search = make_backend(settings.search_backend, settings)
        self.models: dict[str, ManagedModel] = {}
        if options.executor is not None:
            options.executor.check()
        self._attach = options.executor is not None and options.kind.is_ask
        """An `ask` joins its executor's cluster for the whole run (the manager's calls and every
        chunk's draw on one limiter), so its models are built once it is attached (`_open`)."""
        self._plan: BatchPlan | None = None
        self._wide = False
        if options.decision is not None and resuming is None:  # checked before any server is asked (the models')
            self._plan, self._wide = _decision_plan(options.decision, settings, options.executor)
            if self._plan is not None and settings.max_cost_usd is not None:  # refused before anything is made
                check_budget(estimate_for(settings, self._plan, options.decision.template, prices=self.meter.prices,
                                          roles=self.model_factory.roles),
                             settings.max_cost_usd)
        if not self._attach:  # an `--api-base` endpoint is asked what it accepts here (`llm.endpoint`)
            self.models = self._build_models(self.meter)
        self.estimate: Estimate | None = None
        """An `ask`'s estimate of its first fan-out (`RunOptions.estimate_only`)."""
        self._stop_lock = threading.Lock()
        self.stopped: RunEnding | None = None
        """How the first execution that ended early ended (budget, cancel, Ctrl-C, estimate only): the
        run's ending. `execute` sets it; the `mapreduce` tool then raises, for the manager's sake."""
        if settings.mcp is not None:  # read and checked here; its servers start with the run
            from amapreduce.agents.mcp_config import check_mcp_config

            check_mcp_config(settings.mcp)
        self.trace: Trace = NullTrace()
        self._wide_extra: dict[str, Any] | None = None
        self._ledger = Ledger()
        self._stack = contextlib.ExitStack()
        self._run: ActiveRun | None = None
        self._parts: RunParts | None = None
        self._progress: RunProgress | None = None
        self.prior: Prior | None = None
        self._prior_provider: PriorProvider = options.prior_provider or NoPrior()

    def _build_models(self, meter: UsageMeter) -> dict[str, ManagedModel]:
        """The run's role models, built once; their trace and retry handler are attached when it opens."""
        return build_models(self.settings, self.roles, meter=meter, inner=self.options.inner,
                            factory=self.model_factory)

    # -- open and close ---------------------------------------------------------------------------

    def __enter__(self) -> Session:
        try:
            self._open()
        except BaseException as exc:
            self._stack.close()
            if isinstance(exc, UserError) and self._resuming is None and self._run is not None:
                self._run.run_dir.discard()  # refused while setting up (an MCP server that will not start): exit 2, no folder
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Close the run; one left unfinished without an error is finished first, so every run
        directory records how its run ended (`result.json`); one that raised records the failure."""
        try:
            if exc is None and self._run is not None and not self._run.finished:
                self.finish()
        except BaseException as error:
            self._stack.__exit__(type(error), error, error.__traceback__)
            raise
        self._stack.__exit__(exc_type, exc, tb)

    def _open(self) -> None:
        settings, options = self.settings, self.options
        if self._attach and options.executor is not None:  # before the directory: an unreachable cluster is a usage error
            self.meter = self._stack.enter_context(options.executor.attach(self.meter))
            self.models = self._build_models(self.meter)
        if self._resuming is not None:
            path, saved = self._resuming
            run = self._stack.enter_context(resume_run(path, saved, settings, meter=self.meter,
                                                                roles=self.model_factory.roles))
        else:
            run = self._stack.enter_context(start_run(settings, kind=options.kind, query=options.query,
                                                      meter=self.meter, task_id=options.task_id, trial=options.trial))
        self._run, self.trace = run, run.run_dir.trace
        progress = self._stack.enter_context(RunProgress(self.meter, enabled=options.show_progress,
                                                         sink=options.on_progress))
        self._progress = progress
        if options.on_progress is not None:
            path = run.run_dir.path
            options.on_progress(ProgressEvent(kind="started", phase="starting", done=0, total=0,
                                              data={"run": path.name, "run_dir": str(path)}))
        for model in self.models.values():
            model.trace, model.on_retry = self.trace, progress.on_provider_retry
        parts = build_parts(
            settings, models=self.models, trace=self.trace, progress=progress, web_tools=options.web_tools,
            search=self._search, decisions_by="manager" if "manager" in self.roles else "user",
            merge_cache=run.run_dir.path / MERGE_CACHE_DIR, solver=options.solver,
        )
        self._stack.callback(parts.close)  # MCP sessions and server processes end with the run
        self._parts = parts
        if options.prior_provider is None and options.memory_store is not None:
            from amapreduce.memory import ExperientialMemory

            memory = ExperientialMemory(options.memory_store, model=self.models.get("memory"), readonly=True)
            self._stack.callback(memory.close)
            self._prior_provider = memory

    @property
    def run_dir(self) -> Path:
        """The run directory (once open)."""
        return self._active.run_dir.path

    @property
    def _active(self) -> ActiveRun:
        if self._run is None:
            raise RuntimeError("the session is not open: use `with Session(...) as session:`")
        return self._run

    @property
    def progress(self) -> RunProgress:
        """The run's live progress (once open): stage, batches, retries, provider retries."""
        if self._progress is None:
            raise RuntimeError("the session is not open: use `with Session(...) as session:`")
        return self._progress

    @property
    def parts(self) -> RunParts:
        """The run's connected parts (once open)."""
        if self._parts is None:
            raise RuntimeError("the session is not open: use `with Session(...) as session:`")
        return self._parts

    # -- the `mapreduce` tool's side (`agents.mapreduce_tool.ToolSession`) ------------------------

    def plan_of(self, decision: Decision) -> BatchPlan:
        """The plan a plan stage shows: the decision's own, or for a discovery its map's (the fill
        is planned once the entities are known). Raises `DecisionError` over the batch cap."""
        from amapreduce.mapreduce.batching import plan_batches
        from amapreduce.mapreduce.discover import discovery_plan

        cap = self.parts.engine.config.max_batches
        if decision.discover is not None:
            return discovery_plan(decision.discover, max_batches=cap)
        return plan_batches(decision, max_batches=cap)

    def admit(self, decision: Decision) -> tuple[Literal["plan", "execute"], tuple[str, str] | None]:
        """Count one `mapreduce` call of `decision`: its stage (the first call of an `ask` is the
        plan stage; a resumed run has none), and (reason, message) when the guards refuse it."""
        return self._ledger.admit(decision, cap=self.settings.max_tool_calls, plan_stage=self._resuming is None)

    def prior_for(self, decision: Decision) -> Prior:
        """The plan stage's experiential prior Δ_q for `decision` (kept for `finish`).

        Raises:
            AmapreduceError: the memory failed (the tool tells the manager so).
        """
        request = PriorRequest(query=self.options.query or decision.template, decision=decision,
                               task_id=self.options.task_id)
        self.prior = self._prior_provider.prior(request)
        return self.prior

    def advised(self, decision: Decision, use_advice: bool | None) -> Decision:
        """The decision an execute call runs: `decision` with the plan stage's proposal Θ′ applied
        (strategy and size; `memory.advice.apply_choice`) when the manager accepted it
        (`use_advice: true`), or when `AMAPREDUCE_MEMORY_ADVICE=apply` and the manager did not
        decline (`use_advice: false`). What was applied, and by whom, is traced and kept in the
        prior's `advice_used` (result.json, the memory's record).

        Raises:
            DecisionError: `use_advice: true` with no proposal to apply.
        """
        from amapreduce.errors import DecisionError
        from amapreduce.memory.advice import apply_choice

        prior = self.prior
        proposal = (prior.advice or {}).get("proposal") if prior is not None else None
        wanted = use_advice if use_advice is not None else self.settings.memory_advice == "apply"
        if not wanted:
            return decision
        if prior is None or not isinstance(proposal, dict):
            if use_advice:
                raise DecisionError("use_advice: the plan stage proposed no revision for this decision (its "
                                    "`memory_advice.proposal` is null); call mapreduce again without use_advice.")
            return decision
        revised = apply_choice(decision, str(proposal["strategy"]), proposal.get("batch_size"))
        used = {"by": "manager" if use_advice else "plan_stage", "strategy": proposal["strategy"],
                "batch_size": proposal.get("batch_size")}
        if prior.advice_used is None:
            self.prior = dataclasses.replace(prior, details={**prior.details, "advice_used": used})
            self.trace.write("advice_applied", **used)
        return revised

    def advice_mode(self) -> str:
        """`suggest` or `apply` (`AMAPREDUCE_MEMORY_ADVICE`)."""
        return self.settings.memory_advice

    # -- executing --------------------------------------------------------------------------------

    def execute(self, decision: Decision, plan: BatchPlan | None = None) -> tuple[MapReduceResult, int]:
        """Run `decision` (journaled) and merge its rows into the run's table; return its result and
        the table's rows. A composed decision (`discover`, `child`) plans its parts as they run, so
        `plan` is not used for it; a plain one without a plan is planned here. With an executor, a
        plain plan of more batches than one chunk runs in chunks there.

        An execution that stopped early (budget, cancel, Ctrl-C) is returned like any other, its
        rows merged, its `ending` saying why, and kept as the run's `stopped`; an estimate-only
        `ask` returns an empty result ended `stopped: estimate only` before any sub-agent is called.
        """
        from amapreduce.mapreduce.batching import plan_batches
        from amapreduce.mapreduce.compose import execute_decision

        parts, composed = self.parts, decision.composed
        if plan is None and not composed:
            plan = plan_batches(decision, max_batches=parts.engine.config.max_batches)
        if self.options.kind.is_ask and self._resuming is None:
            estimated = self._before_fan_out(decision, None if composed else plan)
            if estimated is not None:
                return self._ended(estimated), len(self._ledger.table) if self._ledger.table is not None else 0
        self._keep(decision, None if composed else plan)
        executor = self.options.executor
        if executor is not None and plan is not None and not composed and len(plan.batches) > (
                size := executor.chunk_batches(self.settings)):
            elsewhere = executor.run_wide(decision, plan, self.settings, meter=self.meter, trace=self.trace,
                                          size=size).result
            return self._ended(elsewhere), self._accumulate(decision, elsewhere)
        window = parts.context_window() if decision.discover is not None else None
        result = execute_decision(parts.engine, decision, plan=None if composed else plan,
                                  checkpoint=self._active.checkpoint, merger=parts.merger, context_window=window)
        return self._ended(result), self._accumulate(decision, result)  # a stopped run keeps its rows too

    def _ended(self, result: MapReduceResult) -> MapReduceResult:
        """`result`, its ending kept as the run's when it is the first execution to end early."""
        if result.ending.status.ended_early:
            with self._stop_lock:
                if self.stopped is None:
                    self.stopped = result.ending
        return result

    def _before_fan_out(self, decision: Decision, plan: BatchPlan | None) -> MapReduceResult | None:
        """An `ask`'s check before a decision of the manager fans out: an estimate-only run stops
        here with the estimate; a fan-out whose estimate's low end, with what the run spent, is over
        the cost budget is refused (`EstimateOverBudget`, a budget stop: exit 4). A composed
        decision is estimated by its known batches (a discovery's map), and not checked. An
        evaluation's trial is not checked either: its budget is what is left of the evaluation's,
        which `eval run` keeps (it stops starting trials). Returns the estimate-only run's empty
        result (ended `stopped: estimate only`), None when the decision fans out."""
        options, settings = self.options, self.settings
        checked = settings.max_cost_usd is not None and plan is not None and options.kind is not RunKind.EVAL
        if not options.estimate_only and not checked:
            return None
        shown = plan if plan is not None else self.plan_of(decision)
        estimate = estimate_for(settings, shown, decision.template, prices=self.meter.prices,
                                roles=self.model_factory.roles, engine=self.parts.engine.config)
        if options.estimate_only:
            part = ("; the discovery's map only: the fill is planned once the entities are found"
                    if decision.discover is not None else "; the decision's own batches, not its children's"
                    if decision.child is not None else "")
            self.estimate = dataclasses.replace(estimate, source=estimate.source + part)
            return MapReduceResult.empty(self.parts.engine.config.table_for(decision), decision, shown, ESTIMATE_ONLY)
        check_budget(estimate, settings.max_cost_usd, spent_usd=self.meter.cost_usd() or 0.0)
        return None

    def _keep(self, decision: Decision, plan: BatchPlan | None) -> None:
        """An `ask` keeps the decisions it executes for a resume (`Ledger.keep`, `executed.json`)."""
        if self.options.kind.is_ask and self._resuming is None:
            self._ledger.keep(decision, plan, self._active.run_dir.path / EXECUTED_FILE,
                              always=self.options.executor is not None)

    def _accumulate(self, decision: Decision, result: MapReduceResult) -> int:
        """Record an execution and merge its rows into the run's one table; the table's rows."""
        return self._ledger.record(decision, result, self.parts.engine.config.table_for)

    # -- the flows --------------------------------------------------------------------------------

    def ask(self) -> RunOutcome:
        """Answer the session's question: the manager with the `mapreduce` tool, then `finish`.

        A manager model that cannot call tools (its endpoint's probe found no `tool_choice` that
        works, or `tool_choice=off`) would never get past its first step: the planner
        (`agents.planner`) writes its decision in one structured call instead, and runs it through
        the same `mapreduce` tool."""
        from smolagents.utils import AgentError

        from amapreduce.agents.manager import build_manager
        from amapreduce.agents.mapreduce_tool import MapReduceTool
        from amapreduce.agents.planner import planner_reason
        from amapreduce.agents.tool_calls import record_tool_calls

        why = planner_reason(self.models["manager"].capabilities, self.settings.tool_choice)
        if why is not None:
            return self._ask_planned(why)
        parts, answer = self.parts, None
        manager = build_manager(self.models["manager"],
                                [*parts.manager_tools, record_tool_calls(MapReduceTool(self))],
                                max_steps=self.settings.manager_max_steps, max_batches=self.settings.max_batches,
                                trace=self.trace)
        self.progress.set_stage("manager")
        try:
            answer = manager.run(self.options.query)
        except AgentError as exc:  # an execution that stopped (the tool raised), or a model's or web tool's stop
            return self.finish(stopped=self.stopped or _error_ending(exc))
        except KeyboardInterrupt:
            self.finish(stopped=INTERRUPTED)
            raise
        return self.finish(answer=answer)

    def _ask_planned(self, why: str) -> RunOutcome:
        """`ask` through the planner (see `ask`): scouting in code, one structured call (a retry when
        its reply is unusable), then the decision through the `mapreduce` tool. A model that could
        not write a valid decision ends the run `failed` with `agents.planner.CANNOT_PLAN`; a stop
        (budget, outage, cancel) or a model call that failed for good ends it as the manager's would."""
        from amapreduce.agents.planner import Planner
        from amapreduce.llm.retry import ModelCallError

        self.trace.write("manager", mode="planner", why=why)
        planner = Planner(self.models["manager"], web_tools=self.parts.web_tools, max_batches=self.settings.max_batches,
                          trace=self.trace, crawl_chars=self.settings.crawl_max_chars)
        stops: tuple[type[Exception], ...] = (RunCancelled, ModelCallError, *RUN_STOPPING_ERRORS)
        self.progress.set_stage("manager")
        try:
            planned = planner.run(self.options.query, self)
        except stops as exc:  # the tool's `RunCancelled` when an execution stopped (`stopped`), or a model's stop
            return self.finish(stopped=self.stopped or _error_ending(exc))
        except KeyboardInterrupt:
            self.finish(stopped=INTERRUPTED)
            raise
        if planned.failure is not None:
            return self.finish(stopped=RunEnding(RunStatus.FAILED, planned.failure))
        return self.finish(answer=planned.answer)

    def run(self, decision: Decision | None = None, plan: BatchPlan | None = None) -> RunOutcome:
        """Execute `decision` (default: `RunOptions.decision`, on the plan checked in pre-flight) and
        `finish`; a composed one is kept in `decision.json` for a resume. A plain decision wider than
        one chunk of the session's executor runs there in chunks (`run_wide`). A stop (budget,
        cancel) keeps the partial table; Ctrl-C too, and re-raises."""
        if decision is None:
            if self.options.decision is None:
                raise ValueError("no decision to run: pass one, or give RunOptions.decision")
            decision, plan = self.options.decision, self._plan
            if self._wide and self.options.executor is not None and plan is not None:
                return self.run_wide(decision, plan, self.options.executor)
        if decision.composed and self._resuming is None:
            write_json(self._active.run_dir.path / DECISION_FILE, decision.model_dump(mode="json"))
        try:
            self.execute(decision, plan)  # a stopped execution's rows are in the table; `finish` records how it ended
        except KeyboardInterrupt:
            self.finish(stopped=INTERRUPTED)
            raise
        return self.finish()

    def replay(self, executions: list[tuple[Decision, BatchPlan | None]]) -> RunOutcome:
        """Run a killed `ask`'s executed decisions again, without its manager, and `finish`."""
        try:
            for decision, plan in executions:
                result, _ = self.execute(decision, plan)
                if result.ending.status.ended_early:
                    break
        except KeyboardInterrupt:
            self.finish(stopped=INTERRUPTED)
            raise
        return self.finish(stopped=self.stopped)

    # -- finishing --------------------------------------------------------------------------------

    def finish(self, *, answer: Any = None, stopped: RunEnding | None = None) -> RunOutcome:
        """Record how the run ended (`result.json`, `table.md`, `table.csv`) and hand back its outcome.

        An `ask`'s table is every execution's rows reduced into one, measured against every
        decision it executed; a `mapreduce run`'s is its one execution's, as the engine ended it.
        """
        run, ledger, options = self._active, self._ledger, self.options
        if not options.kind.is_ask and len(ledger.results) == 1:
            (result,) = ledger.results
            table, completeness, ending = result.table, result.summary.completeness, stopped or result.ending
            markdown = result.markdown()
        else:
            table = ledger.table if ledger.table is not None else Table(["answer"], ["answer"])
            completeness = Completeness.of(table, ledger.filled)
            ending = stopped or RunEnding(completeness.status if len(table) else RunStatus.NO_TABLE)
            markdown = to_markdown(table) if len(table) else str(answer or "")
        summaries = [r.summary for r in ledger.results]
        record = run.finish(
            table, completeness_record(completeness, summaries, **(
                {"mapreduce_calls": ledger.calls} if options.kind.is_ask else {})),
            ending=ending, executions=[s.timings for s in summaries], extra=self._extra(answer),
        )
        return RunOutcome(
            kind=run.kind, query=run.query, table=table, markdown=markdown, ending=ending, completeness=completeness,
            run_dir=run.run_dir, meter=self.meter, record=record, decisions=list(ledger.decisions),
            results=list(ledger.results), prior=self.prior, task_id=options.task_id,
            answer=None if answer is None else str(answer), estimate=self.estimate,
        )

    def _extra(self, answer: Any) -> dict[str, Any]:
        """The kind-specific fields of `result.json`."""
        ledger, web = self._ledger, self.parts.web_usage()
        discoveries = [r.discovery.to_json() for r in ledger.results if r.discovery is not None]
        if not self.options.kind.is_ask:
            decision = ledger.decisions[0].model_dump(mode="json") if ledger.decisions else None
            planned = {"prior": p.to_json()} if (p := self.prior) else {}
            if self._wide_extra is not None:
                return {"decision": decision, **self._wide_extra, **planned}
            return {"decision": decision, "web": web, **({"discovery": discoveries[0]} if discoveries else {}),
                    **planned}
        prior = self.prior
        return {
            "task_id": self.options.task_id,
            "manager_answer": None if answer is None else str(answer),
            "decisions": [d.model_dump(mode="json") for d in ledger.decisions],
            # one `DiscoverySummary` per executed decision that discovered its matrix (none: no key)
            **({"discoveries": discoveries} if discoveries else {}),
            "prior": None if prior is None else prior.to_json(),
            "web": web,
            **({"estimate": self.estimate.to_json()} if self.estimate is not None else {}),
        }

    def run_wide(self, decision: Decision, plan: BatchPlan, executor: Executor, *,
                 saved: RunJournal | None = None) -> RunOutcome:
        """A `mapreduce run` of `decision`'s whole `plan` in chunks on `executor`, journaled in the
        run's journal (`saved`: the journal of the run resumed), and `finish`."""
        wide = executor.run_wide(decision, plan, self.settings, meter=self.meter, trace=self.trace,
                                 journal=self._active.journal, saved=saved.entries if saved is not None else ())
        self._ledger.record(decision, wide.result, None)
        self._wide_extra = {"web": wide.web, "executor": {"kind": executor.spec.kind, "chunks": wide.chunks,
                                                          "finished": wide.finished}}
        return self.finish()


def _decision_plan(decision: Decision, settings: Settings,
                   executor: Executor | None) -> tuple[BatchPlan | None, bool]:
    """A `mapreduce run`'s plan, checked before anything is made: (plan, whether it runs in chunks
    on `executor`). The decision is the user's, so the plan is capped only when the settings set
    `max_batches` (`Settings.batch_cap`); a plain plan wider than one chunk of an executor is not
    capped (it runs in chunks). A composed decision plans its parts as they run (None); a
    discovery's map plan is checked here.

    Raises:
        DecisionError: the plan (a discovery's: its map's) is larger than the cap.
    """
    from amapreduce.mapreduce.batching import plan_batches
    from amapreduce.mapreduce.discover import discovery_plan

    if executor is not None and not decision.composed:
        whole = plan_batches(decision, max_batches=None)
        if len(whole.batches) > executor.chunk_batches(settings):
            return whole, True
    cap = settings.batch_cap("user")
    if decision.discover is not None:
        discovery_plan(decision.discover, max_batches=cap)  # the fill and children are planned as they run
    return (None if decision.composed else plan_batches(decision, max_batches=cap)), False


def _default_roles(options: RunOptions) -> tuple[str, ...]:
    """The roles a run builds a model for: the manager's only for an `ask`, the memory's only with a store."""
    manager = ("manager",) if options.kind.is_ask else ()
    plans = options.kind.is_ask or options.kind is RunKind.ENRICH  # the runs with a plan stage
    memory = ("memory",) if plans and options.memory_store is not None else ()
    return (*manager, "subagent", "extraction", *memory)
