"""A circuit breaker per model provider, so that a provider outage ends a run in bounded time.

Why. Retries (`llm.retry`) are right for one request's bad luck and wrong for an outage: with the
provider down, every worker spends every retry and backoff of every call, and a run takes
workers × attempts × backoff to fail. The breaker sees the whole process at once: every role and
every worker that calls one provider shares it, like the provider's rate limiter.

What counts. An *outage failure* is a request that failed because the provider did not answer:
a server error (5xx), a timeout or a connection error (`is_outage`). Requests are counted, not
calls: each HTTP attempt, retries included, so an outage is detected after K requests, not after
every worker has spent its retries. Any other outcome shows the provider is up and resets the
count: a reply, a 429 (rate limits are the limiter's and the retry loop's business), a refused
request (4xx).

States. *Closed*: requests go out. After `failures` outage failures in a row the breaker
*opens*: nothing is sent, and callers wait. After `cooldown_s` it is *half-open*: exactly one
probe request goes out while the others keep waiting; an answer closes the breaker, an outage
failure re-opens it for another cool-down. A caller waits at most until `max_wait_s` after the
outage began (when the breaker first opened), then raises `ProviderUnavailable` at once; so a
run whose provider stays down ends about K requests plus `max_wait_s` after the outage began
(`max_wait_s=0`: calls fail at once while the breaker is open). The probe still goes out after
each cool-down, so a process that outlives the outage recovers.

Sharing. `shared_breaker(key, policy)` returns the process-wide breaker of a provider key
(`llm.models.provider_of`), with `ratelimit.shared_limiter`'s rule: the same policy returns the
same breaker, a different one raises `ConfigError`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from amapreduce.errors import ConfigError, ProviderUnavailable
from amapreduce.llm.retry import classify

__all__ = [
    "OUTAGE_KINDS",
    "BreakerPolicy",
    "BreakerState",
    "CircuitBreaker",
    "forget_shared_breakers",
    "is_outage",
    "shared_breaker",
]

OUTAGE_KINDS = frozenset({"server", "timeout", "connection"})
"""The `Transient` kinds that mean the provider did not answer (a 429 is an answer)."""


def is_outage(exc: BaseException) -> bool:
    """Whether a failed request counts towards opening the breaker (5xx, timeout, connection)."""
    transient = classify(exc)
    return transient is not None and transient.kind in OUTAGE_KINDS


@dataclass(frozen=True)
class BreakerPolicy:
    """When a provider's breaker opens, how long it stays open, how long callers wait on it.

    Its values come from `Settings` (`breaker_failures`, `breaker_cooldown_s`,
    `breaker_max_wait_s`), where their defaults are written.
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


class BreakerState(StrEnum):
    """Where a breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """One provider's breaker, shared by every thread that calls the provider.

    A caller asks `admit()` before each request (it may wait, or raise `ProviderUnavailable`)
    and reports the request's outcome with `record` (or `release` when the request never
    finished, e.g. on Ctrl-C).

    Args:
        key: the provider (`llm.models.provider_of`), named in the error.
        policy: when to open, how long to stay open, how long callers wait.
        clock, sleep: injectable for tests.
    """

    def __init__(
        self,
        key: str,
        policy: BreakerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.key = key
        self.policy = policy
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
            ProviderUnavailable: the breaker is open and the outage began `max_wait_s` ago or
                more; nothing was sent.
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
        """Report a request's outcome: `outage` describes an outage failure (see `is_outage`),
        None means the provider answered. `probe` is what `admit` returned for the request."""
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
        """A request ended without an outcome (interrupted): a probe's turn passes to the next caller."""
        with self._lock:
            if probe and self._state is BreakerState.HALF_OPEN:
                self._state = BreakerState.OPEN

    def _unavailable(self, now: float) -> ProviderUnavailable:
        return ProviderUnavailable(
            f"provider {self.key!r} is unavailable: {self._failures} requests in a row failed "
            f"(last: {self._last_error}) and it has not answered for {now - self._outage_began:.0f} s. "
            "Check the provider's status; AMAPREDUCE_BREAKER_MAX_WAIT_S sets how long a run waits for it.",
            provider=self.key,
            failures=self._failures,
            last_error=self._last_error,
        )


_BREAKERS: dict[str, CircuitBreaker] = {}
_BREAKERS_LOCK = threading.Lock()


def shared_breaker(key: str, policy: BreakerPolicy) -> CircuitBreaker:
    """The process-wide breaker of provider `key` under `policy`, created on first use.

    Raises:
        ConfigError: `key` already has a breaker with a different policy.
    """
    with _BREAKERS_LOCK:
        breaker = _BREAKERS.get(key)
        if breaker is None:
            breaker = _BREAKERS[key] = CircuitBreaker(key, policy)
        elif breaker.policy != policy:
            raise ConfigError(
                f"circuit breaker of provider {key!r} is already {breaker.policy}, got {policy}. One process "
                "shares one breaker per provider: give every caller the same AMAPREDUCE_BREAKER_* settings.",
                key=key,
            )
        return breaker


def forget_shared_breakers() -> None:
    """Drop every process-wide breaker, so the next `shared_breaker` call starts a closed one.

    For a long-lived process that changes its `AMAPREDUCE_BREAKER_*` settings between runs (a
    notebook, a server), and for test isolation; models built before keep the breaker they hold.
    """
    with _BREAKERS_LOCK:
        _BREAKERS.clear()
