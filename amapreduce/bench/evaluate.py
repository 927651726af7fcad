"""`amapreduce eval run`: run a benchmark end to end, score every answer, and let the memory learn.

Each (task, trial) is a whole `ask` run (manager, `mapreduce` tool, sub-agents), its answer is
written in the official layout (`DIR/trial{k}/<instance_id>.md`) and scored with the project's
scorer; then the memory protocol of paper App. D.5 runs:

* all trials of an instance read one frozen snapshot of the memory;
* after they finish, exactly one canonical trial (the highest utility u, `memory.protocol`) is
  committed: record + hint credit + pruning, then the distillation when the schedule says so.

**Order.** Commits happen in task order, one at a time, in the calling thread. With
`tasks_parallel = K`, instance i starts right after instance i−K has been committed and takes its
snapshot then, so it reads exactly the commits of instances 1..i−K whatever the threads' timing
(with K = 1 every instance sees every earlier one). The trials of one instance run one after the
other, each with a fresh simulated or real model.

**Where trials run.** In threads of this process, or (`remote`, `--executor ray`) as one Ray task
per (instance, trial) (`cluster.trials`): the trials of an instance then run at once, each over an
image of the instance's snapshot, and come back as plain data (`bench.trial`); answers, scores,
journal lines and commits stay here, in the same order, so both give the same results.

**Durability.** `DIR/journal.jsonl` (the one journal format, `amapreduce.journal`) records the
configuration, every finished trial (score, usage, prior, decision) and every commit. A killed
evaluation continues with `--resume`: finished trials are never rerun, and a commit is idempotent
in the store (its record id is derived from the evaluation and the instance), so an instance is
never committed twice even when the crash fell between the commit and its journal line. An
unfinished trial is rerun from scratch. With K > 1 the trials rerun after a crash read the memory
as it is at resume time (the snapshot of their killed siblings cannot be rebuilt).

**Stops.** On Ray the trials draw on one budget across the cluster (`RemoteTrials.shared_budget`).
Once it is spent (exit 4), on a refusal, or on Ctrl-C (exit 130) no trial starts and the remote
ones still running are cancelled; finished trials are journaled (one the budget cut short too, as
here), and `--resume` reruns the cancelled ones (what they spent is not journaled). Locally the
same stop starts no further trial and waits for the running ones (a thread cannot be cancelled).

**Refusal.** A trial whose run the provider refused for good (`ProviderRejected`: a wrong key, no
access, no such model, an invalid request; `RunEnding.rejected`) stops the whole evaluation
`failed` at once, since every later trial would be refused the same way: the refused trial is not
journaled (a `--resume` after fixing the key reruns it), finished trials and commits stay.

`results.json` is scored at the end by the very function `amapreduce eval score` uses, over the
trial folders, so rescoring them reproduces it exactly.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from amapreduce._atomic import write_json
from amapreduce.bench.commit import commit_trials, memory_size, open_memory, trial_done, write_memory_log
from amapreduce.bench.journal import (
    ENTRIES,
    JOURNAL,
    RESULTS,
    EvalConfig,
    EvalEnded,
    EvalStarted,
    InstanceCommitted,
    TrialDone,
    progress_event,
    results_document,
)
from amapreduce.bench.trial import (
    SimulatedModels,
    TrialJob,
    TrialRun,
    execute_trial,
    snapshot_image,
    write_run_files,
)
from amapreduce.errors import RunError, UserError
from amapreduce.journal import JournalWriter, read_journal
from amapreduce.progress import ProgressSink
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from amapreduce.bench.trial import RemoteTrials
    from amapreduce.evaluation.loaders import TaskSpec
    from amapreduce.evaluation.runner import EvalOptions
    from amapreduce.memory import ExperientialMemory
    from amapreduce.memory.protocol import InstanceSession
    from amapreduce.settings import Settings

__all__ = ["EvalRunOutcome", "run_benchmark"]

@dataclass(kw_only=True)
class EvalRunOutcome:
    """A finished, budget-stopped or refused (`failed`) evaluation."""

    out: Path
    status: Literal["complete", "stopped", "failed"]
    reason: str | None
    results: dict[str, Any]
    """The `results.json` document (empty when stopped before any task finished)."""


class _Budget:
    """The evaluation's `--max-cost`: trials start only while money is left."""

    def __init__(self, limit: float | None, spent: float) -> None:
        self.limit = limit
        self.spent = spent
        self._lock = threading.Lock()

    def add(self, cost: float) -> None:
        with self._lock:
            self.spent += cost

    def left(self) -> float | None:
        with self._lock:
            return None if self.limit is None else self.limit - self.spent


class _Stop(Exception):  # noqa: N818 - internal signal, never leaves this module
    """The budget ran out before a trial could start, or (`failed`) the provider refused a trial's run for good."""

    def __init__(self, reason: str, *, failed: bool = False) -> None:
        super().__init__(reason)
        self.failed = failed


@dataclass(kw_only=True)
class _State:
    """What the journal says is done, and the live counters of the progress line."""

    trials: dict[tuple[str, int], TrialDone] = field(default_factory=dict)
    committed: dict[str, InstanceCommitted] = field(default_factory=dict)
    memory_before: dict[str, int] = field(default_factory=dict)
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_benchmark(
    config: EvalConfig,
    *,
    out: Path,
    tasks: Mapping[str, TaskSpec],
    settings: Settings,
    options: EvalOptions,
    tasks_parallel: int = 1,
    simulated: SimulatedModels | None = None,
    memory_model: Any | None = None,
    resume: bool = False,
    progress: ProgressSink | None = None,
    remote: RemoteTrials | None = None,
) -> EvalRunOutcome:
    """Run (or resume) the evaluation `config` into `out`; see the module docstring.

    Args:
        config: what to evaluate (journaled; on resume it must equal the journaled one).
        out: the evaluation folder.
        tasks: the benchmark's tasks by id (must hold every id of `config.task_ids`).
        settings: the run settings of every trial (model, search backend, workers, limits).
        options: how answers are scored (the same object `eval score` builds).
        tasks_parallel: instances run at once (commits stay in task order).
        simulated: the simulated models of an offline run (None: the settings' real models).
        memory_model: the memory's projection/distillation model when not simulated (None: raw hints).
        resume: continue the evaluation journaled in `out`.
        progress: told of the evaluation's progress after every instance committed.
        remote: runs the trials elsewhere (`cluster.trials.RayTrials`); None: in threads here.

    Raises:
        UserError: `out` already holds an evaluation and `resume` is False, or holds a different
            one; `resume` without a journal; an unknown task id; `remote` with simulated models
            that cannot be rebuilt elsewhere.
    """
    unknown = [i for i in config.task_ids if i not in tasks]
    if unknown:
        raise UserError(f"unknown instance id(s) {unknown[:5]}: not in the tasks file. Check --ids.")
    if remote is not None and simulated is not None and simulated.rebuild is None:
        raise UserError("these simulated models cannot run on another executor (no `rebuild`); use --executor local.")
    journal_path = out / JOURNAL
    state = _State()
    if journal_path.exists():
        if not resume:
            raise UserError(f"{out} already holds an evaluation (its {JOURNAL}). Continue it with --resume, "
                            "or choose another --out.")
        _, entries = read_journal(journal_path, ENTRIES, kind="eval")
        saved = next((e.config for e in entries if isinstance(e, EvalStarted)), None)
        if saved is None:
            raise UserError(f"{journal_path} has no configuration entry; it is not a resumable evaluation.")
        changed = saved.differences(config.model_copy(update={"eval_id": saved.eval_id}))
        if changed:
            raise UserError(f"--resume: the command asks for a different evaluation than {out} holds "
                            f"(differs in {', '.join(changed)}). Rerun with the original options, or `eval run --resume "
                            f"{out}` alone.")
        config = saved
        for entry in entries:
            if isinstance(entry, EvalStarted):
                state.memory_before = dict(entry.memory_before)
            elif isinstance(entry, TrialDone):
                state.trials[(entry.task_id, entry.trial)] = entry
            elif isinstance(entry, InstanceCommitted):
                state.committed[entry.task_id] = entry
    elif resume:
        raise UserError(f"--resume: {out} holds no evaluation to continue (no {JOURNAL}).")
    out.mkdir(parents=True, exist_ok=True)
    for k in range(1, config.trials + 1):
        (out / f"trial{k}").mkdir(exist_ok=True)
    fresh = not journal_path.exists()
    memory, before = open_memory(config, simulated.memory_model if simulated is not None else memory_model)
    after = before
    budget = _Budget(config.max_cost_usd, sum(t.cost_usd for t in state.trials.values()))
    stopped: _Stop | None = None
    with JournalWriter(journal_path, kind="eval") as journal:
        if fresh:
            journal.append(EvalStarted(config=config, memory_before=before))
        before = state.memory_before or before
        runner = _TrialRunner(config=config, out=out, tasks=tasks, settings=settings, options=options,
                              simulated=simulated, journal=journal, state=state, budget=budget, remote=remote)
        shared = (remote.shared_budget(config.max_cost_usd, budget.spent) if remote is not None
                  else contextlib.nullcontext())
        try:
            with shared:
                stopped = _drive(config, runner, memory, journal, state, out, max(1, tasks_parallel), progress)
            if memory is not None:
                after = memory_size(memory)
        finally:
            if memory is not None:
                memory.close()
        results = results_document(config, out, tasks, options, state.trials, before=before, after=after) if state.trials else {}
        if stopped is None:
            write_json(out / RESULTS, results, indent=2)
        reason = None if stopped is None else str(stopped)
        journal.append(EvalEnded(status="stopped" if stopped else "complete", reason=reason))
    status: Literal["complete", "stopped", "failed"] = (
        "complete" if stopped is None else "failed" if stopped.failed else "stopped")
    return EvalRunOutcome(out=out, status=status, reason=reason, results=results)


def _drive(config: EvalConfig, runner: _TrialRunner, memory: ExperientialMemory | None, journal: JournalWriter,
           state: _State, out: Path, parallel: int, progress: ProgressSink | None) -> _Stop | None:
    """Start instances in task order (at most `parallel` uncommitted at once) and commit them in order;
    the first stop (budget or refusal) halts the runner and ends it once the started instances have
    settled (`_TrialRunner.halt`). Ctrl-C (or any error) halts it the same way, then propagates."""
    futures: dict[str, Future[list[TrialDone]]] = {}
    sessions: dict[str, InstanceSession | None] = {}
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="eval-task") as pool:
        try:
            stopped = _commit_in_order(config, runner, memory, journal, state, out, parallel, progress, pool,
                                       futures, sessions)
        except BaseException:  # Ctrl-C, or an error: no trial starts, remote ones are cancelled
            runner.halt(_Stop("interrupted"))
            wait_all(futures.values())  # the running trials are recorded (remote ones once cancelled)
            _close_sessions(sessions)
            raise
        try:
            for future in futures.values():  # a stop leaves started instances: let their trials settle
                try:
                    future.result()
                except _Stop as stop:
                    if stopped is None or (stop.failed and not stopped.failed):  # a refusal outranks a budget stop
                        stopped = stop
        finally:
            _close_sessions(sessions)
    return stopped or runner.halted  # a budget spent by the last trials, though each came back


def _close_sessions(sessions: dict[str, InstanceSession | None]) -> None:
    """Release the snapshots of instances that will not be committed in this run."""
    for session in sessions.values():
        if session is not None:
            session.snapshot.close()
    sessions.clear()


def _commit_in_order(config: EvalConfig, runner: _TrialRunner, memory: ExperientialMemory | None,
                     journal: JournalWriter, state: _State, out: Path, parallel: int,
                     progress: ProgressSink | None, pool: ThreadPoolExecutor,
                     futures: dict[str, Future[list[TrialDone]]],
                     sessions: dict[str, InstanceSession | None]) -> _Stop | None:
    """`_drive`'s loop: start instances, commit each in task order; the first `_Stop` halts the runner."""
    from amapreduce.memory.protocol import InstanceSession

    order = config.task_ids
    started = committed = 0
    stopped: _Stop | None = None
    while committed < len(order):
        while stopped is None and started < len(order) and started < committed + parallel:
            iid = order[started]
            started += 1
            if iid in state.committed:
                continue
            session = InstanceSession(memory, task_id=iid, query=runner.tasks[iid].query) if memory else None
            sessions[iid] = session
            # in a copy of this thread's context: an open trace span (`telemetry`) reaches the trials
            futures[iid] = pool.submit(contextvars.copy_context().run, runner.instance, iid,
                                       session.snapshot if session else None)
        iid = order[committed]
        if iid not in state.committed:
            if iid not in futures:
                break  # stopped before this instance started
            try:
                done = futures.pop(iid).result()
            except _Stop as stop:
                stopped = stop
                runner.halt(stop)
                session = sessions.pop(iid, None)
                if session is not None:
                    session.snapshot.close()
                break
            entry = commit_trials(config, iid, committed, done, sessions.pop(iid), memory, runner.tasks[iid].query)
            journal.append(entry)
            state.committed[iid] = entry
            write_memory_log(out, config, state.committed)
        committed += 1
        if progress is not None:
            with state.lock:
                event = progress_event(config, list(state.trials.values()), len(state.committed), state.running)
            progress(event)
    return stopped


@dataclass(kw_only=True)
class _TrialRunner:
    """Runs the trials of one instance (from a worker thread: here, or on Ray) and journals each one."""

    config: EvalConfig
    out: Path
    tasks: Mapping[str, TaskSpec]
    settings: Settings
    options: EvalOptions
    simulated: SimulatedModels | None
    journal: JournalWriter
    state: _State
    budget: _Budget
    remote: RemoteTrials | None = None
    halted: _Stop | None = None
    """Why the evaluation stops (`halt`): no trial starts from then on."""
    outstanding: dict[int, list[Any]] = field(default_factory=dict)
    """The remote trials of each instance thread, not yet collected (what `halt` cancels)."""

    def halt(self, stop: _Stop) -> None:
        """Stop the evaluation: no trial starts from now on, and the remote trials still running are
        cancelled (a finished one keeps its result and is recorded). A refusal outranks a budget stop."""
        with self.state.lock:
            if self.halted is None or (stop.failed and not self.halted.failed):
                self.halted = stop
            handles = [h for group in self.outstanding.values() for h in group]
        if self.remote is not None and handles:
            self.remote.cancel(handles)

    def _stop(self) -> _Stop:
        """A fresh `_Stop` saying why the evaluation halted (each instance thread raises its own)."""
        with self.state.lock:
            halted = self.halted
        if halted is None:
            raise RunError("a remote trial ended without a result, and nothing had stopped the evaluation; "
                           "continue with --resume")
        return _Stop(str(halted), failed=halted.failed)

    def instance(self, iid: str, snapshot: ExperientialMemory | None) -> list[TrialDone]:
        if self.remote is not None:
            return self._remote_instance(self.remote, iid, snapshot)
        done: list[TrialDone] = []
        for trial in range(1, self.config.trials + 1):
            finished = self._finished(iid, trial)
            if finished is None:
                job = self._job(iid, trial)
                self._running(1)
                finished = self.record(job, execute_trial(job, runs_dir=self._runs_dir(iid, trial),
                                                          simulated=self.simulated, prior_provider=snapshot))
            done.append(finished)
        return done

    def _remote_instance(self, remote: RemoteTrials, iid: str, snapshot: ExperientialMemory | None) -> list[TrialDone]:
        """The instance's unfinished trials at once, one remote task each, over one image of its
        snapshot; recorded here in trial order, as a local run records them.

        They draw on the evaluation's one budget (`RemoteTrials.shared_budget`) while they run; a
        halt cancels those still running, and the instance, short of trials, raises its `_Stop`.
        """
        jobs = [self._job(iid, trial) for trial in range(1, self.config.trials + 1) if self._finished(iid, trial) is None]
        if jobs:
            handles = remote.submit(jobs, snapshot_image(snapshot) if snapshot is not None else None)
            self._running(len(jobs))
            with self.state.lock:
                self.outstanding[id(handles)] = handles
                halted = self.halted is not None
            if halted:  # halted while these were submitted
                remote.cancel(handles)
            settled = 0
            try:
                for job, handle in zip(jobs, handles, strict=True):
                    run = self._collect(remote, handle)
                    settled += 1  # `record` settles the running count, also when it stops the evaluation
                    if run is None:
                        self._running(-1)
                    else:
                        self.record(job, run)
            except BaseException:
                remote.cancel(handles[settled:])
                self._running(settled - len(jobs))
                raise
            finally:
                with self.state.lock:
                    self.outstanding.pop(id(handles), None)
        done = [d for trial in range(1, self.config.trials + 1) if (d := self._finished(iid, trial)) is not None]
        if len(done) < self.config.trials:
            raise self._stop()
        return done

    def _collect(self, remote: RemoteTrials, handle: Any) -> TrialRun | None:
        """A remote trial's run; None for one a halt cancelled (or interrupted: it is not finished)."""
        try:
            run = remote.result(handle)
        except RunError:
            with self.state.lock:
                if self.halted is None:
                    raise
            return None
        from amapreduce.mapreduce.result import RunEnding, RunStatus

        return None if RunEnding.status_of_label(run.status) is RunStatus.INTERRUPTED else run

    def _finished(self, iid: str, trial: int) -> TrialDone | None:
        with self.state.lock:
            return self.state.trials.get((iid, trial))

    def _running(self, change: int) -> None:
        with self.state.lock:
            self.state.running += change

    def _runs_dir(self, iid: str, trial: int) -> Path:
        return self.out / "runs" / iid / f"trial{trial}"

    def _job(self, iid: str, trial: int) -> TrialJob:
        """The trial as plain data, with the budget left now (a `_Stop` when none is, or when the
        evaluation is halted)."""
        with self.state.lock:
            halted = self.halted is not None
        if halted:
            raise self._stop()
        left = self._budget_stop()
        settings = self.settings if left is None else self.settings.model_copy(update={"max_cost_usd": left})
        return TrialJob(task_id=iid, trial=trial, query=self.tasks[iid].query, settings=settings,
                        memory_config=self.config.memory_config, enrich=self.tasks[iid].enrich,
                        models=self.simulated.rebuild if self.simulated is not None else None)

    def _budget_stop(self) -> float | None:
        """The budget left (None: no `--max-cost`); a `_Stop` when it is spent. On a cluster the
        spend is the cluster's own sum, the calls of running trials included."""
        limit, left = self.budget.limit, self.budget.left()
        if limit is None or left is None:
            return None
        cluster = self.remote.spent() if self.remote is not None else None
        spent = limit - left if cluster is None else max(cluster, limit - left)
        left = limit - spent
        if left <= 0:
            raise _Stop(f"--max-cost ${self.config.max_cost_usd} reached (spent ${spent:.4f}); "
                        "continue with --resume and a larger --max-cost")
        return left

    def record(self, job: TrialJob, run: TrialRun) -> TrialDone:
        """Write the trial's answer (and a remote trial's run folder), score it and journal it."""
        iid, trial = job.task_id, job.trial
        if run.refused is not None:
            self._refused(run.refused)
        run = write_run_files(run, self._runs_dir(iid, trial))
        done = trial_done(self.config, self.out, self.tasks, self.options, iid, trial, run)
        self.journal.append(done)
        self.budget.add(done.cost_usd)
        with self.state.lock:
            self.state.trials[(iid, trial)] = done
            self.state.running -= 1
        if self.remote is not None:  # the cluster's budget spent: the trials still running are cancelled
            try:
                self._budget_stop()
            except _Stop as stop:
                self.halt(stop)
        return done

    def _refused(self, reason: str) -> None:
        """Stop the evaluation on a trial the provider refused for good (the trial is not journaled)."""
        with self.state.lock:
            self.state.running -= 1
        stop = _Stop(f"{redact_secrets(reason)}; fix it and continue with --resume", failed=True)
        self.halt(stop)
        raise stop


