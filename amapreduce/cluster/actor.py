"""The cluster limiter's actor (`LimiterActor`): the state that one Ray actor holds for a whole run.

Why a module of its own. Ray starts the actor in a worker process of its own, which imports the
module of the actor's class before it can serve a call, while the run's first chunks (or trials)
start and import amapreduce in theirs, on the same CPUs. This module needs only the windows,
breakers, budget and usage records it keeps (`ratelimit`, `breaker`, `llm.meter`, `llm.usage`),
not the model layer (smolagents) that `cluster.limits` brings in for the workers' side, so the
actor is up after a fraction of that import (measured: 0.2 s of CPU against 0.7 s). What the
actor does, and the round trips it serves, is described in `cluster.limits`.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amapreduce.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Outage
from amapreduce.errors import ConfigError
from amapreduce.llm.meter import Budget
from amapreduce.llm.usage import Usage
from amapreduce.ratelimit import WindowLimiter, WindowPolicy

if TYPE_CHECKING:
    from amapreduce.journal import JournalEntry

__all__ = ["MAX_CONCURRENCY", "AttemptLedger", "CallState", "Deferred", "LimiterActor"]

MAX_CONCURRENCY = 1000
"""Callers the actor serves at once: every model call of the cluster in flight, waiting ones included."""


@dataclass(frozen=True)
class AttemptLedger:
    """What one attempt (`tag`) left in the actor: its calls' usage by role, the entries it settled."""

    usage: dict[str, Usage]
    entries: list[JournalEntry]


@dataclass(frozen=True)
class CallState:
    """Where the run stands, as the actor answers a call's `begin` and `end`."""

    cost_usd: float
    tokens: int
    halted: str | None
    """Why the driver halted the caller's run (None: it goes on)."""
    down: frozenset[str]
    """The providers whose breaker is not closed (a caller must ask the actor to be admitted)."""


@dataclass
class Deferred:
    """What a worker's gates left for the end of their model call, none of which a caller waits on:
    a window ticket's tokens (`settle`), a request that was answered (a closed breaker's
    `record(False, None)`)."""

    settled: list[tuple[str, WindowPolicy, int, int]] = dataclasses.field(default_factory=list)
    answered: list[tuple[str, BreakerPolicy]] = dataclasses.field(default_factory=list)


class _Refused(Exception):
    """Raised inside the actor by an open breaker; carries the outage back as plain data."""

    def __init__(self, outage: Outage) -> None:
        super().__init__(outage.key)
        self.outage = outage


def _refuse(outage: Outage) -> Exception:
    return _Refused(outage)


class LimiterActor:
    """The actor's class (made remote by `ClusterLimiter.start`): per-provider windows and breakers
    of this package, the run's spend, and the log of grants."""

    def __init__(self, budget: Budget, spent_usd: float, spent_tokens: int) -> None:
        self._budget = budget
        self._lock = threading.Lock()
        self._windows: dict[str, WindowLimiter] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._tickets: dict[int, list[float]] = {}
        self._next_ticket = 0
        self._grants: list[tuple[str, float]] = []
        self._spent = [spent_usd, float(spent_tokens)]
        self._usage: dict[str, dict[str, Usage]] = {}
        self._entries: dict[str, list[tuple[int, JournalEntry]]] = {}
        self._halted: dict[str, str] = {}
        """Why each halted wide run (by the first part of its attempts' tags) stopped."""

    def _window(self, key: str, policy: WindowPolicy) -> WindowLimiter:
        with self._lock:
            window = self._windows.setdefault(key, WindowLimiter(policy))
        if window.policy != policy:
            raise ConfigError(f"rate limit of {key!r} is already {window.policy}, got {policy}: give every worker "
                              "of the cluster the same AMAPREDUCE_MODEL_RPM and AMAPREDUCE_MODEL_TPM.", key=key)
        return window

    def acquire(self, key: str, policy: WindowPolicy, tokens: int, skip_deferral: bool = False) -> tuple[int, float]:
        """Wait for a turn in `key`'s window; (ticket number, grant time on the actor's clock).
        `skip_deferral` as in `WindowLimiter.acquire`."""
        window = self._window(key, policy)
        ticket = window.acquire(tokens, skip_deferral=skip_deferral)
        with self._lock:
            number, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._tickets[number] = ticket
            self._grants.append((key, ticket[0]))
            horizon = ticket[0] - policy.window_s
            if len(self._tickets) > 4 * MAX_CONCURRENCY:  # failed calls never settle: forget the expired
                self._tickets = {n: t for n, t in self._tickets.items() if t[0] > horizon}
        return number, ticket[0]

    def settle(self, key: str, policy: WindowPolicy, number: int, tokens: int) -> None:
        """The call of ticket `number` used `tokens` tokens."""
        self._settle(key, policy, number, tokens)

    def _settle(self, key: str, policy: WindowPolicy, number: int, tokens: int) -> None:
        with self._lock:
            ticket = self._tickets.pop(number, None)
        if ticket is not None:
            self._window(key, policy).settle(ticket, tokens)

    def defer(self, key: str, policy: WindowPolicy, seconds: float) -> None:
        """The provider asked for `seconds` of quiet (`Retry-After`): every worker waits."""
        self._window(key, policy).defer(seconds)

    def _breaker(self, key: str, policy: BreakerPolicy) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.setdefault(key, CircuitBreaker(key, policy, unavailable=_refuse))
        if breaker.policy != policy:
            raise ConfigError(f"circuit breaker of {key!r} is already {breaker.policy}, got {policy}: give every "
                              "worker of the cluster the same AMAPREDUCE_BREAKER_* settings.", key=key)
        return breaker

    def admit(self, key: str, policy: BreakerPolicy) -> tuple[bool, Outage | None]:
        """(probe, None) once a request may go out; (False, the outage) when the provider is down."""
        try:
            return self._breaker(key, policy).admit(), None
        except _Refused as refused:
            return False, refused.outage

    def record(self, key: str, policy: BreakerPolicy, probe: bool, outage: str | None) -> None:
        """A request's outcome (see `CircuitBreaker.record`)."""
        self._breaker(key, policy).record(probe, outage)

    def release(self, key: str, policy: BreakerPolicy, probe: bool) -> None:
        """A request ended without an outcome (see `CircuitBreaker.release`)."""
        self._breaker(key, policy).release(probe)

    def begin(self, tag: str | None, later: Deferred) -> CallState:
        """A model call starts: apply what the caller deferred (`Deferred`) and say where the run
        stands (`CallState`): one round trip for the budget check, the halt and the breaker."""
        self._apply(tag, later)
        return self._state(tag)

    def end(self, cost_usd: float, tokens: int, tag: str | None, role: str | None, usage: Usage | None,
            later: Deferred) -> CallState:
        """A model call ended: its spend (`spend`) and what its gates deferred, in one round trip;
        the `CallState` after them."""
        self._apply(tag, later)
        self._spend(cost_usd, tokens, tag, role, usage)
        return self._state(tag)

    def deliver(self, tag: str | None, later: Deferred) -> None:
        """What a caller deferred, ahead of its call's end (a retry's admission)."""
        self._apply(tag, later)

    def _apply(self, tag: str | None, later: Deferred) -> None:
        for key, window, number, tokens in later.settled:
            self._settle(key, window, number, tokens)
        for key, policy in later.answered:
            self._breaker(key, policy).record(False, None)

    def _state(self, tag: str | None) -> CallState:
        with self._lock:
            breakers = list(self._breakers.items())
            cost, tokens, why = self._spent[0], int(self._spent[1]), self._why(tag)
        down = frozenset(key for key, breaker in breakers if breaker.state is not BreakerState.CLOSED)
        return CallState(cost_usd=cost, tokens=tokens, halted=why, down=down)

    def spend(self, cost_usd: float, tokens: int, tag: str | None = None, role: str | None = None,
              usage: Usage | None = None) -> tuple[float, int]:
        """Add one call's spend (and, with a `tag`, its usage to that attempt's ledger); return the
        run's (dollars, tokens) so far."""
        return self._spend(cost_usd, tokens, tag, role, usage)

    def _spend(self, cost_usd: float, tokens: int, tag: str | None, role: str | None,
               usage: Usage | None) -> tuple[float, int]:
        with self._lock:
            self._spent[0] += cost_usd
            self._spent[1] += tokens
            if tag is not None and role is not None and usage is not None:
                mine = self._usage.setdefault(tag, {})
                mine[role] = mine.get(role, Usage()) + usage
            return self._spent[0], int(self._spent[1])

    def spent(self) -> tuple[float, int]:
        """The run's (dollars, tokens) so far, every worker's and what the driver had spent before."""
        with self._lock:
            return self._spent[0], int(self._spent[1])

    def state(self, tag: str | None = None) -> tuple[float, int, str | None]:
        """The run's (dollars, tokens) so far, and why the driver halted attempt `tag`'s run (None:
        it goes on)."""
        with self._lock:
            return self._spent[0], int(self._spent[1]), self._why(tag)

    def _why(self, tag: str | None) -> str | None:
        return None if tag is None else self._halted.get(tag.split(".", 1)[0])

    def keep(self, tag: str, number: int, entry: JournalEntry) -> None:
        """Entry `number` (0, 1, ... in journal order) that attempt `tag`'s engine journaled (its
        execution, a settled batch attempt); calls may arrive out of order."""
        with self._lock:
            self._entries.setdefault(tag, []).append((number, entry))

    def left(self, tag: str) -> AttemptLedger:
        """What attempt `tag` left: its calls' usage and its entries in journal order (forgotten
        here once read)."""
        with self._lock:
            entries = [entry for _, entry in sorted(self._entries.pop(tag, []), key=lambda kept: kept[0])]
            return AttemptLedger(usage=self._usage.pop(tag, {}), entries=entries)

    def forget(self, tag: str) -> None:
        """Attempt `tag` came back with its own record: drop the actor's copy."""
        with self._lock:
            self._usage.pop(tag, None)
            self._entries.pop(tag, None)

    def halt(self, run: str, reason: str) -> None:
        """Wide run `run` stops: every later `state` of its attempts says why (see the module doc)."""
        with self._lock:
            self._halted.setdefault(run, reason)

    def halted(self, tag: str) -> str | None:
        """Why attempt `tag`'s run was halted (None: it goes on)."""
        with self._lock:
            return self._why(tag)

    def budget(self) -> Budget:
        """The run's budget."""
        return self._budget

    def grants(self) -> list[tuple[str, float]]:
        """Every (provider, grant time) the windows gave, in grant order."""
        with self._lock:
            return list(self._grants)
