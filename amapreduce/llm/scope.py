"""Usage scopes: which model calls belong to one piece of work (a batch attempt), by context.

The meter adds every call to the run's totals; a scope additionally collects the calls made
*inside* it, in the current thread's context. The engine opens one around each sub-agent
attempt, so an attempt's usage is exactly what the meter charged for it — priced, and kept
even when the attempt fails or times out (its calls were billed all the same). Scope labels
(batch id, phase, attempt) are also written into each `model_call` trace event, so a model
call in the trace can be tied to its batch.

Context variables are per thread (and not inherited by threads a tool starts), so parallel
attempts never see each other's calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from amapreduce.llm.hedge import ExtraCalls
from amapreduce.llm.usage import Usage

__all__ = ["UsageScope", "active_scopes", "in_flight", "scope_cancelled", "scope_extra_calls", "scope_labels",
           "scope_reply_tokens", "usage_scope"]


class UsageScope:
    """Usage by role of the model calls made inside one `usage_scope` block (thread-safe)."""

    def __init__(self, labels: dict[str, Any] | None = None, *, cancelled: Callable[[], bool] | None = None,
                 extra_calls: ExtraCalls | None = None, reply_tokens: int | None = None) -> None:
        self.labels = dict(labels or {})
        self.reply_tokens = reply_tokens
        """The `max_tokens` a model call of this work is sent with when its caller names none (the
        engine's: what the batch's rows need, `mapreduce.solver.reply_tokens`); None: the role's default."""
        self._cancelled = cancelled
        self.extra_calls = extra_calls
        """The run's budget of extra calls, when the work may hedge its late calls (`llm.hedge`)."""
        self._lock = threading.Lock()
        self._by_role: dict[str, Usage] = {}
        self._in_flight: set[Callable[[], None]] = set()
        self._dropped = False

    def drop_requests(self) -> None:
        """Give up the requests of this scope on the wire now: each is cancelled where its transport
        can (its socket shut: the server sees the connection close and may stop computing it), and
        any sent later is cancelled as it starts. The engine calls it for an attempt it abandons."""
        with self._lock:
            self._dropped = True
            cancels = list(self._in_flight)
        for cancel in cancels:
            cancel()

    def cancelled(self) -> bool:
        """True once the work of this scope was given up (the engine cancelled the attempt, or it
        ran past its deadline): no model call of it may be sent any more."""
        return self._cancelled is not None and self._cancelled()

    def add(self, role: str, usage: Usage) -> None:
        """Count one call's (priced) usage."""
        with self._lock:
            self._by_role[role] = self._by_role.get(role, Usage()) + usage

    def usage(self, role: str | None = None) -> Usage:
        """Usage of `role` (None: every role) seen so far."""
        with self._lock:
            if role is not None:
                return self._by_role.get(role, Usage())
            return sum(self._by_role.values(), Usage())

    def by_role(self) -> dict[str, Usage]:
        """Usage per role seen so far."""
        with self._lock:
            return dict(self._by_role)


_ACTIVE: ContextVar[tuple[UsageScope, ...]] = ContextVar("amapreduce_usage_scopes", default=())


@contextmanager
def usage_scope(scope: UsageScope | None = None, **labels: Any) -> Iterator[UsageScope]:
    """Collect the usage of the model calls made in this block (scopes nest; each sees its calls)."""
    scope = scope if scope is not None else UsageScope(labels)
    token = _ACTIVE.set((*_ACTIVE.get(), scope))
    try:
        yield scope
    finally:
        _ACTIVE.reset(token)


def active_scopes() -> tuple[UsageScope, ...]:
    """The scopes open in the current context, outermost first."""
    return _ACTIVE.get()


@contextmanager
def in_flight(cancel: Callable[[], None]) -> Iterator[None]:
    """A request is on the wire in this block: `cancel` gives it up, and the open scopes call it when
    their work is dropped (`UsageScope.drop_requests`)."""
    scopes = _ACTIVE.get()
    dropped = False
    for scope in scopes:
        with scope._lock:
            scope._in_flight.add(cancel)
            dropped = dropped or scope._dropped
    if dropped:
        cancel()
    try:
        yield
    finally:
        for scope in scopes:
            with scope._lock:
                scope._in_flight.discard(cancel)


def scope_cancelled() -> bool:
    """True when the work of an open scope was given up (`UsageScope.cancelled`)."""
    return any(scope.cancelled() for scope in _ACTIVE.get())


def scope_extra_calls() -> ExtraCalls | None:
    """The extra-call budget of the innermost open scope that has one (None: no hedging here)."""
    for scope in reversed(_ACTIVE.get()):
        if scope.extra_calls is not None:
            return scope.extra_calls
    return None


def scope_reply_tokens() -> int | None:
    """The reply budget of the innermost open scope that has one (`UsageScope.reply_tokens`)."""
    for scope in reversed(_ACTIVE.get()):
        if scope.reply_tokens is not None:
            return scope.reply_tokens
    return None


def scope_labels() -> dict[str, Any]:
    """The labels of the open scopes (inner ones win), for trace events."""
    merged: dict[str, Any] = {}
    for scope in _ACTIVE.get():
        merged.update(scope.labels)
    return merged
