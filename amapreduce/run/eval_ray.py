"""`--executor local|ray[:ADDRESS]`: where an evaluation's trials run; the Ray side of `eval run`.

Local threads are the default and nothing imports Ray unless asked: Ray is imported only by the
Ray modules (this one, `run.ray_limits`, `run.wide_ray`), and there only inside functions, when a
command asked for `--executor ray`; a missing `ray` extra is a `ConfigError` (exit 2) that names it.

With `ray`, each (instance, trial) is one Ray task (`run.eval_trial.run_detached`, one CPU, never
retried: a trial spends money, and the driver reruns what did not finish on `--resume`). The task
gets plain data (the trial's settings, the instance's snapshot image, put in the object store once
per instance, and how to reach the cluster's limiter) and returns plain data; the driver scores,
journals and commits (`run.evaluate`). One `run.ray_limits.ClusterLimiter` per evaluation
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
import importlib
import re
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from amapreduce.errors import ConfigError, RunError
from amapreduce.run.eval_trial import TrialJob, TrialRun, run_detached

if TYPE_CHECKING:
    from amapreduce.run.ray_limits import ClusterLimiter

__all__ = ["EXECUTOR_VARIABLE", "INSTALL_HINT", "ExecutorSpec", "RayTrials", "parse_executor", "ray_session",
           "require_ray"]

EXECUTOR_VARIABLE = "AMAPREDUCE_EXECUTOR"
"""The environment variable read when `--executor` is not given."""
INSTALL_HINT = "pip install 'amapreduce[ray]'"


@dataclass(frozen=True)
class ExecutorSpec:
    """A parsed `--executor` value."""

    kind: Literal["local", "ray"]
    address: str | None = None
    """The Ray cluster to join (None: start one here, or the one `RAY_ADDRESS` names)."""


def parse_executor(text: str, *, source: str = "--executor") -> ExecutorSpec:
    """`local`, `ray` or `ray:ADDRESS`.

    Raises:
        ConfigError: anything else (the message names `source`, the flag or the variable).
    """
    value = text.strip()
    if value == "local":
        return ExecutorSpec("local")
    if value == "ray":
        return ExecutorSpec("ray")
    if value.startswith("ray:") and value[4:].strip():
        return ExecutorSpec("ray", value[4:].strip())
    raise ConfigError(f"{source} {text!r}: use local, ray (a Ray instance on this machine) or ray:ADDRESS "
                      "(a running cluster, e.g. ray:auto or ray:HOST:6379).")


def _ray() -> Any:
    """The `ray` module (imported here only: nothing else in amapreduce imports Ray).

    Raises:
        ConfigError: the `ray` extra is not installed.
    """
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ConfigError(f"--executor ray needs the `ray` extra: {INSTALL_HINT} ({exc.name or exc} is not "
                          "installed), or use --executor local.") from None


def require_ray() -> Any:
    """Check that Ray can be imported, before an evaluation folder is made; the `ray` module.

    Raises:
        ConfigError: the `ray` extra is not installed.
    """
    return _ray()


def _check_reachable(address: str | None) -> None:
    """Refuse a `HOST:PORT` nothing answers at, in seconds: Ray itself keeps retrying for minutes.

    Raises:
        ConfigError: the port does not accept a connection within 5 s.
    """
    match = re.fullmatch(r"\[?([\w.:-]+?)\]?:(\d+)", address or "")
    if match is None:  # `auto`, `ray://...`, or no address: Ray resolves those itself
        return
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"--executor ray:{address}: nothing answers at {host}:{port} ({exc.strerror or exc}). "
                          "Start the cluster with `ray start --head --port PORT`, or check the address.") from None


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Inside: Ray is initialised (joined at `address`, or started here); yields the `ray` module.

    A Ray this call started (a local instance, or a connection to a cluster) is shut down on the
    way out; one this process had started before is left running.

    Raises:
        ConfigError: the `ray` extra is missing, or Ray cannot be reached at `address`.
    """
    ray = _ray()
    owned = False
    if not ray.is_initialized():
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
            raise ConfigError(f"--executor ray: could not start or join {where}: {exc}. Start a cluster "
                              "with `ray start --head` (a cluster with token authentication also needs its "
                              "token on this machine), or use --executor local.") from None
        owned = True
    try:
        yield ray
    finally:
        if owned:
            ray.shutdown()


class RayTrials:
    """Trials as Ray tasks (`run.eval_trial.RemoteTrials`); open it, use it, close it."""

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
        from amapreduce.llm.meter import Budget
        from amapreduce.llm.usage import Usage
        from amapreduce.run.ray_limits import ClusterLimiter

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
        return [self._task.remote(dataclasses.replace(job, limits=limits), shared) for job in jobs]

    def result(self, handle: Any) -> TrialRun:
        """The trial's run, once its task finished.

        Raises:
            RunError: the task failed in Ray (its worker died, it was cancelled, it could not be
                unpickled); the evaluation stops and `--resume` reruns the trial.
        """
        ray = _ray()
        try:
            run = ray.get(handle)
        except ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise RunError(f"a trial failed in Ray ({type(exc).__name__}: {first}); continue with --resume") from exc
        if not isinstance(run, TrialRun):
            raise RunError(f"a Ray task returned {type(run).__name__}, not a trial's run")
        return run

    def cancel(self, handles: Sequence[Any]) -> None:
        """Cancel tasks whose results will not be read (finished ones are unaffected). A running
        trial gets `KeyboardInterrupt`, as Ctrl-C in a local run: its `ask` run ends `interrupted`."""
        ray = _ray()
        for handle in handles:
            ray.cancel(handle)

    def close(self) -> None:
        """Leave the Ray session (`ray_session`: a local instance this object started stops; a
        cluster keeps running; a Ray this process had started before is left alone)."""
        self._task = None
        self._session.close()
