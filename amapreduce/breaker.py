"""The one circuit breaker: an outage of a service ends a run in bounded time.

Why. Retries (`_retry`) are right for one request's bad luck and wrong for an outage: with a
model provider or a search backend down, every worker spends every retry and backoff of every
call, and a run takes workers × attempts × backoff to fail (an `ask` against an unreachable search
backend once ran 31 manager steps, each one a DNS error, before it gave up). The breaker sees the
whole process at once: every caller of one service shares it, like the service's rate limiter.
Why here, in the foundation: model providers (`llm.breaker`) and search backends and crawled
hosts (`web`) need the same breaker, as they need the same retry loop and rate limiter.

What counts. The caller says, for each request, whether it failed because the service did not
answer (an *outage failure*: a server error, a timeout, a connection or DNS error) or not (a
reply, a 429, a refused request, an empty result: the service is up). Requests are counted, not
calls: each attempt, retries included, so an outage is detected after K requests, not after
every worker has spent its retries.

States. *Closed*: requests go out. After `failures` outage failures in a row the breaker
*opens*: nothing is sent, and callers wait. After `cooldown_s` it is *half-open*: exactly one
probe request goes out while the others keep waiting; an answer closes the breaker, an outage
failure re-opens it for another cool-down. A caller waits at most until `max_wait_s` after the
outage began (when the breaker first opened), then gets the breaker's *unavailable* error at
once; so a run whose service stays down ends about K requests plus `max_wait_s` after the outage
began (`max_wait_s=0`: calls fail at once while the breaker is open). The probe still goes out
after each cool-down, so a process that outlives the outage recovers.

The error. Each breaker is given the function that builds its error from the `Outage` (which
service, how many failures, the last one, how long): a model provider's is `ProviderUnavailable`
(the default), a search backend's `SearchUnavailable` (both stop the run), a crawled host's a
plain failed fetch (another source will do).

Sharing. `shared_breaker(key, policy)` returns the process-wide breaker of a key (a provider
`host:port` or `openai`, a search backend `search:NAME`), with `ratelimit.shared_limiter`'s rule:
the same policy returns the same breaker, a different one raises `ConfigError`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from amapreduce.errors import ConfigError, ProviderUnavailable

__all__ = [
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreaker",
    "Outage",
    "Unavailable",
    "forget_shared_breakers",
    "provider_unavailable",
    "shared_breaker",
]


@dataclass(frozen=True)
class BreakerPolicy:
    """When a breaker opens, how long it stays open, how long callers wait on it.

    A model provider's values come from `Settings` (`breaker_failures`, `breaker_cooldown_s`,
    `breaker_max_wait_s`), a search backend's from `search_breaker_*`, a crawled host's from
    `crawl_breaker_*`; their defaults are written there.
    """

    failures: int
    """Outage failures in a row that open the breaker."""
    cooldown_s: float
    """Seconds the breaker stays open before one probe request is let through."""
    max_wait_s: float
    """Seconds after the outage began that a caller may still wait; then it fails at once."""

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"`failures` must be >= 1, got {self.failures}")
        for name, value in (("cooldown_s", self.cooldown_s), ("max_wait_s", self.max_wait_s)):
            if not 0 <= value < float("inf"):
                raise ValueError(f"`{name}` must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class Outage:
    """What an open breaker knows when it turns a caller away; its error is built from this."""

    key: str
    """The breaker's key (the service)."""
    failures: int
    """Outage failures in a row."""
    last_error: str | None
    """The last one, on one line and capped (the caller's description, credentials redacted)."""
    lasted_s: float
    """Seconds since the breaker first opened."""


Unavailable = Callable[[Outage], Exception]
"""Builds the error an open breaker raises; its message is the run's one-line reason."""


def provider_unavailable(outage: Outage) -> ProviderUnavailable:
    """A model provider's breaker error (the default): the run stops `failed` with this line."""
    return ProviderUnavailable(
        f"provider {outage.key!r} is unavailable: {outage.failures} requests in a row failed "
        f"(last: {outage.last_error}) and it has not answered for {outage.lasted_s:.0f} s. "
        "Check the provider's status; AMAPREDUCE_BREAKER_MAX_WAIT_S sets how long a run waits for it.",
        provider=outage.key,
        failures=outage.failures,
        last_error=outage.last_error,
    )


class BreakerState(StrEnum):
    """Where a breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """One service's breaker, shared by every thread that calls the service.

    A caller asks `admit()` before each request (it may wait, or raise the breaker's error) and
    reports the request's outcome with `record` (or `release` when the request never finished,
    e.g. on Ctrl-C, or never reached the service).

    Args:
        key: the service, named in the error.
        policy: when to open, how long to stay open, how long callers wait.
        unavailable: builds the error an open breaker raises (default: `provider_unavailable`).
        clock, sleep: injectable for tests.
    """

    def __init__(
        self,
        key: str,
        policy: BreakerPolicy,
        *,
        unavailable: Unavailable = provider_unavailable,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.key = key
        self.policy = policy
        self._unavailable_error = unavailable
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._last_error: str | None = None
        self._outage_began = 0.0
        self._probe_at = 0.0

    @property
    def state(self) -> BreakerState:
        """The current state (for tests and progress displays)."""
        with self._lock:
            return self._state

    def admit(self) -> bool:
        """Wait until a request may be sent; True when it is the half-open probe.

        Raises:
            Exception: the breaker's error (see `unavailable`): the breaker is open and the outage
                began `max_wait_s` ago or more; nothing was sent.
        """
        with self._lock:
            while True:
                now = self._clock()
                if self._state is BreakerState.CLOSED:
                    return False
                if self._state is BreakerState.OPEN and now >= self._probe_at:
                    self._state = BreakerState.HALF_OPEN
                    return True
                deadline = self._outage_began + self.policy.max_wait_s
                if now >= deadline:
                    raise self._unavailable(now)
                until_probe = self._probe_at - now if self._state is BreakerState.OPEN else 1.0
                self._lock.release()
                try:
                    self._sleep(min(until_probe, deadline - now, 1.0))
                finally:
                    self._lock.acquire()

    def record(self, probe: bool, outage: str | None) -> None:
        """Report a request's outcome: `outage` describes an outage failure, None means the
        service answered. `probe` is what `admit` returned for the request."""
        with self._lock:
            if outage is None:
                self._state, self._failures, self._last_error = BreakerState.CLOSED, 0, None
                return
            now = self._clock()
            self._failures += 1
            self._last_error = " ".join(outage.split())[:300]
            if self._state is BreakerState.CLOSED and self._failures >= self.policy.failures:
                self._state, self._outage_began, self._probe_at = (
                    BreakerState.OPEN,
                    now,
                    now + self.policy.cooldown_s,
                )
            elif probe and self._state is BreakerState.HALF_OPEN:
                self._state, self._probe_at = BreakerState.OPEN, now + self.policy.cooldown_s

    def release(self, probe: bool) -> None:
        """A request ended without an outcome (interrupted, or never sent): a probe's turn passes
        to the next caller."""
        with self._lock:
            if probe and self._state is BreakerState.HALF_OPEN:
                self._state = BreakerState.OPEN

    def _unavailable(self, now: float) -> Exception:
        return self._unavailable_error(
            Outage(key=self.key, failures=self._failures, last_error=self._last_error, lasted_s=now - self._outage_began)
        )


_BREAKERS: dict[str, CircuitBreaker] = {}
_BREAKERS_LOCK = threading.Lock()


def shared_breaker(key: str, policy: BreakerPolicy, *, unavailable: Unavailable = provider_unavailable) -> CircuitBreaker:
    """The process-wide breaker of service `key` under `policy`, created on first use (with
    `unavailable` as its error; callers of one key pass the same one).

    Raises:
        ConfigError: `key` already has a breaker with a different policy.
    """
    with _BREAKERS_LOCK:
        breaker = _BREAKERS.get(key)
        if breaker is None:
            breaker = _BREAKERS[key] = CircuitBreaker(key, policy, unavailable=unavailable)
        elif breaker.policy != policy:
            raise ConfigError(
                f"circuit breaker of {key!r} is already {breaker.policy}, got {policy}. One process shares one "
                "breaker per provider or search backend: give every caller the same AMAPREDUCE_BREAKER_* "
                "(AMAPREDUCE_SEARCH_BREAKER_*) settings.",
                key=key,
            )
        return breaker


def forget_shared_breakers() -> None:
    """Drop every process-wide breaker, so the next `shared_breaker` call starts a closed one.

    For a long-lived process that changes its breaker settings between runs (a notebook, a
    server), and for test isolation; models and backends built before keep the breaker they hold.
    """
    with _BREAKERS_LOCK:
        _BREAKERS.clear()
