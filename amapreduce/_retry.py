"""The one retry loop: exponential backoff with jitter, or exactly the wait a server's `Retry-After` asks.

Model calls (`amapreduce.llm.retry`) and search backends (`amapreduce.web.backends.base`) differ
only in which errors are worth retrying, how many attempts they make and what to raise when
giving up. Both plug those into `retry_loop` and keep `RetryPolicy`'s defaults for the backoff
cap, the jitter and the `Retry-After` limit, so no caller retries in lockstep or without bound.

`Retry-After` is a wait, not a floor under the exponential backoff: a server that says "retry in
1 s" four times in a row is retried after about 1 s each time (plus up to `RETRY_AFTER_SPREAD`), not
after 1, 2, 4 and 8 s. Exponential growth is kept for failures that carry no `Retry-After`. (A
model call's `Retry-After` also defers the provider's shared limiter, so every caller waits; the
retry itself is held neither by that deferral nor by those other callers' 429s set while it
waited: `ratelimit.WindowLimiter.acquire(skip_deferral=True)`. `benchmarks/bench_oracle.py`
measures the waits under its fault profile.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RETRY_AFTER_SPREAD", "RetryPolicy", "Transient", "parse_retry_after", "retry_loop"]

T = TypeVar("T")

RETRY_AFTER_SPREAD = 0.1
"""The most a `Retry-After` wait is lengthened, as a share of it (never more than the policy's
`jitter`): callers told the same wait do not all come back in the same instant."""


class RetryPolicy(BaseModel):
    """How a call is retried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_retries: int = Field(default=5, ge=0)
    """Retries after the first attempt."""
    base_delay_s: float = Field(default=1.0, ge=0)
    """First backoff; doubles each retry."""
    max_delay_s: float = Field(default=60.0, ge=0)
    """Cap on one backoff (a longer `Retry-After` is still honoured, up to `max_retry_after_s`)."""
    max_retry_after_s: float = Field(default=300.0, ge=0)
    """The longest `Retry-After` obeyed (a longer one is cut to this)."""
    jitter: float = Field(default=0.25, ge=0, le=1)
    """Random ± fraction added to each backoff so parallel callers do not retry in lockstep."""


@dataclass(frozen=True, kw_only=True)
class Transient:
    """Why an error may go away on retry."""

    kind: str
    """e.g. `rate_limit`, `server`, `timeout`, `connection`, `backend`."""
    retry_after_s: float | None = None
    """What the server asked us to wait, when it said."""


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait an HTTP reply asks for: `retry-after-ms`, else `retry-after` in seconds.

    None when neither is there or the value is an HTTP date or junk (our own backoff applies).
    """
    try:
        if headers.get("retry-after-ms") is not None:
            return float(headers["retry-after-ms"]) / 1000
        raw = headers.get("retry-after")
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


_JITTER = random.Random()
"""The jitter of every retry loop without its own `rng`: one generator, seeded once per process
(a `Random()` per call read the OS's entropy on every model call)."""


def retry_loop(
    call: Callable[[], T],
    *,
    policy: RetryPolicy,
    classify: Callable[[Exception], Transient | None],
    give_up: Callable[[Exception, int, Transient | None], BaseException],
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    on_retry: Callable[[int, Transient, float], Any] | None = None,
) -> T:
    """Run `call`, retrying the errors `classify` calls transient.

    Args:
        call: the operation.
        policy: backoff and attempt limits.
        classify: None for a permanent error, else why it may pass.
        give_up: the exception to raise for a permanent error (`transient` None) or after the
            last attempt; it receives the error and the number of attempts made (returning the
            error itself re-raises it unchanged).
        sleep, rng: injectable for tests.
        on_retry: told (attempt, why, delay) before each backoff.
    """
    rng = rng or _JITTER
    for attempt in range(policy.max_retries + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - classified; permanent errors go to give_up at once
            transient = classify(exc)
            if transient is None or attempt == policy.max_retries:
                failure = give_up(exc, attempt + 1, transient)
                if failure is exc:
                    raise
                raise failure from exc
            if transient.retry_after_s is not None:  # the server said how long: wait that, plus a little
                wait = min(max(0.0, transient.retry_after_s), policy.max_retry_after_s)
                backoff = wait * (1 + rng.uniform(0, min(policy.jitter, RETRY_AFTER_SPREAD)))
            else:
                backoff = min(policy.max_delay_s, policy.base_delay_s * 2**attempt)
                backoff *= 1 + rng.uniform(-policy.jitter, policy.jitter)
            if on_retry is not None:
                on_retry(attempt + 1, transient, backoff)
            sleep(backoff)
    raise RuntimeError("unreachable: the loop returns or raises")  # pragma: no cover
