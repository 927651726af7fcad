"""`--executor local|ray[:ADDRESS]`: where an evaluation's trials run; the Ray side of `eval run`.

Local threads are the default and nothing imports Ray unless asked: Ray is imported only by the
Ray modules (this one, `cluster.limits`, `cluster.wide`), and there only inside functions, when a
command asked for `--executor ray`; a missing `ray` extra is a `ConfigError` (exit 2) that names it.

With `ray`, each (instance, trial) is one Ray task (`bench.trial.run_detached`, one CPU, never
retried by Ray itself: a trial spends money). A trial whose worker or node died
(`cluster.ray.worker_died`) is submitted again, up to `Settings.ray_retries` times
(`AMAPREDUCE_RAY_RETRIES`), and runs afresh on another worker (a trial is one `ask` run: its dead
worker's folder is gone with it); only then does the evaluation stop, and `--resume` reruns what
did not finish. The task
gets plain data (the trial's settings, the instance's snapshot image, put in the object store once
per instance, and how to reach the cluster's limiter) and returns plain data; the driver scores,
journals and commits (`bench.evaluate`). One `cluster.limits.ClusterLimiter` per evaluation
(`RayTrials.shared_budget`) holds the providers' windows and breakers and the evaluation's
`--max-cost`, so every trial's model calls, on any node, draw on one quota and one budget.
A stop (the budget, a refusal, Ctrl-C) cancels the trials still running (`ray.cancel`, which
raises `KeyboardInterrupt` in them, as Ctrl-C does in a local run); finished ones are kept.

`ray_session` joins or starts Ray for one command: `ray` alone starts a Ray instance on this
machine (or joins the one `RAY_ADDRESS` names); `ray:ADDRESS` joins a running cluster (`ray:auto`,
`ray:HOST:6379`, `ray:ray://HOST:10001`). A Ray this process had already started (a script, a
test) is used as it is and left running.

Every node must have amapreduce installed, and the files the settings name (a corpus index, a
prices file) at the same paths. The workers' own log lines stay in Ray's session logs
(`/tmp/ray/session_latest/logs`); a trial's run folder comes back to the evaluation folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amapreduce.bench.trial import (
    SimulatedModels,
    TrialJob,
    TrialRun,
    execute_trial,
    memory_model_for,
    open_snapshot_image,
)
from amapreduce.cluster.ray import ray_module as _ray
from amapreduce.cluster.ray import ray_session, worker_died
from amapreduce.errors import RunError

if TYPE_CHECKING:
    from amapreduce.cluster.limits import ClusterLimiter
    from amapreduce.llm.meter import Price, UsageMeter

__all__ = ["RayTrials", "TrialHandle", "run_detached"]

_log = logging.getLogger(__name__)


def run_detached(job: TrialJob, image: bytes | None) -> TrialRun:
    """Run a trial away from the driver (a Ray worker): build its models and its snapshot from
    plain data, run it in a scratch folder, and ship the run folder back in the result. With
    `job.limits`, its model calls draw on the cluster's windows, breakers and budget."""
    simulated = job.models() if job.models is not None else None
    with _cluster(job, simulated.prices_by_prefix if simulated is not None else None) as meter:
        return _detached(job, image, simulated, meter)


@contextlib.contextmanager
def _cluster(job: TrialJob, prices: Mapping[str, Price] | None) -> Iterator[UsageMeter | None]:
    """Inside: the cluster's limits in force, and the trial's meter charged to its budget (None:
    no limits; the trial meters itself as a local one)."""
    if job.limits is None:
        yield None
        return
    from amapreduce.cluster.limits import cluster_worker  # only where it runs

    with cluster_worker(job.limits, job.settings, prices_by_prefix=prices) as meter:
        yield meter


def _detached(job: TrialJob, image: bytes | None, simulated: SimulatedModels | None,
              meter: UsageMeter | None) -> TrialRun:
    with tempfile.TemporaryDirectory(prefix="amapreduce-trial-") as scratch:
        snapshot = None
        if image is not None:
            model = simulated.memory_model if simulated is not None else memory_model_for(job.settings)
            snapshot = open_snapshot_image(image, Path(scratch) / "memory", config=job.memory_config, model=model)
        try:
            run = execute_trial(job, runs_dir=Path(scratch) / "runs", simulated=simulated, prior_provider=snapshot,
                                meter=meter)
        finally:
            if snapshot is not None:
                snapshot.close()
        if run.run_dir is None:
            return run
        folder = Path(run.run_dir)
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return replace(run, run_dir=folder.name, files=files)


@dataclasses.dataclass
class TrialHandle:
    """A submitted trial: its job and snapshot (to submit it again), its task now, its retries."""

    job: TrialJob
    image: Any
    ref: Any
    retries: int = 0
    cancelled: bool = False


class RayTrials:
    """Trials as Ray tasks (`bench.trial.RemoteTrials`); open it, use it, close it."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._session = contextlib.ExitStack()
        self._task: Any = None
        self._limiter: ClusterLimiter | None = None

    def __enter__(self) -> RayTrials:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Join (or start) Ray (`ray_session`) and declare the trial task.

        Raises:
            ConfigError: the `ray` extra is missing, or Ray cannot be reached at `address`.
        """
        ray = self._session.enter_context(ray_session(self.address))
        self._task = ray.remote(num_cpus=1, max_retries=0)(run_detached)

    @contextlib.contextmanager
    def shared_budget(self, max_cost_usd: float | None, spent_usd: float) -> Iterator[None]:
        """Inside: one `ClusterLimiter` for the evaluation, charged with `spent_usd` (the journaled
        trials' cost, on a resume) against `max_cost_usd`; every trial submitted draws on it. The
        actor is stopped on the way out."""
        from amapreduce.cluster.limits import ClusterLimiter
        from amapreduce.llm.meter import Budget
        from amapreduce.llm.usage import Usage

        self._limiter = ClusterLimiter.start(budget=Budget(max_cost_usd=max_cost_usd),
                                             spent=Usage(cost_usd=spent_usd))
        try:
            yield
        finally:
            limiter, self._limiter = self._limiter, None
            limiter.stop()

    def spent(self) -> float | None:
        """Dollars the evaluation has spent across the cluster, calls of running trials included
        (None: outside `shared_budget`)."""
        return None if self._limiter is None else self._limiter.spent()[0]

    def submit(self, jobs: Sequence[TrialJob], image: bytes | None) -> list[Any]:
        """One task per job; the snapshot image goes to the object store once and is shared."""
        ray = _ray()
        shared = ray.put(image) if image is not None else None
        limits = self._limiter.limits if self._limiter is not None else None
        handles = []
        for job in jobs:
            mine = dataclasses.replace(job, limits=limits)
            handles.append(TrialHandle(job=mine, image=shared, ref=self._task.remote(mine, shared)))
        return handles

    def result(self, handle: TrialHandle) -> TrialRun:
        """The trial's run, once its task finished; a trial whose worker died runs again (see the
        module doc) until its retries are spent.

        Raises:
            RunError: the task failed in Ray (its worker died and its retries are spent, it was
                cancelled, it could not be unpickled); the evaluation stops and `--resume` reruns it.
        """
        ray = _ray()
        while True:
            try:
                run = ray.get(handle.ref)
                break
            except ray.exceptions.RayError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                died = worker_died(exc)
                if died and not handle.cancelled and handle.retries < handle.job.settings.ray_retries:
                    handle.retries += 1
                    _log.warning("trial %s/%d: its Ray worker died (%s); running it again (retry %d of %d)",
                                 handle.job.task_id, handle.job.trial, type(exc).__name__, handle.retries,
                                 handle.job.settings.ray_retries)
                    handle.ref = self._task.remote(handle.job, handle.image)
                    continue
                spent = f" after {handle.retries} retries" if died else ""
                raise RunError(f"a trial failed in Ray{spent} ({type(exc).__name__}: {first}); continue with "
                               "--resume") from exc
        if not isinstance(run, TrialRun):
            raise RunError(f"a Ray task returned {type(run).__name__}, not a trial's run")
        return run

    def cancel(self, handles: Sequence[TrialHandle]) -> None:
        """Cancel tasks whose results will not be read (finished ones are unaffected). A running
        trial gets `KeyboardInterrupt`, as Ctrl-C in a local run: its `ask` run ends `interrupted`."""
        ray = _ray()
        for handle in handles:
            handle.cancelled = True
            ray.cancel(handle.ref)

    def close(self) -> None:
        """Leave the Ray session (`ray_session`: a local instance this object started stops; a
        cluster keeps running; a Ray this process had started before is left alone)."""
        self._task = None
        self._session.close()
