"""The MapReduce engine: run a decision's batches on fresh sub-agents, reduce in code, patch.

Each `run` call owns its state (an `EngineRun` of `mapreduce.run_state`: slots, attempts in flight, finished queue, stop
reason), so runs sharing an engine are independent; one loop in the calling thread owns the
run's tables (no locks around them): it keeps at most `workers` attempts in flight on the executor, merges each reply as it completes (completion
order), retries a batch with a continuation prompt that names exactly what is missing
(results of earlier attempts are kept), abandons attempts that pass their deadline, and
finally reduces the per-task tables into one table in matrix order. Then Algorithm 1's delta
patch runs bounded rounds over only the rows and cells still missing. A budget stop (or any
of `RUN_STOPPING_ERRORS`) ends only the run whose attempt raised it.

What happens in a run is reported once, as typed events (`mapreduce.events`) on the engine's
`events` stream: the trace, the progress sink, the run's journal and the phase's OpenTelemetry batch
spans are subscribers, so one settled attempt is one `AttemptSettled`, not four calls. A run that
stops early (`cancel()`, a spent budget, a provider down, Ctrl-C) returns its result like any
other, its `ending` saying why: nothing here raises a stop.

With a `Checkpoint` (`mapreduce.checkpoint`), every settled attempt is journaled before its batch
counts as done, and a run resumed over a journal replays the saved attempts' rows and runs only
the batches not done. With OpenTelemetry on (`telemetry`), each phase, batch and attempt is a span; a
batch's span is current while its attempts are submitted, and the executor carries it to their threads.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from amapreduce import telemetry
from amapreduce.decision.model import Decision
from amapreduce.errors import BatchTimeout
from amapreduce.events import EventStream, trace_channel
from amapreduce.llm.scope import UsageScope, usage_scope
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.backup import BackupGate, BackupPolicy, Stragglers
from amapreduce.mapreduce.batching import BatchPlan, plan_batches
from amapreduce.mapreduce.checkpoint import Checkpoint, ExecutionCheckpoint, MergedRow
from amapreduce.mapreduce.concurrency import AUTO_MAX_WORKERS, AdaptiveWorkers
from amapreduce.mapreduce.events import (
    AttemptSettled,
    AttemptStarted,
    BackupStarted,
    BatchDone,
    EngineRunEnded,
    EngineRunStarted,
    PatchRound,
    PhaseStarted,
    WorkersChanged,
    journal_channel,
    progress_channel,
    telemetry_channel,
)
from amapreduce.mapreduce.evidence import recording, with_evidence
from amapreduce.mapreduce.executor import Executor, ThreadExecutor
from amapreduce.mapreduce.patch import build_patch
from amapreduce.mapreduce.replies import parse_reply, project_row
from amapreduce.mapreduce.result import (
    CANCELLED,
    INTERRUPTED,
    RUN_STOPPING_ERRORS,
    SUPERSEDED,
    AttemptRecord,
    MapReduceResult,
    RunEnding,
    RunSummary,
    stop_ending,
)
from amapreduce.mapreduce.run_state import POLL_S, AttemptNotStarted, BatchJob, BatchState, EngineRun
from amapreduce.mapreduce.solver import BatchRequest, BatchSolver, SolverReply, reply_tokens
from amapreduce.mapreduce.work import MATRIX_SOURCE, WorkBatch, WorkItem, assign_rows, item_gaps
from amapreduce.progress import ProgressEvent
from amapreduce.prompts import render_prompt
from amapreduce.settings import DecisionAuthor, Settings, VerifyMode, default_setting
from amapreduce.table.table import DEFAULT_MISSING_MARKERS, Table
from amapreduce.trace import NullTrace, Trace, redact_secrets

__all__ = ["EngineConfig", "MapReduceEngine"]


class EngineConfig(BaseModel):
    """Engine limits. The defaults are `Settings`' (the paper's: 2 retries, 2 patch rounds, 50
    batches); a run builds its config with `from_settings`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=default_setting("workers"), ge=1)
    """Attempts in flight at once."""
    max_attempts: int = Field(default=default_setting("max_attempts"), ge=1)
    """Attempts per batch: the first plus retries."""
    batch_timeout_s: float = Field(default=default_setting("batch_timeout_s"), gt=0)
    """Deadline of one attempt, from its start."""
    patch_rounds: int = Field(default=default_setting("patch_rounds"), ge=0)
    max_batches: int | None = Field(default=default_setting("max_batches"), ge=1)
    """Largest batch plan accepted for the map (None: no cap)."""
    threads: int | None = Field(default=None, ge=1)
    """Executor threads (default: `workers` plus headroom for abandoned attempts)."""
    missing_markers: frozenset[str] = DEFAULT_MISSING_MARKERS
    verify: VerifyMode = default_setting("verify")
    """How cells' quotes are checked (`Settings.verify`; `strict`: `unverified` counts as missing)."""
    backup: BackupPolicy = BackupPolicy()
    """When a straggling attempt gets a backup (`mapreduce.backup`; `Settings.backup`, `backup_max_extra`)."""
    adaptive: bool = False
    """Adapt the attempts in flight to the server (`mapreduce.concurrency`), up to `workers`."""

    def table_for(self, decision: Decision) -> Table:
        """The empty table `decision`'s rows reduce into: its columns and key columns, its typed columns'
        canonical forms, these missing markers, and with `verify` `strict` an `unverified` cell counted
        missing. The one place a table for a decision is built (the engine, composed runs, a run's
        session, Ray's merge)."""
        return Table(decision.columns, decision.resolved_key_columns, missing_markers=self.missing_markers,
                     strict_evidence=self.verify == "strict", normalizers=decision.normalizers)

    @classmethod
    def from_settings(cls, settings: Settings, *, decisions_by: DecisionAuthor, slots: int | None = None) -> EngineConfig:
        """The limits `settings` give an engine whose decisions are written by `decisions_by`
        (the batch cap depends on it: see `Settings.batch_cap`). With `workers_auto`, the server's
        `slots` when it reports them, else an adapted number up to `AUTO_MAX_WORKERS`."""
        workers, adaptive = ((slots, False) if slots is not None else (AUTO_MAX_WORKERS, True)) if settings.workers_auto \
            else (settings.workers, False)
        return cls(workers=workers, adaptive=adaptive, max_attempts=settings.max_attempts,
                   batch_timeout_s=settings.batch_timeout_s, patch_rounds=settings.patch_rounds,
                   max_batches=settings.batch_cap(decisions_by), verify=settings.verify,
                   backup=BackupPolicy(mode=settings.backup, max_extra=settings.backup_max_extra))


class MapReduceEngine:
    """Runs decisions through a `BatchSolver`.

    The engine holds configuration and collaborators only; each `run` call keeps its own state,
    so one engine may run several decisions at once.

    Args:
        solver: makes one fresh sub-agent attempt per call.
        config: limits; see `EngineConfig`.
        executor: where attempts run (default: a thread pool per run, sized from the config). A
            given executor is shut down when a run using it is stopped.
        trace: receives every phase, attempt (prompt, raw output, rows, timing, usage) and summary
            (`events.trace_channel`; `engine.trace` may be replaced later).
        progress: called in the engine's thread on each event (`mapreduce.events.progress_channel`).
        backup_gate: asked before a straggler's backup starts whether one more attempt of the
            usual usage may start now (the provider's limiter, breaker and the run's budget:
            `llm.models.ManagedModel.has_room_for`); None: only the engine's own rules apply.
    """

    def __init__(
        self,
        solver: BatchSolver,
        *,
        config: EngineConfig | None = None,
        executor: Executor | None = None,
        trace: Trace | None = None,
        progress: Callable[[ProgressEvent], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        backup_gate: BackupGate | None = None,
    ) -> None:
        self.solver = solver
        self._backup_gate = backup_gate
        self.config = config or EngineConfig()
        self._executor = executor
        self.events = EventStream()
        """Every engine event (`mapreduce.events`) of every run, emitted once; the trace and the
        progress sink are its subscribers, and anyone may subscribe more."""
        self._untrace: Callable[[], None] = lambda: None
        self.trace = trace or NullTrace()
        if progress is not None:
            progress_channel(self.events, progress)
        self._clock = clock
        self._runs_lock = threading.Lock()
        self._runs: set[EngineRun] = set()
        self.concurrency = (AdaptiveWorkers(self.config.workers, clock=clock, on_change=lambda was, now, why: self.events.emit(
            WorkersChanged(workers=now, previous=was, why=why))) if self.config.adaptive else None)
        """The adapted limit of attempts in flight (`EngineConfig.adaptive`), shared by this engine's runs."""
        self.cancels = 0
        """How many times `cancel` was called: a composed run (`compose`) that runs several
        decisions one after another checks it between them, since a cancel with no run in flight
        reaches none."""

    @property
    def trace(self) -> Trace:
        """Where the engine's traced events are written (a subscriber of `events`)."""
        return self._trace

    @trace.setter
    def trace(self, trace: Trace) -> None:
        self._untrace()
        self._trace = trace
        self._untrace = trace_channel(self.events, trace)

    def cancel(self) -> None:
        """Stop the runs in flight soon (thread-safe); each `run` then returns its result so far,
        ended `stopped: cancelled`. A later `run` starts afresh."""
        with self._runs_lock:
            self.cancels += 1
            runs = list(self._runs)
        for run in runs:
            run.stop(CANCELLED)

    def run(
        self, decision: Decision, *, plan: BatchPlan | None = None, checkpoint: Checkpoint | None = None
    ) -> MapReduceResult:
        """Execute `decision`: map, reduce, then delta-patch rounds; return the result, whose
        `ending` says how the run ended: complete or incomplete, or stopped early (`cancel()` was
        called, an attempt raised one of `RUN_STOPPING_ERRORS`, Ctrl-C was pressed) with the rows
        found so far. A stop is a result, not an exception.

        Args:
            decision: the validated decision Θ.
            plan: its batch plan, when the caller already made it (the `mapreduce` tool plans
                once, to show it and to run it); default: planned here under `max_batches`.
            checkpoint: the run's journal: the execution and every settled attempt are recorded
                there; when it holds a saved execution of `decision`, that one is continued (its
                merged rows replayed, its finished batches not run again).

        Raises:
            DecisionError: the batch plan exceeds `max_batches`.
            UserError: `checkpoint` holds this decision with another batch plan.
        """
        cfg = self.config
        start = self._clock()
        plan = plan if plan is not None else plan_batches(decision, max_batches=cfg.max_batches)
        tables = {i: cfg.table_for(decision) for i in range(len(decision.task_matrix))}
        forced_cols = set(decision.forced_values(0))
        one_row, names = decision.one_row_per_task, decision.columns
        wanted = tuple(c for c in names if c not in forced_cols)
        items = [WorkItem(task_index=i, text=decision.task_text(i), forced=decision.forced_values(i), columns=wanted,
                          single_row=one_row, expected_rows=decision.rows_per_task) for i in tables]
        if one_row:  # the matrix fixes each task's one row: it exists before any answer
            for item in items:
                tables[item.task_index].upsert(item.forced, task_index=item.task_index,
                                               sources=dict.fromkeys(item.forced, MATRIX_SOURCE))
        work = [WorkBatch(batch=b, items=tuple(items[i] for i in b.indices), column_specs=decision.column_specs) for b in plan.batches]
        events = self.events.scoped()  # this run's: its journal subscribes here
        events.emit(EngineRunStarted(num_rows=len(items), strategy=plan.strategy, batches=tuple(b.manifest() for b in plan.batches)))
        execution = checkpoint.begin(decision, plan) if checkpoint is not None else None
        if execution is not None:
            journal_channel(events, execution)
        records: list[AttemptRecord] = []
        run = EngineRun(cfg.workers, batch_timeout_s=cfg.batch_timeout_s, clock=self._clock,
                        stragglers=Stragglers(cfg.backup, self._backup_gate, workers=cfg.workers),
                        limit=None if (adapted := self.concurrency) is None else (lambda: adapted.limit))
        with self._runs_lock:
            self._runs.add(run)
        executor = self._executor or ThreadExecutor(cfg.threads or cfg.workers + max(2, cfg.workers // 4))
        rounds_run, batches_run, timings = 0, len(work), {"map_s": 0.0, "patch_s": 0.0}
        table: Table | None = None
        try:
            with telemetry.span("amapreduce.map", telemetry.ours(batches=len(work), tasks=len(items))):
                self._run_phase(run, "map", work, decision, tables, records, executor, execution, events)
            timings["map_s"] = self._clock() - start
            table = self._reduce(decision, tables) if run.ending is None else None
            for round_no in range(1, cfg.patch_rounds + 1):
                patch = build_patch(decision, table, tables, round_no) if table is not None and run.ending is None else None
                if not patch:
                    break
                rounds_run, batches_run = round_no, batches_run + len(patch)
                events.emit(PatchRound(round=round_no, batches=tuple(w.batch.manifest() for w in patch)))
                with telemetry.span("amapreduce.patch_round", telemetry.ours(round=round_no, batches=len(patch))):
                    self._run_phase(run, f"patch{round_no}", patch, decision, tables, records, executor, execution, events)
                table = self._reduce(decision, tables) if run.ending is None else None
            timings["patch_s"] = self._clock() - start - timings["map_s"]
        except KeyboardInterrupt:
            run.stop(INTERRUPTED)
        finally:
            with self._runs_lock:
                self._runs.discard(run)
            if self._executor is None or run.ending is not None:
                executor.shutdown(cancel=True)
        if run.ending is not None or table is None:
            table = self._reduce(decision, tables)
        timings["wall_s"] = self._clock() - start
        summary = RunSummary.of(table, decision, records, rounds=rounds_run, batches=batches_run, timings=timings)
        ending = run.ending or RunEnding(summary.completeness.status)
        result = MapReduceResult(table=table, summary=summary, plan=plan, attempts=tuple(records), ending=ending)
        events.emit(EngineRunEnded(summary=summary.to_json(), cancelled=result.cancelled, status=ending.label))
        return result

    # -- one phase (map or a patch round) ------------------------------------------------------

    def _run_phase(
        self,
        run: EngineRun,
        phase: str,
        work: list[WorkBatch],
        decision: Decision,
        tables: dict[int, Table],
        records: list[AttemptRecord],
        executor: Executor,
        execution: ExecutionCheckpoint | None,
        run_events: EventStream,
    ) -> None:
        cfg = self.config
        many = not decision.one_row_per_task
        pending: deque[BatchJob] = deque()
        saved = execution.replay(phase, [w.batch.batch_id for w in work], tables, records) if execution else {}
        done_batches, total = 0, len(work)
        run.stragglers.plan(total)
        for w in work:
            state = BatchState(
                work=w,
                prompt_vars={
                    "rationale": w.batch.rationale,
                    "shared_context": dict(w.batch.shared_context),
                    "columns": w.column_specs,
                    "rows_per_task": decision.rows_per_task if many and phase == "map" else None,
                    "many_rows": many and not all(i.single_row for i in w.items),
                },
            )
            last = saved.get(w.batch.batch_id)
            if last is None:
                pending.append(BatchJob(state=state, request=None))
                continue
            # A batch a previous process attempted: done, or continued like a retry.
            state.attempt = last.attempt
            state.first_prompt = self._first_prompt(run, state)
            follow = None if last.done else self._follow_up(state, last.error, tables)
            if follow is None:
                done_batches += 1
            else:
                pending.append(follow)
        events = run_events.scoped()  # this phase's: its batch spans subscribe here
        events.emit(PhaseStarted(phase=phase, done=done_batches, total=total))
        inflight: dict[Future[SolverReply], BatchJob] = {}
        batches = telemetry.SpanGroup("amapreduce.batch", key_attribute="amapreduce.batch_id")
        telemetry_channel(events, batches)
        finished: deque[tuple[BatchJob, SolverReply | None, BaseException | None]] = deque()
        try:
            self._submit(run, pending, inflight, executor, batches)
            while inflight and not run.stopping.is_set():
                for fut in run.finished(inflight, self._backup_due(run, inflight)):
                    job = inflight.pop(fut)
                    run.leave(job)
                    exc = fut.exception()
                    finished.append((job, None if exc else fut.result(), exc))
                now = self._clock()
                for job in run.overdue(now):
                    if job.future is not None:
                        inflight.pop(job.future, None)
                    run.abandon(job)  # its slot goes to the next attempt; a late result is ignored
                    executor.replace_stuck_thread()  # the hung thread must not starve queued attempts
                    finished.append((job, None, BatchTimeout(f"attempt ran past its {cfg.batch_timeout_s:g} s deadline")))
                while finished:
                    job, reply, exc = finished.popleft()  # a run-stopping error stopped the run in `_execute`
                    if isinstance(exc, AttemptNotStarted):  # the run stopped first: no attempt was made
                        continue
                    if job.superseded:  # its rival's reply won first: its usage is all that counts
                        self._record_superseded(run, job, phase, reply, records, events)
                        continue
                    rival = job.rival
                    follow, held = self._settle(run, job, phase, reply, exc, tables, records, events)
                    r = records[-1]
                    if held:  # it failed while its rival still runs: the batch waits for that one
                        continue
                    if rival is not None and rival.future in inflight:  # the loser: cancelled, no request after
                        inflight.pop(rival.future)
                        cut_short = rival.outcome is None
                        run.abandon(rival)
                        executor.replace_stuck_thread()
                        self._record_superseded(run, rival, phase, None, records, events, cut_short=cut_short)
                    if follow is not None:
                        self._submit(run, deque([follow]), inflight, executor, batches)
                    else:
                        done_batches += 1
                        events.emit(BatchDone(batch_id=r.batch_id, phase=phase, done=done_batches, total=total,
                                              attempts=r.attempt))
                self._start_backups(run, phase, inflight, executor, batches, events)
            if run.stopping.is_set():  # `cancel()`, or an attempt's run-stopping error: the phase ends here
                self._wind_down(run, phase, finished, inflight, tables, records, events)
        except KeyboardInterrupt:
            run.stop(INTERRUPTED)  # queued attempts waiting for a slot must not start after Ctrl-C
            self._wind_down(run, phase, finished, inflight, tables, records, events)
            raise
        finally:
            batches.end_all(telemetry.ours(status="stopped"))

    def _wind_down(self, run: EngineRun, phase: str,
                   finished: deque[tuple[BatchJob, SolverReply | None, BaseException | None]],
                   inflight: dict[Future[SolverReply], BatchJob], tables: dict[int, Table], records: list[AttemptRecord],
                   events: EventStream) -> None:
        """A stopped phase: settle the attempts that finished before the stop (their rows are kept
        and counted), cancel the ones still running."""
        for job, reply, error in finished:  # taken off the queue, not yet settled when the stop came
            if isinstance(error, AttemptNotStarted):
                continue  # no attempt: nothing was asked, nothing is journaled
            if job.superseded:
                self._record_superseded(run, job, phase, reply, records, events)
            else:
                self._settle(run, job, phase, reply, error, tables, records, events)
        finished.clear()
        for job in list(inflight.values()):
            if job.outcome is not None and not job.superseded:  # answered before the stop: keep (and count) its rows
                self._settle(run, job, phase, *job.outcome, tables, records, events)
            elif job.request is not None:
                job.request.cancel.set()

    def _submit(self, run: EngineRun, jobs: deque[BatchJob], inflight: dict[Future[SolverReply], BatchJob], executor: Executor,
                batches: telemetry.SpanGroup) -> None:
        """Hand attempts to the executor at once; each waits inside for one of the `workers`
        slots, so a freed slot is taken by a waiting thread without a round trip through this loop."""
        while jobs and not run.stopping.is_set():
            job = jobs.popleft()
            w = job.state.work
            with batches.opened(w.batch.batch_id, telemetry.ours(phase=w.phase, tasks=len(w.items))).activate():
                future = executor.submit(functools.partial(self._execute, run, job))
            job.future = future
            inflight[future] = job
            future.add_done_callback(run.done.put)

    def _backup_due(self, run: EngineRun, inflight: dict[Future[SolverReply], BatchJob]) -> float | None:
        """When the loop should wake to give a straggler its backup (None: no backup can start
        now — attempts wait for a slot, none is free, or the cap is spent)."""
        stragglers = run.stragglers
        with run.gate:
            running = [j for j in run.running if self._may_back_up(j)]
            busy = len(run.running)
        stragglers.waiting(len(inflight) > busy)
        if not stragglers.room() or len(inflight) > busy or busy >= run.workers:
            return None
        due = stragglers.due(self._clock(), (j.started_at for j in running if j.started_at is not None))
        return None if due is None else max(due, self._clock() + POLL_S)

    @staticmethod
    def _may_back_up(job: BatchJob) -> bool:
        """A running first copy of an attempt, with no backup yet."""
        return not job.backup and job.rival is None and not job.superseded and job.request is not None

    def _start_backups(self, run: EngineRun, phase: str, inflight: dict[Future[SolverReply], BatchJob], executor: Executor,
                       batches: telemetry.SpanGroup, events: EventStream) -> None:
        """Give each straggler a backup while a slot is free, no attempt waits for one, and the
        cap and the gate allow (`mapreduce.backup`); the longest-running stragglers first."""
        stragglers = run.stragglers
        if not stragglers.room() or run.stopping.is_set():
            return
        now = self._clock()
        with run.gate:
            busy = len(run.running)
            candidates = sorted((j for j in run.running if self._may_back_up(j) and j.started_at is not None),
                                key=lambda j: j.started_at or 0.0)
        free = run.workers - busy
        if len(inflight) > busy:  # attempts wait for a slot: real work goes first
            return
        for job in candidates:
            request = job.request
            if free <= 0 or request is None or not stragglers.is_straggler(now, job.started_at or now):
                break
            if job.future not in inflight:  # abandoned at its deadline
                continue
            if not stragglers.admit():
                break
            backup = BatchJob(state=job.state, request=dataclasses.replace(request, cancel=threading.Event()),
                              backup=True, rival=job)
            job.rival = backup
            free -= 1
            self._submit(run, deque([backup]), inflight, executor, batches)
            events.emit(BackupStarted(batch_id=job.state.work.batch.batch_id, phase=phase, attempt=job.state.attempt,
                                      running_s=round(now - (job.started_at or now), 6), threshold_s=stragglers.threshold_s))

    def _first_prompt(self, run: EngineRun, state: BatchState) -> str:
        """The batch prompt: the shared part (`prompts/mapreduce.yaml`, `batch`) is rendered once
        per distinct batch context (most batches of a phase share it), then the batch's numbered
        sub-questions follow it, one per line."""
        v = state.prompt_vars
        key = repr((v["rationale"], sorted(v["shared_context"].items()), v["columns"], v["rows_per_task"], v["many_rows"]))
        with run.prompt_lock:  # rendered once: a first wave of attempts must not all render it at once
            header = run.prompt_headers.get(key)
            if header is None:
                header = run.prompt_headers[key] = render_prompt("mapreduce", "batch", **v)
        tasks = "\n".join(f"{k}. {item.text}" for k, item in enumerate(state.work.items, 1))
        return f"{header}\n{tasks}"

    def _execute(self, run: EngineRun, job: BatchJob) -> SolverReply:
        while not run.slots.acquire(timeout=POLL_S):
            if run.stopping.is_set():
                raise AttemptNotStarted("the run stopped before the attempt started")
        job.holds_slot = True
        try:
            if run.stopping.is_set():
                raise AttemptNotStarted("the run stopped before the attempt started")
            if job.request is None:  # a first attempt renders its prompt here, off the engine's loop
                job.request = self._request(job.state, self._first_prompt(run, job.state))
            now = self._clock()
            request = dataclasses.replace(job.request, deadline=now + self.config.batch_timeout_s, clock=self._clock)
            job.request = request
            hedges = run.stragglers.extra if run.stragglers.enabled else None  # late calls may be hedged (`llm.hedge`)
            job.scope = UsageScope({"batch_id": request.batch_id, "attempt": request.attempt}, cancelled=request.expired,
                                   extra_calls=hedges, reply_tokens=reply_tokens(request))
            with run.gate:
                job.started_at = now
                run.running.add(job)
            self.events.emit(AttemptStarted(batch_id=request.batch_id, phase=job.state.work.phase, attempt=request.attempt,
                                            backup=job.backup))
            attempt = telemetry.ours(batch_id=request.batch_id, attempt=request.attempt, phase=job.state.work.phase)
            with usage_scope(job.scope), recording(job.pages), telemetry.span("amapreduce.attempt", attempt) as span:
                try:
                    reply = self.solver.solve(request)
                except Exception as exc:
                    job.outcome = (None, exc)
                    if isinstance(exc, RUN_STOPPING_ERRORS):  # stop before the slot is freed: no queued attempt starts
                        run.stop(stop_ending(exc))
                    raise
                span.set(telemetry.ours(steps=reply.steps, agent_state=reply.trace.get("state")))
            job.outcome = (reply, None)
            return reply
        finally:
            run.release(job)

    def _request(self, state: BatchState, prompt: str) -> BatchRequest:
        """The request of the batch's next attempt (the first prompt is kept for continuations)."""
        state.attempt += 1
        if state.attempt == 1:
            state.first_prompt = prompt
        w = state.work
        return BatchRequest(
            batch_id=w.batch.batch_id,
            attempt=state.attempt,
            prompt=prompt,
            tasks=tuple(item.text for item in w.items),
            column_specs=w.column_specs,
            rationale=w.batch.rationale, shared_context=dict(w.batch.shared_context),
            forced=tuple(dict(i.forced) for i in w.items),
            expected_rows=sum(1 if i.single_row else (i.expected_rows or 0) for i in w.items)
            if all(i.single_row or i.expected_rows for i in w.items) else 0,
        )

    def _settle(
        self,
        run: EngineRun,
        job: BatchJob,
        phase: str,
        reply: SolverReply | None,
        exc: BaseException | None,
        tables: dict[int, Table],
        records: list[AttemptRecord],
        events: EventStream,
    ) -> tuple[BatchJob | None, bool]:
        """Merge one finished attempt and journal it; return the retry job (None when the batch
        is done, or the run stops), and whether the batch is held for the attempt's rival: a
        straggler or its backup that failed while the other still runs leaves the batch to it
        (the first valid reply wins; a rival that replies validly makes the other `superseded`)."""
        state, items = job.state, job.state.work.items
        elapsed = self._clock() - (job.started_at or self._clock())
        names = [c.name for c in state.work.column_specs]
        rows, dropped, problem = 0, 0, None
        parsed_rows: list[dict[str, Any]] = []
        merged: list[MergedRow] = []
        outcome = "error"
        rival, job.rival = job.rival, None
        if exc is not None:
            outcome = "timeout" if isinstance(exc, BatchTimeout) else "error"
            problem = redact_secrets(f"{type(exc).__name__}: {exc}")  # quoted in the retry prompt and the journal
        elif reply is not None:
            parsed = parse_reply(reply.output)
            entities = {v: c for item in items for c, v in item.forced.items()}  # what the sub-questions are about
            projected = [with_evidence(project_row(obj, names), job.pages, self.config.verify, entities)
                         for obj in parsed.rows]
            if self.trace.enabled:
                parsed_rows = [{**p.values, "task": p.task, "source": p.source} for p in projected]
            rows = len(projected)
            by_number, dropped = assign_rows(projected, items)
            for number, answer in by_number.items():
                item = items[number - 1]
                for row in answer:
                    merged.append(MergedRow.of(item, row))
                    dropped += not merged[-1].apply(tables)  # a row with no usable key is not placed
            outcome = "ok" if parsed.error is None else "parse_error"
            if parsed.truncated:  # only its closed rows were kept; cut values stay missing
                problem = "the reply was cut off before its end, so only its complete rows were kept"
            elif parsed.error is not None:
                problem = f"the reply was not a JSON array of rows ({parsed.error})"
        # What the meter charged the sub-agent model for this attempt, failed ones included; a
        # solver whose model is not metered (scripted tests) reports its own usage.
        metered = job.scope.usage("subagent") if job.scope is not None else Usage()
        usage = metered if metered.requests else reply.usage if reply is not None else Usage()
        held = rival is not None and outcome != "ok"
        if rival is not None:
            rival.rival = None
            rival.superseded = not held
            if held:  # the other copy goes on alone, doing what a retry would: no extra call
                run.stragglers.settled(0)
        if reply is not None:
            run.stragglers.finished(elapsed, usage)
        record = AttemptRecord(
            batch_id=state.work.batch.batch_id, phase=phase, attempt=state.attempt, outcome=outcome,
            elapsed_s=round(elapsed, 6), rows=rows, dropped_rows=dropped, error=problem, usage=usage, backup=job.backup,
        )
        records.append(record)
        if self.concurrency is not None:  # the adapted limit learns from every settled attempt
            self.concurrency.settled(outcome)
        follow = None if held else self._follow_up(state, problem, tables)
        # The one report of this attempt: the trace, progress, journal (on disk before the batch
        # counts as done) and telemetry are subscribers of it.
        events.emit(self._settled(job, record, reply, parsed_rows, merged=tuple(merged), done=not held and follow is None))
        return (None if run.stopping.is_set() else follow), held

    def _record_superseded(self, run: EngineRun, job: BatchJob, phase: str, reply: SolverReply | None,
                           records: list[AttemptRecord], events: EventStream, *, cut_short: bool = False) -> None:
        """Record the loser of a straggler and its backup: cancelled (or too late), its rows not
        merged, its usage (what its calls were charged until now) still counted and journaled.
        Its calls are what the backup cost (`Stragglers.settled`), one more when it was cancelled
        mid-run (`cut_short`): the call it had in flight was sent, though not yet charged."""
        metered = job.scope.usage("subagent") if job.scope is not None else Usage()
        usage = metered if metered.requests else reply.usage if reply is not None else Usage()
        run.stragglers.settled(usage.requests + (1 if cut_short else 0))
        elapsed = self._clock() - (job.started_at or self._clock())
        record = AttemptRecord(
            batch_id=job.state.work.batch.batch_id, phase=phase, attempt=job.state.attempt, outcome=SUPERSEDED,
            elapsed_s=round(elapsed, 6), usage=usage, backup=job.backup,
        )
        records.append(record)
        events.emit(self._settled(job, record, reply, []))

    def _follow_up(self, state: BatchState, problem: str | None, tables: dict[int, Table]) -> BatchJob | None:
        """The batch's next attempt, a continuation that names what is still missing; None when
        nothing is missing or its attempts are spent."""
        items = state.work.items
        gaps = [(k, item_gaps(tables[item.task_index], item)) for k, item in enumerate(items, 1)]
        missing = [{"number": k, "what": g} for k, g in gaps if g]
        if not missing or state.attempt >= self.config.max_attempts:
            return None
        prompt = render_prompt(
            "mapreduce", "continuation", original=state.first_prompt, attempt=state.attempt + 1,
            max_attempts=self.config.max_attempts, problem=problem, missing=missing,
        )
        return BatchJob(state=state, request=self._request(state, prompt))

    @staticmethod
    def _settled(job: BatchJob, record: AttemptRecord, reply: SolverReply | None, parsed_rows: list[dict[str, Any]], *,
                 merged: tuple[MergedRow, ...] = (), done: bool = False) -> AttemptSettled:
        return AttemptSettled(record=record, merged=merged, done=done,
                              prompt=job.request.prompt if job.request is not None else None,
                              raw_output=None if reply is None else reply.output, parsed_rows=tuple(parsed_rows),
                              subagent=None if reply is None else reply.trace)

    # -- reduce and summary ---------------------------------------------------------------------


    def _reduce(self, decision: Decision, tables: dict[int, Table]) -> Table:
        table = self.config.table_for(decision)
        for i in sorted(tables):
            for row in tables[i].rows:
                table.merge_row(row, fill=False)
        return table

