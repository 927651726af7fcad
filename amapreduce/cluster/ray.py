"""Ray itself: imported here only, inside functions, when a command asked for `--executor ray`.

A missing `ray` extra is a `ConfigError` (exit 2) that names it; `ray_session` joins or starts
Ray for one command: `ray` alone starts a Ray instance on this machine (or joins the one
`RAY_ADDRESS` names); `ray:ADDRESS` joins a running cluster (`ray:auto`, `ray:HOST:6379`,
`ray:ray://HOST:10001`). A Ray this process had already started (a script, a test) is used as
it is and left running.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import socket
from collections.abc import Iterator
from typing import Any

from amapreduce.errors import ConfigError

__all__ = ["INSTALL_HINT", "ray_module", "ray_session", "require_ray"]

INSTALL_HINT = "pip install 'amapreduce[ray]'"


def ray_module() -> Any:
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
    return ray_module()


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
    ray = ray_module()
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
