"""`--executor local|ray[:ADDRESS]`: where an evaluation's trials run; everything Ray-specific is here.

Local threads are the default and nothing imports Ray unless asked: `import ray` happens only in
`RayTrials.open`, and a missing `ray` extra is a `ConfigError` (exit 2) that names it.

With `ray`, each (instance, trial) is one Ray task (`run.eval_trial.run_detached`, one CPU, never
retried: a trial spends money, and the driver reruns what did not finish on `--resume`). The task
gets plain data (the trial's settings, the instance's snapshot image, put in the object store once
per instance) and returns plain data; the driver scores, journals and commits (`run.evaluate`).
`ray` alone starts a Ray instance on this machine (or joins the one `RAY_ADDRESS` names);
`ray:ADDRESS` joins a running cluster (`ray:auto`, `ray:HOST:6379`, `ray:ray://HOST:10001`). A Ray
this process had already started (a script, a test) is used as it is and left running.

Every node must have amapreduce installed, and the files the settings name (a corpus index, a
prices file) at the same paths. The workers' own log lines stay in Ray's session logs
(`/tmp/ray/session_latest/logs`); a trial's run folder comes back to the evaluation folder.
"""

from __future__ import annotations

import importlib
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from amapreduce.errors import ConfigError, RunError
from amapreduce.run.eval_trial import TrialJob, TrialRun, run_detached

__all__ = ["EXECUTOR_VARIABLE", "INSTALL_HINT", "ExecutorSpec", "RayTrials", "parse_executor", "require_ray"]

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


def require_ray() -> None:
    """Check that Ray can be imported, before an evaluation folder is made.

    Raises:
        ConfigError: the `ray` extra is not installed.
    """
    _ray()


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


class RayTrials:
    """Trials as Ray tasks (`run.eval_trial.RemoteTrials`); open it, use it, close it."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._owned = False
        self._task: Any = None

    def __enter__(self) -> RayTrials:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Join (or start) Ray and declare the trial task.

        Raises:
            ConfigError: the `ray` extra is missing, or Ray cannot be reached at `address`.
        """
        ray = _ray()
        if not ray.is_initialized():
            _check_reachable(self.address)
            try:
                ray.init(address=self.address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray instance"
                raise ConfigError(f"--executor ray: could not start or join {where}: {exc}. Start a cluster "
                                  "with `ray start --head` (a cluster with token authentication also needs its "
                                  "token on this machine), or use --executor local.") from None
            self._owned = True
        self._task = ray.remote(num_cpus=1, max_retries=0)(run_detached)

    def submit(self, jobs: Sequence[TrialJob], image: bytes | None) -> list[Any]:
        """One task per job; the snapshot image goes to the object store once and is shared."""
        ray = _ray()
        shared = ray.put(image) if image is not None else None
        return [self._task.remote(job, shared) for job in jobs]

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
        """Cancel tasks whose results will not be read (finished ones are unaffected)."""
        ray = _ray()
        for handle in handles:
            ray.cancel(handle, force=True)

    def close(self) -> None:
        """Disconnect from the Ray this object started or joined (a local instance it started stops;
        a cluster keeps running; a Ray this process had started before is left alone)."""
        if self._owned:
            _ray().shutdown()
            self._owned = False
