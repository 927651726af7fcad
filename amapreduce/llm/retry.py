"""Retries for model calls: classify the error, back off with jitter, honour `Retry-After`.

Errors are classified by exception type and status code (429 → rate limit, 5xx → server,
timeouts, connection errors), never by message text. After the last retry the caller gets a
`ModelCallError` that says what failed and how often — never a `None` reply (the reference
returned None after five failures and every caller then crashed on `.content`).

Each retry is also announced as a typed `ProviderRetry` event, so a progress display can count
provider retries without pretending they are engine progress.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from amapreduce._retry import RetryPolicy, Transient, parse_retry_after, retry_loop
from amapreduce.errors import RunError

__all__ = [
    "ModelCallError",
    "ProviderRetry",
    "ProviderRetryHandler",
    "RetryPolicy",
    "Transient",
    "call_with_retries",
    "classify",
]

T = TypeVar("T")


class ModelCallError(RunError):
    """A model call failed for good (a permanent error, or retries exhausted)."""


@dataclass(frozen=True, kw_only=True)
class ProviderRetry:
    """A model call that failed transiently and is about to be sent again.

    The same facts go to the trace as a `model_retry` event (`trace_fields`, plus the role,
    model id and the open usage scope's labels).
    """

    role: str
    """The role of the model that is retrying (`manager`, `subagent`, ...)."""
    model_id: str
    retry: int
    """Which retry this is: 1 for the first after the original attempt."""
    kind: str
    """Why the attempt may pass next time: `rate_limit`, `server`, `timeout` or `connection`."""
    delay_s: float
    """The backoff before the retry, in seconds."""
    error: str | None
    """The failed attempt's error (capped, credentials redacted)."""

    def trace_fields(self) -> dict[str, Any]:
        """The fields of the `model_retry` trace event that are the retry's own."""
        return {"retry": self.retry, "kind": self.kind, "delay_s": self.delay_s, "error": self.error}


ProviderRetryHandler: TypeAlias = Callable[[ProviderRetry], object]
"""Told of each `ProviderRetry` (e.g. to count retries in a progress display)."""


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or getattr(exc, "headers", None)
    return parse_retry_after(headers) if headers else None


def _status(exc: BaseException) -> int | None:
    for owner in (exc, getattr(exc, "response", None)):
        code = getattr(owner, "status_code", None)
        if isinstance(code, int):
            return code
    return None


def _named(exc: BaseException, *names: str) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)


def classify(exc: BaseException) -> Transient | None:
    """Whether `exc` is worth retrying (and how long the server wants us to wait)."""
    status = _status(exc)
    if status == 429 or _named(exc, "RateLimitError"):
        return Transient(kind="rate_limit", retry_after_s=_retry_after(exc))
    if (status is not None and status >= 500) or _named(exc, "InternalServerError", "ServiceUnavailableError"):
        return Transient(kind="server", retry_after_s=_retry_after(exc))
    if _named(exc, "APITimeoutError", "Timeout", "TimeoutException", "ReadTimeout", "ConnectTimeout") or isinstance(
        exc, TimeoutError
    ):
        return Transient(kind="timeout")
    if _named(exc, "APIConnectionError", "ConnectError", "ConnectionError") or isinstance(exc, ConnectionError):
        return Transient(kind="connection")
    return None


def call_with_retries(
    call: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    on_retry: Callable[[int, Transient, float], Any] | None = None,
) -> T:
    """Run a model call, retrying transient errors per `policy`.

    Raises:
        ModelCallError: a permanent error (immediately) or the last transient one; the original
            exception is chained as `__cause__`.
    """

    def give_up(exc: Exception, attempts: int, transient: Transient | None) -> ModelCallError:
        if transient is None:
            return ModelCallError(f"{what} failed: {type(exc).__name__}: {exc}", kind="permanent")
        return ModelCallError(
            f"{what} failed after {attempts} attempts ({transient.kind}): {type(exc).__name__}: {exc}. "
            "Check the provider's status and your rate limits, or lower --workers.",
            kind=transient.kind,
        )

    return retry_loop(call, policy=policy, classify=classify, give_up=give_up, sleep=sleep, rng=rng, on_retry=on_retry)
