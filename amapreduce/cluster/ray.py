"""Ray itself: imported here only, inside functions, when a command asked for `--executor ray`.

A missing `ray` extra is a `ConfigError` (exit 2) that names it; `ray_session` joins or starts
Ray for one command: `ray` alone starts a Ray instance on this machine (or joins the one
`RAY_ADDRESS` names); `ray:ADDRESS` joins a running cluster (`ray:auto`, `ray:HOST:6379`,
`ray:ray://HOST:10001`). A Ray this process had already started (a script, a test) is used as
it is and left running.

Ray's own output. Ray's driver prints the errors its cluster reports (a worker that died: "(raylet)
A worker died or was killed ...") to standard output, where `--json` writes its one object. When
Ray is imported here, those lines are sent to standard error instead (`_errors_to_stderr`), so
stdout holds only what amapreduce prints, whatever the workers do.

Token authentication. Ray 2.60 (the version amapreduce pins) turns on token authentication for clusters started with
`ray start`; a driver joins one only with `RAY_AUTH_MODE=token` exported and the cluster's token on
its machine (`~/.ray/auth_token`, `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`). Without them Ray
retries for about 20 s; `ray_session` asks the cluster's GCS first (`_check_auth`) and refuses in
under a second with one line naming those settings.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import socket
import sys
from collections.abc import Iterator
from typing import Any

from amapreduce.errors import ConfigError

__all__ = ["AUTH_HINT", "INSTALL_HINT", "RETRIED_ERRORS", "check_cluster", "ray_module", "ray_session", "require_ray",
           "worker_died"]

INSTALL_HINT = "pip install 'amapreduce[ray]'"
AUTH_HINT = ("export RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token (copy it from the head "
             "node, or `ray get-auth-token`), RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
"""How a driver joins a cluster that requires token authentication."""
RETRIED_ERRORS = frozenset({"WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError",
                            "OutOfMemoryError", "ActorDiedError"})
"""Names of the `ray.exceptions` that mean a task's worker or node died, not that its code failed."""


def ray_module() -> Any:
    """The `ray` module (imported here only: nothing else in amapreduce imports Ray).

    Raises:
        ConfigError: the `ray` extra is not installed.
    """
    try:
        ray = importlib.import_module("ray")
    except ImportError as exc:
        raise ConfigError(f"--executor ray needs the `ray` extra: {INSTALL_HINT} ({exc.name or exc} is not "
                          "installed), or use --executor local.") from None
    _errors_to_stderr()
    return ray


def _errors_to_stderr() -> None:
    """Send the cluster errors Ray's driver prints (`(raylet) A worker died ...`) to stderr, not stdout.

    Ray prints them from a thread of its own through `ray._private.worker.print_to_stdstream`,
    marked as standard output; the function is looked up at each call, so wrapping it here
    reroutes every later line. Nothing is done where this Ray has no such function.
    """
    worker = sys.modules.get("ray._private.worker")
    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_amapreduce_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix)

    to_stderr._amapreduce_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr  # type: ignore[union-attr]


def worker_died(exc: BaseException) -> bool:
    """`exc` (from `ray.get`) says the task's worker or node died (`RETRIED_ERRORS`): run it again."""
    return any(c.__name__ in RETRIED_ERRORS for c in type(exc).__mro__)


def require_ray() -> Any:
    """Check that Ray can be imported, before an evaluation folder is made; the `ray` module.

    Raises:
        ConfigError: the `ray` extra is not installed.
    """
    return ray_module()


def check_cluster(address: str | None) -> None:
    """Refuse a `HOST:PORT` nothing answers at, in seconds (Ray itself keeps retrying for minutes),
    or whose cluster turns this driver's token away (`_check_auth`). A run calls it before its folder
    is made, so a refused cluster is bad input (exit 2) that leaves nothing behind.

    Raises:
        ConfigError: the port does not accept a connection within 5 s, or the cluster requires
            token authentication this process cannot give.
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
    _check_auth(f"{host}:{port}")


def _check_auth(address: str) -> None:
    """Refuse, in under a second, a cluster whose GCS turns this driver's token (or its lack) away.

    Raises:
        ConfigError: the cluster requires token authentication this process cannot give.
    """
    ray = ray_module()
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Ray's own client of the GCS
    except ImportError:  # another Ray: `ray.init` reports it, more slowly
        return
    refused = getattr(ray.exceptions, "AuthenticationError", None)
    try:
        with _quiet_stderr():  # Ray's C++ client logs its refusal too: the one line is ours
            GcsClient(address=address)
    except Exception as exc:  # noqa: BLE001 - any other trouble is `ray.init`'s to report, in its own words
        if refused is not None and isinstance(exc, refused):
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            raise ConfigError(f"--executor ray:{address}: the cluster requires Ray token authentication, which "
                              f"this process does not give (RAY_AUTH_MODE is {mode}): {AUTH_HINT}.") from None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Inside: file descriptor 2 goes to /dev/null (a pre-flight check, before any thread of the run)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Inside: Ray is initialised (joined at `address`, or started here); yields the `ray` module.

    A Ray this call started (a local instance, or a connection to a cluster) is shut down on the
    way out; one this process had started before is left running.

    Raises:
        ConfigError: the `ray` extra is missing, or Ray cannot be reached at `address`.
    """
    ray = ray_module()
    owned = False
    if not ray.is_initialized():
        check_cluster(address)
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
