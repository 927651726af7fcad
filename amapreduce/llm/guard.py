"""A switch that refuses real model calls, for tests (pydantic-ai's `ALLOW_MODEL_REQUESTS` idea).

`block_model_requests()` patches smolagents' API-backed models so that any attempt to reach a
real provider raises `ModelRequestsBlocked` instead of silently spending money or hanging on a
closed network. Scripted models (`amapreduce.testing.scripted`) are not API models and keep working.
Code that must exercise the real client path against a loopback server opts in with
`allow_model_requests()`: process-wide (sub-agents call from worker threads), and even then
only for models whose endpoint is on 127.0.0.1/localhost/::1.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from amapreduce.errors import RunError

__all__ = ["ModelRequestsBlocked", "allow_model_requests", "block_model_requests", "model_requests_allowed"]

_lock = threading.Lock()
_blocked = False
_allowed = 0  # depth of active `allow_model_requests()` blocks
_originals: dict[str, Any] = {}


class ModelRequestsBlocked(RunError):
    """A real model call was attempted while model requests are blocked (under test)."""


def model_requests_allowed() -> bool:
    """Whether real model calls may go out right now."""
    return (not _blocked) or _allowed > 0


def _endpoint(model: Any) -> str:
    base = getattr(model, "api_base", None) or getattr(getattr(model, "client", None), "base_url", None)
    return str(base or "")


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def _guarded(name: str) -> Any:
    original = _originals[name]

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not model_requests_allowed() or (_blocked and not _is_loopback(_endpoint(self))):
            raise ModelRequestsBlocked(
                f"real model call to {type(self).__name__}(model_id={getattr(self, 'model_id', None)!r}) "
                "refused: model requests are blocked under test. Use a scripted model from "
                "`amapreduce.testing.scripted`, or wrap the call in `allow_model_requests()` for a loopback server."
            )
        return original(self, *args, **kwargs)

    return wrapper


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = [cls]
    sub: type
    for sub in cls.__subclasses__():
        found.extend(_all_subclasses(sub))
    return found


def block_model_requests() -> None:
    """Refuse every real smolagents API-model call from now on (idempotent)."""
    global _blocked
    from smolagents.models import ApiModel

    with _lock:
        if _blocked:
            return
        # Every concrete API model (OpenAI, LiteLLM, ...) overrides these; patch each override.
        classes = _all_subclasses(ApiModel)
        for cls in classes:
            for name in ("generate", "generate_stream"):
                if name in vars(cls):
                    key = f"{cls.__module__}.{cls.__qualname__}.{name}"
                    _originals[key] = vars(cls)[name]
                    setattr(cls, name, _guarded(key))
        _blocked = True


@contextlib.contextmanager
def allow_model_requests() -> Iterator[None]:
    """Let model calls to loopback endpoints through inside this block (all threads)."""
    global _allowed
    with _lock:
        _allowed += 1
    try:
        yield
    finally:
        with _lock:
            _allowed -= 1
