"""Very wide runs on Ray: a decision's batches in chunks, each chunk one Ray task running today's engine.

Why chunks of the batch plan. One engine run keeps its per-run state (tables, attempts, the
journal) in one process and fans out over threads; a 10,000-row extraction is more than one
machine's threads should carry. With `--executor ray`, a plain decision (no `discover`, no
`child`) whose plan has more batches than one chunk holds is cut into chunks of whole batches
(`chunk_plan`): a chunk is its rows as a sub-decision (`Decision.with_matrix`) and its batches,
unchanged but for their row numbers, so every sub-agent is asked what a local run asks it. Each
chunk is one Ray task (`run_chunk`: one CPU, never retried by Ray itself, since a chunk spends money) running the
threaded engine on plain data: the settings, the sub-decision as JSON, its plan. A chunk holds
`chunk_batches(settings)` batches: the batch cap when one is set (`--max-batches`; a plan over the
cap, refused locally, is split instead), else `CHUNK_BATCHES_PER_WORKER` per sub-agent thread, so
each task keeps its threads busy while the cluster shares out the chunks. The driver keeps as
many chunks in flight as the cluster has CPUs (`_slots`), and sends the next one as soon as one
comes back, before merging it: a backlog of queued tasks would make Ray start worker processes
beyond its CPUs, each importing amapreduce on the CPUs the running chunks need.

The merge. The driver merges the chunks' rows into one table in matrix order (rows by their task,
mapped back to the full matrix; `Table.merge_row`, the rule of a local run's reduce) and adds their
usage to the run's meter (so `result.json` counts every remote call) and their trace events to the
run's trace (each tagged with its `chunk`). Every worker's model calls go through the cluster's
limiter and budget (`cluster.limits`).

Failures and stops. A chunk whose worker or node died (`cluster.ray.worker_died`) is run again, up to
`Settings.ray_retries` times (`AMAPREDUCE_RAY_RETRIES`), on whichever worker Ray gives it: each
attempt keeps its calls' usage and its settled batch attempts in the cluster limiter's ledger as it
goes (`cluster.limits.AttemptSink`), so the driver accounts for the dead attempt's calls, journals
its batch attempts, and hands them to the retry, which replays them and runs only the rest. Only
when a chunk's retries are spent does the run end `failed`, with the rows of every chunk that came
back. A chunk that stopped (the budget, a provider down), a failure, or a Ctrl-C in the driver
halts its chunks (`ClusterLimiter.halt`): a queued chunk gives back nothing, a running one stops
before its next call and comes back with its rows and usage; after Ctrl-C (or `STOP_GRACE_S`)
the chunks still out are cancelled (`ray.cancel`) and what they spent is read from the ledger. So
`result.json` counts every call a worker finished, whatever stopped the run.

The journal. With the run's journal (`journal`), the driver records the wide run (`WideStarted`)
and, as each chunk comes back, the chunk's own engine entries: each worker's engine runs with a
`Checkpoint` over an in-memory sink, and its `ExecutionStarted` (the sub-decision and its plan) and
`BatchAttempt`s (merged rows with their cells, quotes and evidence, and usage) are the chunk's
result, journaled by the driver as execution `chunk + 1`, then `ChunkFinished` if the chunk ran to
its end. Resuming (`saved`: the journal's entries) cuts the plan as the run did; a finished chunk
is replayed in the driver from its entries (the engine's own replay: no model call), a chunk with
attempts but no end (a budget stop) is sent with them and goes on where it stopped, the rest run
afresh. A chunk still running when the driver is killed, or cancelled (`ray.cancel` interrupts the
worker, and Ray hands back no return value for a cancelled task), leaves nothing: its attempts
are in the ledger, and a resume goes on from those the driver journaled.

`ask --executor ray` (`RayExecutor.attach`): the manager runs in the driver, and its session
runs a plain decision of more than one chunk here, on the session's one cluster limiter: the driver's models are built inside it (the manager's
rate window and breaker are the chunks'), and the run's meter is a `DriverMeter`, so the manager's
spend and the chunks' are one sum against one budget. Those executions are not journaled: a
resumed `ask` runs them again, locally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amapreduce.cluster.limits import (
    AttemptSink,
    ClusterLimiter,
    ClusterLimits,
    ClusterMeter,
    cluster_limits,
    cluster_worker,
    halted,
)
from amapreduce.cluster.ray import check_cluster, ray_session, require_ray, worker_died
from amapreduce.llm.factory import model_for_role
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.batching import BatchPlan
from amapreduce.mapreduce.checkpoint import BatchAttempt, Checkpoint, ExecutionStarted, plan_manifest
from amapreduce.mapreduce.result import (
    INTERRUPTED,
    Completeness,
    MapReduceResult,
    RunEnding,
    RunStatus,
    RunSummary,
)
from amapreduce.session.executor import ExecutorSpec, WideRun
from amapreduce.session.journal import ChunkFinished, WideStarted
from amapreduce.table.table import Row
from amapreduce.trace import Trace

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.journal import JournalEntry
    from amapreduce.mapreduce.checkpoint import EntrySink
    from amapreduce.settings import Settings

__all__ = ["CHUNK_BATCHES_PER_WORKER", "STOP_GRACE_S", "ChunkJob", "ChunkRun", "DriverMeter",
           "RayExecutor", "chunk_batches", "chunk_plan", "run_chunk", "run_wide"]

_log = logging.getLogger(__name__)

CHUNK_BATCHES_PER_WORKER = 4
"""Batches per chunk for each sub-agent thread of a chunk, when no batch cap is set."""
STOP_GRACE_S = 120.0
"""Seconds a stopped run waits for its running chunks to stop on their own (before their next
call) and come back with their rows, before it cancels them."""
CANCEL_SETTLE_S = 10.0
"""Seconds the driver waits for cancelled chunks to end, so their ledger holds all they spent."""


def chunk_batches(settings: Settings) -> int:
    """How many batches one chunk holds (see the module doc)."""
    return settings.batch_cap("user") or CHUNK_BATCHES_PER_WORKER * settings.workers


@dataclass(frozen=True, kw_only=True)
class ChunkJob:
    """One chunk of a wide run: plain, picklable data."""

    index: int
    rows: tuple[int, ...]
    """The full matrix's rows, in the sub-decision's order."""
    decision: dict[str, Any]
    """The sub-decision (`Decision.model_dump(mode="json")`)."""
    plan: BatchPlan
    """The chunk's batches, their row numbers those of the sub-decision."""
    settings: Settings
    limits: ClusterLimits | None = None
    """The cluster's limiter (None: the worker's own limits, as a local run)."""
    saved: tuple[JournalEntry, ...] = ()
    """The chunk's journaled execution and attempts (a resumed run, a retry): replayed, not run again."""
    tag: str | None = None
    """This attempt's name in the cluster limiter's ledger (None: nothing kept there)."""


@dataclass(frozen=True, kw_only=True)
class ChunkRun:
    """What a chunk gave back: its result (row numbers of the sub-decision), usage, trace and web usage."""

    index: int
    result: MapReduceResult
    usage: dict[str, Usage]
    events: list[tuple[str, dict[str, Any]]]
    web: dict[str, Any]
    entries: list[JournalEntry] = dataclasses.field(default_factory=list)
    """What the chunk's engine journaled in this run (its execution, unless resumed, and attempts)."""


def chunk_plan(decision: Decision, plan: BatchPlan, size: int) -> list[tuple[tuple[int, ...], BatchPlan]]:
    """Cut `plan` into chunks of `size` whole batches: (the chunk's rows in matrix order, its plan
    with row numbers into those rows)."""
    chunks = []
    for start in range(0, len(plan.batches), max(1, size)):
        batches = plan.batches[start:start + size]
        rows = tuple(sorted({i for b in batches for i in b.indices}))
        local = {row: k for k, row in enumerate(rows)}
        sub = tuple(dataclasses.replace(b, indices=tuple(local[i] for i in b.indices)) for b in batches)
        chunks.append((rows, BatchPlan(strategy=plan.strategy, num_rows=len(rows), batches=sub)))
    return chunks


class _Collected(Trace):
    """A worker's trace: events kept in memory and shipped back to the driver's run trace."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def write(self, event: str, **data: Any) -> None:
        self.events.append((event, data))


class _Kept:
    """A worker's journal: the engine's entries kept in memory for the driver to journal."""

    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def append(self, entry: JournalEntry) -> None:
        self.entries.append(entry)


def run_chunk(job: ChunkJob) -> ChunkRun | None:
    """Run one chunk (in a Ray worker): build the parts from the settings, run the engine on the
    sub-decision's plan, and return plain data. A stopped engine returns its partial result; a
    chunk whose run was halted before it started returns None."""
    from amapreduce.decision.model import Decision
    from amapreduce.session.parts import build_models, build_parts

    if job.limits is not None and job.tag is not None and halted(job.limits, job.tag) is not None:
        return None
    decision = Decision.parse(job.decision)
    trace = _Collected()
    kept: _Kept | AttemptSink = (AttemptSink(job.limits, job.tag) if job.limits is not None and job.tag is not None
                                 else _Kept())
    with cluster_worker(job.limits, job.settings, tag=job.tag) as meter:
        models = build_models(job.settings, ("subagent", "extraction"), meter=meter, trace=trace)
        with build_parts(job.settings, models=models, trace=trace, decisions_by="user") as parts:
            result = parts.engine.run(decision, plan=job.plan, checkpoint=Checkpoint(kept, job.saved))  # a stop: its ending
            web = parts.web_usage()
        if isinstance(kept, AttemptSink):
            kept.flush()  # the ledger is complete before the driver forgets it
    return ChunkRun(index=job.index, result=result, usage=meter.by_role(), events=trace.events, web=web,
                    entries=kept.entries)


def _added(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two web-usage records added up (numbers summed, nested records recursively)."""
    out = dict(a)
    for key, value in b.items():
        mine = out.get(key)
        if isinstance(value, dict) and isinstance(mine, dict):
            out[key] = _added(mine, value)
        elif isinstance(value, int | float) and isinstance(mine, int | float) and not isinstance(value, bool):
            out[key] = mine + value
        elif key not in out:
            out[key] = value
    return out


def run_wide(
    decision: Decision,
    plan: BatchPlan,
    settings: Settings,
    *,
    meter: UsageMeter,
    trace: Trace,
    address: str | None = None,
    role_models: dict[str, str] | None = None,
    journal: EntrySink | None = None,
    saved: Sequence[JournalEntry] = (),
    limits: ClusterLimits | None = None,
    size: int | None = None,
) -> WideRun:
    """Run `decision`'s `plan` in chunks on Ray (joined at `address`, `ray_session`) and merge them.

    Args:
        decision, plan: a plain decision and its full batch plan.
        settings: the run's settings; every worker builds its parts from them.
        meter: the run's meter: each chunk's usage is added to it, under the model of its role
            (`role_models`), and the cluster's budget starts from what it holds.
        trace: the run's trace: each chunk's events are written there with their `chunk`.
        journal: the run's journal, where the run and each chunk that comes back are recorded
            (see the module doc); None: not journaled.
        saved: the journal's entries, when resuming a wide run of `decision` (its `WideStarted`
            says how the plan was cut).
        limits: a cluster limiter already running (`ask`'s, shared with its manager); None: one
            is started for this run and stopped after it.
        size: batches per chunk (default `chunk_batches(settings)`; a resume: as the run did).

    Raises:
        ConfigError: the `ray` extra is missing or Ray cannot be reached.
    """
    ray = require_ray()
    started = time.perf_counter()
    wide = next((e for e in saved if isinstance(e, WideStarted)), None)
    size = wide.chunk_batches if wide is not None else size or chunk_batches(settings)
    jobs_data = chunk_plan(decision, plan, size)
    if journal is not None and wide is None:
        journal.append(WideStarted(decision=decision.model_dump(mode="json"), plan=plan_manifest(plan),
                                   chunk_batches=size, address=address))
    finished = {e.chunk for e in saved if isinstance(e, ChunkFinished)}
    chunks = _Chunks(decision, jobs_data, settings, saved, meter=meter, trace=trace, journal=journal,
                     role_models=role_models or {})
    for k in sorted(finished):  # replayed here from the journal: no model is asked
        chunks.replay(k)
    with ray_session(address):
        limiter = ClusterLimiter.start(budget=meter.budget, spent=meter.total()) if limits is None else None
        handle = limiter or ClusterLimiter.find(limits)  # type: ignore[arg-type]  # one of the two is set
        try:
            chunks.run(ray, handle, [k for k in range(len(jobs_data)) if k not in finished])
        finally:
            if limiter is not None:
                limiter.stop()
    done = chunks.done
    result = _merged(decision, plan, settings, [(jobs_data[k][0], done[k]) for k in sorted(done)], chunks.stop,
                     wall_s=time.perf_counter() - started)
    web: dict[str, Any] = {}
    for k in sorted(done):
        web = _added(web, done[k].web)
    return WideRun(result=result, web=web, chunks=len(jobs_data), finished=len(done))


def _slots(ray: Any) -> int:
    """How many chunks the driver keeps in flight: the cluster's CPUs, read again as each chunk
    comes back (a node that joins gets work at once).

    Why not all at once: a backlog of queued chunk tasks makes Ray start worker processes for it,
    beyond its CPUs, and stop the idle ones again; each start imports Ray and amapreduce (about 1 s
    of CPU) on the very CPUs the running chunks need, and a new worker builds its engine's parts
    afresh. Measured with `benchmarks/bench_ray.py` (1,000 rows, 32 chunks, 2 CPUs): 5-6 worker
    processes started per run, and the run took 15-30 % longer than with only the CPUs' worth in
    flight (two workers, each running one chunk after another)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class _Chunks:
    """The driver's side of one wide run: the chunks' jobs, attempts, retries and what came back."""

    def __init__(self, decision: Decision, jobs: list[tuple[tuple[int, ...], BatchPlan]], settings: Settings,
                 saved: Sequence[JournalEntry], *, meter: UsageMeter, trace: Trace, journal: EntrySink | None,
                 role_models: dict[str, str]) -> None:
        self.decision, self.jobs, self.settings, self.saved = decision, jobs, settings, saved
        self.meter, self.trace, self.journal, self.role_models = meter, trace, journal, role_models
        self.done: dict[int, ChunkRun] = {}
        """The chunks that came back (finished, or stopped with their rows)."""
        self.stop: RunEnding | None = None
        """Why the run ended early (None: it did not)."""
        self._run_id = uuid.uuid4().hex[:12]
        self._tries: dict[int, int] = {}
        self._carried: dict[int, list[JournalEntry]] = {}
        """Entries of a chunk's dead attempts (journaled, renumbered as the chunk's execution): its retry replays them."""
        self._spent: dict[int, dict[str, Usage]] = {}
        """Usage of a chunk's dead attempts (its `ChunkFinished` records every attempt's)."""

    def job(self, k: int, cluster: ClusterLimits | None) -> ChunkJob:
        """Chunk `k`'s job: its rows, sub-decision and plan, and what was saved of it (journal, dead attempts)."""
        rows, sub_plan = self.jobs[k]
        sub = self.decision.with_matrix([self.decision.task_matrix[i] for i in rows]).model_dump(mode="json")
        mine = tuple(e for e in self.saved if isinstance(e, ExecutionStarted | BatchAttempt) and e.execution == k + 1)
        tag = f"{self._run_id}.{k}.{self._tries.get(k, 0)}" if cluster is not None else None
        return ChunkJob(index=k, rows=rows, decision=sub, plan=sub_plan, settings=self.settings, limits=cluster,
                        saved=(*mine, *self._carried.get(k, ())), tag=tag)

    def replay(self, k: int) -> None:
        """A chunk the journal holds as finished, replayed in the driver (no model is asked)."""
        chunk = run_chunk(self.job(k, None))
        if chunk is None:  # only a halted cluster's chunk gives back nothing: no cluster here
            raise RuntimeError(f"chunk {k} gave nothing back when replayed")
        self.done[k] = chunk
        _absorb(chunk, self.meter, self.trace, {})

    def run(self, ray: Any, limiter: ClusterLimiter, todo: list[int]) -> None:
        """Send `todo`'s chunks to Ray and take them back: retry the dead, stop on the first early
        end (see the module doc)."""
        task = ray.remote(num_cpus=1, max_retries=0)(run_chunk)
        pending: dict[Any, tuple[int, str]] = {}
        queued = list(todo)

        def submit(k: int) -> None:
            job = self.job(k, limiter.limits)
            pending[task.remote(job)] = (k, job.tag or "")

        def fill() -> None:  # as many chunks in flight as the cluster has CPUs now (see `_slots`)
            slots = _slots(ray)
            while queued and len(pending) < slots and self.stop is None:
                submit(queued.pop(0))

        try:
            fill()
            while pending and self.stop is None:
                self._take(ray, limiter, pending, submit, ray.wait(list(pending), num_returns=1)[0], refill=fill)
                fill()
            if pending:
                limiter.halt(self._run_id, self.stop.reason or self.stop.label if self.stop is not None else "stopped")
                self._drain(ray, limiter, pending, submit, STOP_GRACE_S)
        except KeyboardInterrupt:
            self.stop = INTERRUPTED
            limiter.halt(self._run_id, "interrupted")
        finally:
            for ref in pending:
                ray.cancel(ref)
            if pending:
                ray.wait(list(pending), num_returns=len(pending), timeout=CANCEL_SETTLE_S)
            for k, tag in pending.values():
                self._lost(limiter, k, tag)

    def _drain(self, ray: Any, limiter: ClusterLimiter, pending: dict[Any, tuple[int, str]],
               submit: Any, grace_s: float) -> None:
        """After a stop: take back the chunks that stop on their own within `grace_s`."""
        deadline = time.monotonic() + grace_s
        while pending and (left := deadline - time.monotonic()) > 0:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            if not ready:
                return
            self._take(ray, limiter, pending, submit, ready)

    def _take(self, ray: Any, limiter: ClusterLimiter, pending: dict[Any, tuple[int, str]], submit: Any,
              ready: list[Any], refill: Callable[[], None] | None = None) -> None:
        """Take back the chunks of `ready`; `refill` sends the next ones as soon as a chunk that ran to
        its end is in, before it is merged and journaled (its worker does not wait for that)."""
        for ref in ready:
            k, tag = pending.pop(ref)
            try:
                chunk = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._failed(limiter, k, tag, exc, submit)
                continue
            limiter.forget(tag)
            if chunk is None:  # halted before it started
                continue
            if refill is not None and not chunk.result.ending.status.ended_early:
                refill()
            self._came_back(chunk)

    def _came_back(self, chunk: ChunkRun) -> None:
        k = chunk.index
        self.done[k] = chunk
        _absorb(chunk, self.meter, self.trace, self.role_models)
        if self.journal is not None:
            _journal(self.journal, chunk, before=self._spent.get(k, {}))
        if chunk.result.ending.status.ended_early and self.stop is None:
            self.stop = dataclasses.replace(chunk.result.ending,
                                            reason=f"chunk {k}: {chunk.result.ending.reason or 'stopped'}")

    def _failed(self, limiter: ClusterLimiter, k: int, tag: str, exc: Exception, submit: Any) -> None:
        """Attempt `tag` of chunk `k` came back as an error: account for it, and retry it when its
        worker died and retries are left (else the run fails)."""
        self._lost(limiter, k, tag)
        first = (str(exc).strip().splitlines() or [""])[0]
        died = worker_died(exc)
        tries = self._tries.get(k, 0)
        if died and tries < self.settings.ray_retries and self.stop is None:
            self._tries[k] = tries + 1
            self.trace.write("chunk_retried", chunk=k, attempt=tries + 2, error=f"{type(exc).__name__}: {first}")
            _log.warning("chunk %d: its Ray worker died (%s); running it again (retry %d of %d)", k,
                         type(exc).__name__, tries + 1, self.settings.ray_retries)
            submit(k)
            return
        if self.stop is None:
            spent = f" after {tries} retries" if died else ""
            self.stop = RunEnding(RunStatus.FAILED, f"chunk {k} failed in Ray{spent} ({type(exc).__name__}: {first})")

    def _lost(self, limiter: ClusterLimiter, k: int, tag: str) -> None:
        """An attempt that gave back no result: its calls' usage into the run's meter, its settled
        batch attempts into the journal, both kept for the chunk's next attempt (from the ledger)."""
        ledger = limiter.left(tag)
        if ledger.usage:
            _absorb_usage(ledger.usage, self.meter, self.role_models)
            spent = self._spent.setdefault(k, {})
            for role, usage in ledger.usage.items():
                spent[role] = spent.get(role, Usage()) + usage
        # renumbered as the chunk's execution; a continued execution has no start of its own
        entries = [e.model_copy(update={"execution": k + 1}) for e in ledger.entries]
        self._carried.setdefault(k, []).extend(entries)
        if self.journal is not None:
            for entry in entries:
                self.journal.append(entry)


class DriverMeter(ClusterMeter):
    """The run's meter in the driver of an `ask` on Ray: its own calls (the manager's, and any
    execution run here) are charged to the cluster's sum and checked against it, like a worker's;
    what a chunk spent is added (`absorb`) without charging it again, since its worker did."""

    def absorb(self, role: str, model_id: str, usage: Usage) -> None:
        """Add a chunk's usage to the run's record only."""
        UsageMeter.record(self, role, model_id, usage)


class RayExecutor:
    """`--executor ray[:ADDRESS]`: the Ray implementation of `session.executor.Executor`.

    A `mapreduce run` hands it a plain decision wider than one chunk (`chunk_batches`), which it
    runs on a cluster limiter of its own (`run_wide`). An `ask` attaches it for the whole run
    (`attach`): Ray joined, one cluster limiter charged with what the run's meter holds, installed
    for every model built inside (the manager's rate window and breaker are the chunks'), and a
    `DriverMeter` for the run; then a decision of more than `CHUNK_BATCHES_PER_WORKER` batches per
    sub-agent thread runs in chunks on that limiter (a manager's plan is always within the batch
    cap, so the cap cannot be the chunk).
    """

    def __init__(self, spec: ExecutorSpec) -> None:
        self.spec = spec
        self._limits: ClusterLimits | None = None
        """The attached run's cluster limiter (None: not attached)."""

    def check(self) -> None:
        """Refuse when the `ray` extra is missing, or the cluster at the spec's address does not
        answer or turns this driver away (`check_cluster`): exit 2, before anything is made."""
        require_ray()
        check_cluster(self.spec.address)

    def chunk_batches(self, settings: Settings) -> int:
        """Batches per chunk: an attached `ask`'s `CHUNK_BATCHES_PER_WORKER` per worker, else `chunk_batches`."""
        return CHUNK_BATCHES_PER_WORKER * settings.workers if self._limits is not None else chunk_batches(settings)

    @contextlib.contextmanager
    def attach(self, meter: UsageMeter) -> Iterator[UsageMeter]:
        """Inside: Ray joined at the spec's address (`ray_session`), one cluster limiter charged
        with what `meter` holds against its budget, installed for every model built here
        (`cluster_limits`); yields a `DriverMeter` with `meter`'s budget and prices for the run.

        Raises:
            ConfigError: the `ray` extra is missing or Ray cannot be reached.
        """
        with ray_session(self.spec.address):
            limiter = ClusterLimiter.start(budget=meter.budget, spent=meter.total())
            try:
                driver = DriverMeter(limiter.actor, meter.budget, prices=meter.prices)
                with cluster_limits(limiter.limits):
                    self._limits = limiter.limits
                    yield driver
            finally:
                self._limits = None
                limiter.stop()

    def run_wide(self, decision: Decision, plan: BatchPlan, settings: Settings, *, meter: UsageMeter,
                 trace: Trace, journal: EntrySink | None = None, saved: Sequence[JournalEntry] = (),
                 size: int | None = None) -> WideRun:
        """`run_wide` on this executor's cluster (an attached run's limiter, else one of its own)."""
        roles = {role: model for role in ("subagent", "extraction") if (model := model_for_role(settings, role))}
        return run_wide(decision, plan, settings, meter=meter, trace=trace, address=self.spec.address,
                        role_models=roles, journal=journal, saved=saved, limits=self._limits, size=size)


def _journal(journal: EntrySink, chunk: ChunkRun, *, before: dict[str, Usage]) -> None:
    """A chunk that came back into the run's journal: its engine's entries as execution
    `chunk + 1`, then, if it ran to its end, `ChunkFinished` with the usage of all its attempts
    (`before`: its dead ones'; a stopped chunk's attempts are kept: a resume goes on from them)."""
    number = chunk.index + 1
    for entry in chunk.entries:
        journal.append(entry.model_copy(update={"execution": number}))
    if not chunk.result.ending.status.ended_early:
        usage = dict(before)
        for role, used in chunk.usage.items():
            usage[role] = usage.get(role, Usage()) + used
        journal.append(ChunkFinished(chunk=chunk.index, execution=number, usage=usage))


def _absorb_usage(usage: dict[str, Usage], meter: UsageMeter, role_models: dict[str, str]) -> None:
    """Usage a chunk's attempt spent, by role, into the run's meter (priced there by its model)."""
    add = meter.absorb if isinstance(meter, DriverMeter) else meter.record
    for role, used in usage.items():
        add(role, role_models.get(role, "unknown"), dataclasses.replace(used, cost_usd=0.0))


def _absorb(chunk: ChunkRun, meter: UsageMeter, trace: Trace, role_models: dict[str, str]) -> None:
    """A finished chunk's usage into the run's meter, its trace events into the run's trace."""
    _absorb_usage(chunk.usage, meter, role_models)
    if trace.enabled:
        for event, data in chunk.events:
            trace.write(event, **{**data, "chunk": chunk.index})


def _merged(
    decision: Decision,
    plan: BatchPlan,
    settings: Settings,
    chunks: Sequence[tuple[tuple[int, ...], ChunkRun]],
    stop: RunEnding | None,
    *,
    wall_s: float,
) -> MapReduceResult:
    """The chunks' rows in one table, in matrix order, by the conflict rule of a local reduce."""
    from amapreduce.mapreduce.engine import EngineConfig

    cfg = EngineConfig.from_settings(settings, decisions_by="user")
    table = cfg.table_for(decision)
    rows = [Row(cells=row.cells, task_index=mapped[row.task_index], strict_evidence=row.strict_evidence,
                origin=row.origin)
            for mapped, chunk in chunks for row in chunk.result.table.rows]
    for row in sorted(rows, key=lambda r: r.task_index):  # stable: a task's rows keep their order
        table.merge_row(row, fill=False)
    table.sort_by_task()
    completeness = Completeness.of(table, [decision])  # tasks of chunks that never finished are short
    summary = RunSummary.combined(table, completeness, [c.result.summary for _, c in chunks])
    summary = dataclasses.replace(summary, timings={**summary.timings, "wall_s": round(wall_s, 6)})
    attempts = tuple(a for _, c in chunks for a in c.result.attempts)
    return MapReduceResult(table=table, summary=summary, plan=plan, attempts=attempts,
                           ending=stop or RunEnding(completeness.status))
