"""One trial of `eval run` as plain data: what a trial needs in (`TrialJob`), what it gives back (`TrialRun`).

Why a module of its own: the same trial runs in two places. Locally, in a thread of the
evaluation's process (`bench.evaluate`); with `--executor ray`, in a Ray worker process, possibly on
another machine (`cluster.trials`). So everything that crosses is plain data (settings, strings,
numbers, bytes), never an engine, a lock, an open store or a model: the worker builds its parts
from the settings, as a local trial does.

What stays with the driver: the answer file, the score, the journal line and every memory commit
(`bench.evaluate`). The budget is the evaluation's: a remote trial reaches the cluster's limiter by
plain data (`TrialJob.limits`) and meters its calls against the one `--max-cost` of all trials. What a remote trial needs of the memory is its instance's frozen
snapshot, shipped as a SQLite database image (`snapshot_image`, read back by `open_snapshot_image`),
so a trial on Ray reads exactly what a local trial of the same instance reads. A remote trial's run
folder is written in a scratch folder of the worker and shipped back whole (`TrialRun.files`); the
driver writes it under the evaluation folder (`write_run_files`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from amapreduce._atomic import atomic_open
from amapreduce.errors import ProviderRejected, RunError, find_cause
from amapreduce.session.record import PriorRecord

if TYPE_CHECKING:
    from amapreduce.evaluation.loaders import EnrichSpec
    from amapreduce.llm.meter import Price, UsageMeter
    from amapreduce.llm.usage import Usage
    from amapreduce.memory import ExperientialMemory
    from amapreduce.session.outcome import RunOutcome
    from amapreduce.session.parts import InnerFactory
    from amapreduce.settings import Settings

__all__ = [
    "RemoteTrials",
    "SimulatedModels",
    "TrialJob",
    "TrialRun",
    "execute_trial",
    "memory_model_for",
    "open_snapshot_image",
    "snapshot_image",
    "write_run_files",
]


@dataclass(frozen=True, kw_only=True)
class SimulatedModels:
    """The simulated models of an offline evaluation (brought by the `demo` layer, never by this one)."""

    inner_for: Callable[[str, int], InnerFactory]
    """(instance id, trial) → the role → model factory of that trial's `ask` run."""
    memory_model: Any
    prices_by_prefix: Mapping[str, Price]
    rebuild: Callable[[], SimulatedModels] | None = None
    """A module-level function that builds these same models in another process (it crosses to a
    Ray worker by name); None: they cannot leave this one (`--executor ray` is refused)."""


@dataclass(frozen=True, kw_only=True)
class TrialJob:
    """One (instance, trial) to run: plain, picklable data."""

    task_id: str
    trial: int
    query: str
    settings: Settings
    """The trial's settings (its `max_cost_usd` is the evaluation budget left when it started)."""
    memory_config: Mapping[str, Any] = field(default_factory=dict)
    """`MemoryConfig` fields of the evaluation's memory (how the snapshot retrieves and projects)."""
    models: Callable[[], SimulatedModels] | None = None
    """Builds the simulated models of an offline evaluation in the process that runs the trial (a
    module-level function, so it crosses to a worker by name); None: the settings' real models."""
    enrich: EnrichSpec | None = None
    """An enrichment task's list: the trial runs `amapreduce enrich`'s session on it (no manager)."""
    limits: Any = None
    """How a remote trial reaches its executor's shared limiter (the providers' windows and
    breakers and the `--max-cost` every remote trial draws on): opaque here, the executor's own
    plain data (`cluster.limits.ClusterLimits`); None: the trial's own, as a local run."""


@dataclass(frozen=True, kw_only=True)
class TrialRun:
    """What one trial's `ask` run gave: everything the driver needs to score, journal and commit it."""

    status: str
    answer: str | None
    """The answer markdown (None: the run raised)."""
    failure: str | None = None
    refused: str | None = None
    """Why the provider refused the run for good (the evaluation stops; the trial is not journaled)."""
    usage: Usage | None = None
    prior: PriorRecord | None = None
    decision: dict[str, Any] | None = None
    subagents: int = 0
    completeness: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    """The `ask` run's wall time (the delay term of the utility)."""
    run_dir: str | None = None
    """The run folder, on the machine that ran the trial."""
    files: dict[str, bytes] | None = None
    """A remote trial's run folder, shipped back whole (path relative to the folder → content)."""


class RemoteTrials(Protocol):
    """Runs trials away from the driver (`cluster.trials.RayTrials`)."""

    def shared_budget(self, max_cost_usd: float | None, spent_usd: float) -> contextlib.AbstractContextManager[None]:
        """Inside: every trial submitted draws on one budget of `max_cost_usd`, `spent_usd` of it
        spent already, and on one quota per provider, whatever machine runs it."""

    def spent(self) -> float | None:
        """Dollars spent so far across the trials, running ones included (None: not known)."""

    def submit(self, jobs: Sequence[TrialJob], image: bytes | None) -> list[Any]:
        """Start `jobs` (the trials of one instance, sharing its snapshot `image`); one handle each."""

    def result(self, handle: Any) -> TrialRun:
        """Wait for one trial's run.

        Raises:
            RunError: the trial could not run there (its worker died, it was cancelled).
        """

    def cancel(self, handles: Sequence[Any]) -> None:
        """Stop trials whose results will not be read (a finished one keeps its result); a running
        one ends as a local trial ends on Ctrl-C, and `result` then raises `RunError` for it."""


def execute_trial(job: TrialJob, *, runs_dir: Path, simulated: SimulatedModels | None,
                  prior_provider: ExperientialMemory | None, meter: UsageMeter | None = None) -> TrialRun:
    """Run the trial's whole `ask` pipeline into a new folder under `runs_dir`; never raises for a
    failed run (it comes back with status `failed`), only for what stops this process
    (`KeyboardInterrupt`: Ctrl-C here, or a cancelled remote trial).

    `meter`: the run's meter (a remote trial's is charged to the cluster's budget); None: one from
    the settings, priced as the simulated models are when they run the trial."""
    from amapreduce.llm.factory import new_meter
    from amapreduce.session import RunOptions, Session
    from amapreduce.session.journal import RunKind

    settings = job.settings.model_copy(update={"runs_dir": runs_dir})
    inner: InnerFactory | None = simulated.inner_for(job.task_id, job.trial) if simulated is not None else None
    prices: Mapping[str, Price] | None = simulated.prices_by_prefix if simulated is not None else None
    if meter is None and prices is not None:
        meter = new_meter(settings, prices_by_prefix=prices)
    started = time.perf_counter()
    try:
        if job.enrich is not None:
            outcome = _enrich_trial(job.enrich, job, settings, inner=inner, meter=meter, prior_provider=prior_provider)
        else:
            session = Session(settings, RunOptions(kind=RunKind.EVAL, query=job.query, task_id=job.task_id,
                                                   trial=job.trial, inner=inner, meter=meter,
                                                   prior_provider=prior_provider, show_progress=False))
            with session:
                outcome = session.ask()
    except Exception as exc:  # noqa: BLE001 - a failed trial is recorded (status failed) and never committed
        refused = find_cause(exc, ProviderRejected)
        return TrialRun(status="failed", answer=None, failure=f"{type(exc).__name__}: {exc}",
                        refused=None if refused is None else str(refused),
                        wall_s=time.perf_counter() - started)
    wall = time.perf_counter() - started
    prior = outcome.prior
    return TrialRun(
        status=outcome.status, answer=outcome.markdown, usage=outcome.meter.total(),
        refused=(outcome.ending.reason or "the provider refused the run") if outcome.ending.rejected else None,
        prior=None if prior is None else PriorRecord.model_validate(prior.to_json()),
        decision=outcome.decisions[0].model_dump(mode="json") if outcome.decisions else None,
        subagents=outcome.record.completeness.attempts,
        completeness=outcome.record.completeness.model_dump(mode="json"), wall_s=wall, run_dir=str(outcome.run_dir.path),
    )


def _enrich_trial(spec: EnrichSpec, job: TrialJob, settings: Settings, *, inner: InnerFactory | None,
                  meter: UsageMeter | None, prior_provider: ExperientialMemory | None) -> RunOutcome:
    """An enrichment task's trial: its list read and enriched as `amapreduce enrich` does."""
    from amapreduce.enrichment import EnrichRequest, read_list, run_enrichment

    frame = read_list(spec.input, max_mb=settings.enrich_max_file_mb)
    request = EnrichRequest.of(frame, spec.columns, key_columns=spec.key_columns, label=job.task_id)
    return run_enrichment(request, settings, inner=inner, meter=meter, prior_provider=prior_provider,
                          task_id=job.task_id, query=job.query).outcome


def memory_model_for(settings: Settings) -> Any | None:
    """The memory's projection/distillation model of real-model settings (None: no memory role)."""
    from amapreduce.llm.factory import build_role_model, model_for_role, new_meter

    memory_id = model_for_role(settings, "memory")
    return build_role_model(settings, "memory", memory_id, meter=new_meter(settings)) if memory_id else None


def snapshot_image(snapshot: ExperientialMemory) -> bytes:
    """The frozen snapshot's database as bytes, exactly as the snapshot sees it.

    SQLite's backup reads through the snapshot's own connection, inside its open read
    transaction, so commits made to the live memory since the snapshot was taken are not in it.
    The image is marked as a rollback-journal database: an in-memory database cannot open a WAL one.
    """
    target = sqlite3.connect(":memory:")
    try:
        with snapshot.store.read() as conn:
            conn.backup(target)
        image = bytearray(target.serialize())
    finally:
        target.close()
    image[18:20] = b"\x01\x01"  # file format write/read versions: 1 = rollback journal, 2 = WAL
    return bytes(image)


def open_snapshot_image(image: bytes, folder: Path, *, config: Mapping[str, Any],
                        model: Any | None) -> ExperientialMemory:
    """A read-only memory over a `snapshot_image`, held in memory (`folder`: its vector index's
    scratch place; nothing is written there). Close it when the trial is done."""
    from amapreduce.memory import ExperientialMemory, MemoryConfig
    from amapreduce.memory.store import MemoryStore

    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.deserialize(image)
    conn.row_factory = sqlite3.Row  # as the store's own connections (`memory.schema.connect`)
    conn.execute("PRAGMA query_only = ON")
    store = MemoryStore(folder, readonly=True, connection=conn)
    return ExperientialMemory(store, config=MemoryConfig(**config), model=model)


def write_run_files(run: TrialRun, runs_dir: Path) -> TrialRun:
    """Write a remote trial's shipped run folder under `runs_dir` (same folder name); the result
    names the written folder. A local trial's result is returned as it is.

    Raises:
        RunError: the shipped folder name or a file path would leave `runs_dir`.
    """
    if run.files is None or run.run_dir is None:
        return run
    folder = runs_dir / run.run_dir
    if Path(run.run_dir).name != run.run_dir or run.run_dir in ("", ".", ".."):
        raise RunError(f"a remote trial sent back a run folder named {run.run_dir!r}; refusing to write it.")
    for name, content in run.files.items():
        path = (folder / name).resolve()
        if not path.is_relative_to(folder.resolve()):
            raise RunError(f"a remote trial sent back a file outside its run folder ({name!r}); refusing to write it.")
        with atomic_open(path, "wb") as handle:
            handle.write(content)
    return replace(run, run_dir=str(folder), files=None)
