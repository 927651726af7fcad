"""The one rate-limiting module: two policies, one process-wide registry.

Why two policies. Free search backends (ddgs, a public SearXNG) block bursts, so their calls are
*spaced*: at least `min_interval_s` between two calls (`SpacingPolicy`, `SpacingLimiter`). Model
providers publish quotas of requests and tokens per minute, so their calls are admitted by a
*sliding window*: a call may start when, counting it, no window holds more than `rpm` requests
or `tpm` tokens (`WindowPolicy`, `WindowLimiter`); bursts up to the quota are fine.

Why one registry. Many threads (the manager, dozens of sub-agents, the judge) call the same
backend or provider at once; the limit holds only if all of them share one limiter.
`shared_limiter(key, policy)` returns the process-wide limiter of a key (a backend name such as
`ddgs` or `searxng:URL`, a provider such as `openai` or `host:port`). Its rule when two callers
name the same key: the same policy returns the same limiter; a different policy raises
`ConfigError`. Silently keeping the first caller's limits, or letting the last caller change
them, would hide that two parts of one process disagree about a shared limit. Spacing and window
limiters are kept apart, so a backend and a provider may share a name without clashing.

Why a gate protocol. A model provider's limit is one quota however many processes call it: with
`--executor ray` the workers of a cluster must share one window, not hold one each (N processes
would get N times the quota). So model calls take their tickets from a `WindowGate`, which a
`WindowLimiter` of this process is, and which a cluster-wide limiter (a Ray actor, in
`cluster.limits`) is too. The gate also takes a provider's `Retry-After` (`defer`): a 429 tells
the caller that the provider refuses this key for a while, so every caller sharing the key waits
(except a retry that already waited the `Retry-After` of its own 429: `acquire(skip_deferral=True)`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, overload

from amapreduce.errors import ConfigError

__all__ = [
    "SpacingLimiter",
    "SpacingPolicy",
    "WindowGate",
    "WindowLimiter",
    "WindowPolicy",
    "forget_shared_limiters",
    "shared_limiter",
]

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class SpacingPolicy:
    """At least `min_interval_s` seconds between two calls (free search backends)."""

    min_interval_s: float

    def __post_init__(self) -> None:
        if self.min_interval_s < 0:
            raise ValueError(f"`min_interval_s` must be >= 0, got {self.min_interval_s}")


@dataclass(frozen=True)
class WindowPolicy:
    """At most `rpm` requests and `tpm` tokens in any `window_s` seconds (None: unlimited)."""

    rpm: int | None = None
    tpm: int | None = None
    window_s: float = 60.0

    def __post_init__(self) -> None:
        for name, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be >= 1 or None, got {value}")


class SpacingLimiter:
    """Spaces calls at least `policy.min_interval_s` apart across all threads."""

    def __init__(
        self, policy: SpacingPolicy, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next = 0.0

    def acquire(self) -> float:
        """Wait for this caller's slot; return the seconds waited."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.policy.min_interval_s
        wait = start - now
        if wait > 0:
            self._sleep(wait)
        return wait


class WindowGate(Protocol):
    """What a model call needs of its provider's limiter, wherever the limiter lives."""

    def acquire(self, tokens: int = 0, *, skip_deferral: bool = False) -> list[float]:
        """Block until a call of about `tokens` tokens may start; return its ticket
        (`[grant time, tokens]`, the time on the limiter's own clock). `skip_deferral`: a retry
        that already waited the `Retry-After` of its own 429 is held by the window only, not
        again by the deferrals (`defer`) other callers' 429s set meanwhile."""

    def settle(self, ticket: list[float], tokens: int) -> None:
        """Replace a ticket's estimate with the tokens the call really used."""

    def defer(self, seconds: float) -> None:
        """Admit no call for `seconds` from now (the provider's `Retry-After`)."""


class WindowLimiter:
    """Sliding-window limits on requests and tokens (`policy.rpm`, `policy.tpm`).

    Token counts are estimated before a call (`acquire`) and corrected when the real usage is
    known (`settle`). A provider's `Retry-After` holds every caller back (`defer`).
    """

    def __init__(
        self, policy: WindowPolicy, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep
    ) -> None:
        self.policy = policy
        self._clock, self._sleep = clock, sleep
        self._cond = threading.Condition()
        self._events: deque[list[float]] = deque()  # [start time, tokens] per admitted call
        self._resume_at = float("-inf")  # no call starts before this time (`defer`)

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.policy.window_s:
            self._events.popleft()

    def _wait_needed(self, now: float, tokens: int, *, deferred: bool = True) -> float:
        self._expire(now)
        rpm, tpm, window_s = self.policy.rpm, self.policy.tpm, self.policy.window_s
        waits = [0.0, self._resume_at - now] if deferred else [0.0]
        if rpm is not None and len(self._events) >= rpm:
            waits.append(self._events[len(self._events) - rpm][0] + window_s - now)
        if tpm is not None:
            used = sum(e[1] for e in self._events)
            if used + tokens > tpm and self._events:
                excess = used + tokens - tpm
                for start, spent in self._events:
                    excess -= spent
                    if excess <= 0:
                        waits.append(start + window_s - now)
                        break
                else:  # larger than the limit itself: wait for an empty window
                    waits.append(self._events[-1][0] + window_s - now)
        return max(waits)

    def acquire(self, tokens: int = 0, *, skip_deferral: bool = False) -> list[float]:
        """Block until a call of about `tokens` tokens may start; return its ticket.

        A single call larger than `tpm` is admitted once the window is empty (it could never
        fit otherwise). `skip_deferral`: the caller is a retry that already waited the
        `Retry-After` of its own 429, so only the window holds it. Why: a provider's `Retry-After`
        is a wait, not a floor (`amapreduce._retry`); were the retry held by the deferrals other
        callers' 429s set while it slept, each would add up to one more `Retry-After` to its wait
        (measured on the oracle's fault profile with a limiter: waits of 2.1 s for a 1 s
        `Retry-After`). Callers that met no 429 still wait for the deferral.
        """
        tokens = max(0, tokens)
        with self._cond:
            while True:
                now = self._clock()
                wait = self._wait_needed(now, tokens, deferred=not skip_deferral)
                if wait <= 0:
                    ticket = [now, float(tokens)]
                    self._events.append(ticket)
                    return ticket
                self._cond.release()
                try:
                    self._sleep(min(wait, 1.0))
                finally:
                    self._cond.acquire()

    def wait_s(self, tokens: int = 0) -> float:
        """How long a call of about `tokens` tokens would wait now (0: it would start at once);
        nothing is admitted."""
        with self._cond:
            return max(0.0, self._wait_needed(self._clock(), max(0, tokens)))

    def settle(self, ticket: list[float], tokens: int) -> None:
        """Replace a ticket's estimate with the tokens the call really used."""
        with self._cond:
            ticket[1] = float(max(0, tokens))

    def defer(self, seconds: float) -> None:
        """Admit no call for `seconds` from now (a provider's `Retry-After`); a shorter deferral
        than one already in force changes nothing."""
        if seconds > 0:
            with self._cond:
                self._resume_at = max(self._resume_at, self._clock() + seconds)

    def window_counts(self) -> tuple[int, float]:
        """(requests, tokens) in the current window (for tests and progress displays)."""
        with self._cond:
            self._expire(self._clock())
            return len(self._events), sum(e[1] for e in self._events)


_REGISTRY: dict[tuple[type, str], SpacingLimiter | WindowLimiter] = {}
_REGISTRY_LOCK = threading.Lock()


@overload
def shared_limiter(key: str, policy: SpacingPolicy) -> SpacingLimiter: ...
@overload
def shared_limiter(key: str, policy: WindowPolicy) -> WindowLimiter: ...
def shared_limiter(key: str, policy: SpacingPolicy | WindowPolicy) -> SpacingLimiter | WindowLimiter:
    """The process-wide limiter of `key` under `policy`, created on first use.

    Every caller that names the same key with an equal policy gets the same limiter.

    Raises:
        ConfigError: `key` already has a limiter with a different policy of the same kind.
    """
    with _REGISTRY_LOCK:
        limiter = _REGISTRY.get((type(policy), key))
        if limiter is None:
            limiter = SpacingLimiter(policy) if isinstance(policy, SpacingPolicy) else WindowLimiter(policy)
            _REGISTRY[(type(policy), key)] = limiter
        elif limiter.policy != policy:
            raise ConfigError(
                f"rate limit of {key!r} is already {limiter.policy}, got {policy}. One process shares one "
                "limiter per backend or provider: give every caller the same limits "
                "(AMAPREDUCE_SEARCH_MIN_INTERVAL_S, AMAPREDUCE_MODEL_RPM, AMAPREDUCE_MODEL_TPM).",
                key=key,
            )
        return limiter


def forget_shared_limiters() -> None:
    """Drop every process-wide limiter, so the next `shared_limiter` call may set new limits.

    For a long-lived process that changes its limits between runs (a notebook, a server: the
    same-key rule would otherwise refuse the new policy), and for test isolation; limiters
    already handed out keep working for their holders.
    """
    with _REGISTRY_LOCK:
        _REGISTRY.clear()
