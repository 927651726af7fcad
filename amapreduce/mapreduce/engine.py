"""The MapReduce engine: run a decision's batches on fresh sub-agents, reduce in code, patch.

One loop in the calling thread owns all state (no locks around tables): it keeps at most
`workers` attempts in flight on the executor, merges each reply as it completes (completion
order), retries a batch with a continuation prompt that names exactly what is missing
(results of earlier attempts are kept), abandons attempts that pass their deadline, and
finally reduces the per-task tables into one table in matrix order. Then Algorithm 1's delta
patch runs bounded rounds over only the rows and cells still missing.
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from amapreduce.decision.model import Decision
from amapreduce.errors import BatchTimeout, BudgetExceeded, RunCancelled
from amapreduce.llm.scope import UsageScope, usage_scope
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import BatchPlan, plan_batches
from amapreduce.mapreduce.executor import Executor, ThreadExecutor
from amapreduce.mapreduce.patch import build_patch
from amapreduce.mapreduce.replies import parse_reply, project_row
from amapreduce.mapreduce.result import AttemptRecord, MapReduceResult, RunSummary
from amapreduce.mapreduce.solver import BatchRequest, BatchSolver, SolverReply
from amapreduce.mapreduce.work import MATRIX_SOURCE, WorkBatch, WorkItem, assign_rows, item_gaps, merge_rows
from amapreduce.prompts import render_prompt
from amapreduce.settings import DecisionAuthor, Settings, default_setting
from amapreduce.table.table import DEFAULT_MISSING_MARKERS, Table
from amapreduce.trace import NullTrace, Trace

__all__ = ["EngineConfig", "MapReduceEngine", "ProgressEvent"]

_POLL_S = 0.05


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

    @classmethod
    def from_settings(cls, settings: Settings, *, decisions_by: DecisionAuthor) -> EngineConfig:
        """The limits `settings` give an engine whose decisions are written by `decisions_by`
        (the batch cap depends on it: see `Settings.batch_cap`)."""
        return cls(
            workers=settings.workers,
            max_attempts=settings.max_attempts,
            batch_timeout_s=settings.batch_timeout_s,
            patch_rounds=settings.patch_rounds,
            max_batches=settings.batch_cap(decisions_by),
        )


@dataclass(frozen=True, kw_only=True)
class ProgressEvent:
    """A progress notification (for rich progress bars or logs)."""

    kind: str
    """`phase`, `attempt` or `batch_done` (provider retries are `ProviderRetry` events of the models)."""
    phase: str
    batches_done: int
    batches_total: int
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class _BatchState:
    work: WorkBatch
    prompt_vars: dict[str, Any]
    first_prompt: str = ""
    attempt: int = 0


@dataclass(eq=False)
class _Job:
    state: _BatchState
    request: BatchRequest | None
    """None until the attempt starts: a first prompt is rendered on the worker, not the engine loop."""
    started_at: float | None = None
    future: Future[SolverReply] | None = None
    holds_slot: bool = False
    scope: UsageScope | None = None
    """The metered model calls of the running attempt (billed even when the attempt fails)."""
    outcome: tuple[SolverReply | None, BaseException | None] | None = None
    """Set by the worker when the solver returns, before its slot is freed: a stop never loses it."""


class MapReduceEngine:
    """Runs decisions through a `BatchSolver`.

    Args:
        solver: makes one fresh sub-agent attempt per call.
        config: limits; see `EngineConfig`.
        executor: where attempts run (default: a thread pool sized from the config).
        trace: receives every phase, attempt (prompt, raw output, rows, timing, usage) and summary.
        progress: called in the engine's thread on each event.
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
    ) -> None:
        self.solver = solver
        self.config = config or EngineConfig()
        self._executor = executor
        self.trace = trace or NullTrace()
        self._progress = progress
        self._clock = clock
        self._cancel = threading.Event()
        self._prompt_lock = threading.Lock()
        self._gate = threading.Lock()  # guards `_running` and slot hand-back
        self._running: set[_Job] = set()
        self._slots = threading.Semaphore(self.config.workers)
        self._prompt_cache: dict[str, str] = {}
        self._stop_reason = "the MapReduce run was cancelled"
        # Finished futures arrive here through done-callbacks: O(1) per completion, however
        # many attempts are in flight. `None` is the wake-up sent by `cancel()`.
        self._done: queue.SimpleQueue[Future[SolverReply] | None] = queue.SimpleQueue()

    def cancel(self) -> None:
        """Stop the current run soon (thread-safe); `run` then raises `RunCancelled`."""
        self._cancel.set()
        self._done.put(None)

    def run(self, decision: Decision, *, plan: BatchPlan | None = None) -> MapReduceResult:
        """Execute `decision`: map, reduce, then delta-patch rounds.

        Args:
            decision: the validated decision Θ.
            plan: its batch plan, when the caller already made it (the `mapreduce` tool plans
                once, to show it and to run it); default: planned here under `max_batches`.

        Raises:
            DecisionError: the batch plan exceeds `max_batches`.
            RunCancelled: `cancel()` was called or Ctrl-C was pressed; `.partial` holds the
                result so far.
        """
        cfg = self.config
        start = self._clock()
        plan = plan if plan is not None else plan_batches(decision, max_batches=cfg.max_batches)
        tables = {i: Table(decision.columns, decision.resolved_key_columns, missing_markers=cfg.missing_markers) for i in range(len(decision.task_matrix))}
        forced_cols = set(decision.forced_values(0))
        one_row, names = decision.one_row_per_task, decision.columns
        wanted = tuple(c for c in names if c not in forced_cols)
        items = []
        for i, task_table in tables.items():
            forced = decision.forced_values(i)
            if one_row:
                task_table.upsert(forced, task_index=i, sources=dict.fromkeys(forced, MATRIX_SOURCE))
            items.append(
                WorkItem(
                    task_index=i,
                    text=decision.task_text(i),
                    forced=forced,
                    columns=wanted,
                    single_row=one_row,
                    expected_rows=decision.rows_per_task,
                )
            )
        work = [WorkBatch(batch=b, items=tuple(items[i] for i in b.indices), column_specs=decision.column_specs) for b in plan.batches]
        self.trace.write("run_start", num_rows=len(items), strategy=plan.strategy, batches=[b.manifest() for b in plan.batches])
        records: list[AttemptRecord] = []
        executor = self._executor or ThreadExecutor(cfg.threads or cfg.workers + max(2, cfg.workers // 4))
        rounds_run, batches_run, timings = 0, len(work), {"map_s": 0.0, "patch_s": 0.0}
        cancelled = False
        table: Table | None = None
        try:
            self._run_phase("map", work, decision, tables, records, executor)
            timings["map_s"] = self._clock() - start
            table = self._reduce(decision, tables)
            for round_no in range(1, cfg.patch_rounds + 1):
                patch = build_patch(decision, table, tables, round_no)
                if not patch:
                    break
                rounds_run, batches_run = round_no, batches_run + len(patch)
                self.trace.write("patch_round", round=round_no, batches=[w.batch.manifest() for w in patch])
                self._run_phase(f"patch{round_no}", patch, decision, tables, records, executor)
                table = self._reduce(decision, tables)
            timings["patch_s"] = self._clock() - start - timings["map_s"]
        except (RunCancelled, KeyboardInterrupt):
            cancelled = True
        finally:
            executor_owned = self._executor is None
            if executor_owned or cancelled:
                executor.shutdown(cancel=True)
        if cancelled or table is None:
            table = self._reduce(decision, tables)
        timings["wall_s"] = self._clock() - start
        per_task = None if decision.one_row_per_task else decision.rows_per_task or 1
        summary = RunSummary.of(
            table, tables, records, rows_per_task=per_task, rounds=rounds_run, batches=batches_run, timings=timings
        )
        result = MapReduceResult(table=table, summary=summary, plan=plan, attempts=tuple(records), cancelled=cancelled)
        self.trace.write("run_end", summary=summary.to_json(), cancelled=cancelled)
        if cancelled:
            raise RunCancelled(f"{self._stop_reason}; `partial` holds the rows found so far", partial=result)
        return result

    # -- one phase (map or a patch round) ------------------------------------------------------

    def _run_phase(
        self,
        phase: str,
        work: list[WorkBatch],
        decision: Decision,
        tables: dict[int, Table],
        records: list[AttemptRecord],
        executor: Executor,
    ) -> None:
        cfg = self.config
        many = not decision.one_row_per_task
        pending: deque[_Job] = deque()
        for w in work:
            state = _BatchState(
                work=w,
                prompt_vars={
                    "rationale": w.batch.rationale,
                    "shared_context": dict(w.batch.shared_context),
                    "columns": w.column_specs,
                    "rows_per_task": decision.rows_per_task if many and phase == "map" else None,
                    "many_rows": many and not all(i.single_row for i in w.items),
                },
            )
            pending.append(_Job(state=state, request=None))
        done_batches, total = 0, len(work)
        self._emit("phase", phase, 0, total)
        inflight: dict[Future[SolverReply], _Job] = {}
        try:
            self._submit(pending, inflight, executor)
            while inflight:
                if self._cancel.is_set():
                    raise RunCancelled("cancelled")
                finished: list[tuple[_Job, SolverReply | None, BaseException | None]] = []
                for fut in self._finished(inflight):
                    job = inflight.pop(fut)
                    self._leave(job)
                    exc = fut.exception()
                    finished.append((job, None if exc else fut.result(), exc))
                now = self._clock()
                for job in self._overdue(now):
                    if job.future is not None:
                        inflight.pop(job.future, None)
                    self._abandon(job)  # its slot goes to the next attempt; a late result is ignored
                    executor.replace_stuck_thread()  # the hung thread must not starve queued attempts
                    finished.append((job, None, BatchTimeout(f"attempt ran past its {cfg.batch_timeout_s:g} s deadline")))
                for job, reply, exc in finished:
                    if isinstance(exc, BudgetExceeded):
                        self._stop_reason = str(exc)
                        self.cancel()
                    follow = self._settle(job, phase, reply, exc, tables, records)
                    if follow is not None:
                        self._submit(deque([follow]), inflight, executor)
                    else:
                        done_batches += 1
                        self._emit("batch_done", phase, done_batches, total, batch_id=job.state.work.batch.batch_id)
            if self._cancel.is_set():
                raise RunCancelled("cancelled")
        except (KeyboardInterrupt, RunCancelled):
            self._cancel.set()  # queued attempts waiting for a slot must not start after Ctrl-C
            for job in list(inflight.values()):
                if job.outcome is not None:  # answered before the stop: keep (and count) its rows
                    self._settle(job, phase, *job.outcome, tables, records)
                elif job.request is not None:
                    job.request.cancel.set()
            raise

    def _submit(self, jobs: deque[_Job], inflight: dict[Future[SolverReply], _Job], executor: Executor) -> None:
        """Hand attempts to the executor at once; each waits inside for one of the `workers`
        slots, so a freed slot is taken by a waiting thread without a round trip through this loop."""
        while jobs and not self._cancel.is_set():
            job = jobs.popleft()
            future = executor.submit(functools.partial(self._execute, job))
            job.future = future
            inflight[future] = job
            future.add_done_callback(self._done.put)

    def _release(self, job: _Job) -> None:
        """Give back the job's slot once (by the worker when done, or by the loop on abandon)."""
        with self._gate:
            held, job.holds_slot = job.holds_slot, False
        if held:
            self._slots.release()

    def _leave(self, job: _Job) -> None:
        with self._gate:
            self._running.discard(job)

    def _abandon(self, job: _Job) -> None:
        self._leave(job)
        self._release(job)
        if job.request is not None:
            job.request.cancel.set()

    def _overdue(self, now: float) -> list[_Job]:
        limit = self.config.batch_timeout_s
        with self._gate:
            return [j for j in self._running if j.started_at is not None and now - j.started_at > limit]

    def _first_prompt(self, state: _BatchState) -> str:
        """The batch prompt: the shared part (`prompts/mapreduce.yaml`, `batch`) is rendered once
        per distinct batch context (most batches of a phase share it), then the batch's numbered
        sub-questions follow it, one per line."""
        v = state.prompt_vars
        key = repr((v["rationale"], sorted(v["shared_context"].items()), v["columns"], v["rows_per_task"], v["many_rows"]))
        with self._prompt_lock:
            header = self._prompt_cache.get(key)
        if header is None:
            header = render_prompt("mapreduce", "batch", **v)
            with self._prompt_lock:
                self._prompt_cache[key] = header
        tasks = "\n".join(f"{k}. {item.text}" for k, item in enumerate(state.work.items, 1))
        return f"{header}\n{tasks}"

    def _finished(self, inflight: dict[Future[SolverReply], _Job]) -> list[Future[SolverReply]]:
        """In-flight futures that finished, in completion order (waits until the first one,
        the next deadline, or a cancel). Late results of abandoned attempts are ignored."""
        try:
            first = self._done.get(timeout=self._wait_s(inflight))
        except queue.Empty:
            return []
        got = [first]
        while True:
            try:
                got.append(self._done.get_nowait())
            except queue.Empty:
                break
        return [f for f in got if f is not None and f in inflight]

    def _wait_s(self, inflight: dict[Future[SolverReply], _Job]) -> float:
        """Sleep until the nearest deadline of a running attempt; poll while some have not started."""
        now = self._clock()
        with self._gate:
            starts = [j.started_at for j in self._running if j.started_at is not None]
            waiting = len(inflight) > len(self._running)
        wait_s = min((s + self.config.batch_timeout_s - now for s in starts), default=_POLL_S * 20)
        if waiting:
            wait_s = min(wait_s, _POLL_S)
        return max(0.0, wait_s)

    def _execute(self, job: _Job) -> SolverReply:
        while not self._slots.acquire(timeout=_POLL_S):
            if self._cancel.is_set():
                raise RunCancelled("cancelled before the attempt started")
        job.holds_slot = True
        try:
            if self._cancel.is_set():
                raise RunCancelled("cancelled before the attempt started")
            if job.request is None:  # a first attempt renders its prompt here, off the engine's loop
                job.request = self._request(job.state, self._first_prompt(job.state))
            now = self._clock()
            request = dataclasses.replace(job.request, deadline=now + self.config.batch_timeout_s, clock=self._clock)
            job.request = request
            job.scope = UsageScope({"batch_id": request.batch_id, "attempt": request.attempt})
            with self._gate:
                job.started_at = now
                self._running.add(job)
            with usage_scope(job.scope):
                try:
                    reply = self.solver.solve(request)
                except Exception as exc:
                    job.outcome = (None, exc)
                    raise
            job.outcome = (reply, None)
            return reply
        finally:
            self._release(job)

    def _request(self, state: _BatchState, prompt: str) -> BatchRequest:
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
            rationale=w.batch.rationale,
            shared_context=dict(w.batch.shared_context),
        )

    def _settle(
        self,
        job: _Job,
        phase: str,
        reply: SolverReply | None,
        exc: BaseException | None,
        tables: dict[int, Table],
        records: list[AttemptRecord],
    ) -> _Job | None:
        """Merge one finished attempt; return the retry job, or None when the batch is done."""
        state, items = job.state, job.state.work.items
        elapsed = self._clock() - (job.started_at or self._clock())
        names = [c.name for c in state.work.column_specs]
        rows, dropped, problem, parsed_rows = 0, 0, None, []
        outcome = "error"
        if exc is not None:
            outcome = "timeout" if isinstance(exc, BatchTimeout) else "error"
            problem = f"{type(exc).__name__}: {exc}"
        elif reply is not None:
            parsed = parse_reply(reply.output)
            projected = [project_row(obj, names) for obj in parsed.rows]
            if self.trace.enabled:
                parsed_rows = [{**p.values, "task": p.task, "source": p.source} for p in projected]
            rows = len(projected)
            by_number, dropped = assign_rows(projected, items)
            for number, answer in by_number.items():
                item = items[number - 1]
                dropped += merge_rows(tables[item.task_index], item, answer)
            outcome = "ok" if parsed.error is None else "parse_error"
            if parsed.truncated:  # only its closed rows were kept; cut values stay missing
                problem = "the reply was cut off before its end, so only its complete rows were kept"
            elif parsed.error is not None:
                problem = f"the reply was not a JSON array of rows ({parsed.error})"
        # What the meter charged the sub-agent model for this attempt, failed ones included; a
        # solver whose model is not metered (scripted tests) reports its own usage.
        metered = job.scope.usage("subagent") if job.scope is not None else Usage()
        usage = metered if metered.requests else reply.usage if reply is not None else Usage()
        record = AttemptRecord(
            batch_id=state.work.batch.batch_id, phase=phase, attempt=state.attempt, outcome=outcome,
            elapsed_s=round(elapsed, 6), rows=rows, dropped_rows=dropped, error=problem, usage=usage,
        )
        records.append(record)
        if self.trace.enabled:
            self._trace_attempt(job, record, reply, parsed_rows)
        self._emit("attempt", phase, 0, 0, batch_id=record.batch_id, attempt=state.attempt, outcome=outcome)
        gaps = [(k, item_gaps(tables[item.task_index], item)) for k, item in enumerate(items, 1)]
        missing = [{"number": k, "what": g} for k, g in gaps if g]
        if not missing or state.attempt >= self.config.max_attempts or self._cancel.is_set():
            return None
        prompt = render_prompt(
            "mapreduce", "continuation", original=state.first_prompt, attempt=state.attempt + 1,
            max_attempts=self.config.max_attempts, problem=problem, missing=missing,
        )
        return _Job(state=state, request=self._request(state, prompt))

    def _trace_attempt(self, job: _Job, record: AttemptRecord, reply: SolverReply | None, parsed_rows: list[Any]) -> None:
        self.trace.write(
            "attempt",
            batch_id=record.batch_id,
            phase=record.phase,
            attempt=record.attempt,
            outcome=record.outcome,
            prompt=job.request.prompt if job.request is not None else None,
            raw_output=None if reply is None else reply.output,
            parsed_rows=parsed_rows,
            dropped_rows=record.dropped_rows,
            error=record.error,
            elapsed_s=record.elapsed_s,
            usage=record.usage.to_json(),
            subagent=None if reply is None else dict(reply.trace),
        )

    # -- reduce and summary ---------------------------------------------------------------------

    def _reduce(self, decision: Decision, tables: dict[int, Table]) -> Table:
        table = Table(decision.columns, decision.resolved_key_columns, missing_markers=self.config.missing_markers)
        for i in sorted(tables):
            for row in tables[i].rows:
                table.merge_row(row)
        return table

    def _emit(self, kind: str, phase: str, done: int, total: int, **data: Any) -> None:
        if self._progress is not None:
            self._progress(ProgressEvent(kind=kind, phase=phase, batches_done=done, batches_total=total, data=data))
