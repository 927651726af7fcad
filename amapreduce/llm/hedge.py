"""Hedged model calls: a second copy of one slow HTTP request; the first valid reply wins.

Why: a search sub-agent's attempt is several model calls in a row, and a provider's latency has a
heavy tail (one call in twenty taking ten times the median is common). A batch whose call
straggles holds its worker for the whole tail, and a backup of the whole batch
(`mapreduce.backup`) comes too late for stragglers met in the bulk of a run (it waits for free
slots) and redoes every call of the attempt. Hedging the one slow request costs one call and
starts as soon as that call is late ("The Tail at Scale", Dean and Barroso, 2013).

The rule: a call is late once it has run longer than `HedgePolicy.multiple` times the 75th
percentile of the calls of the same shape (the same number of messages, i.e. the same step of a
sub-agent; all calls while a shape has too few) that this client finished lately, never less
than `floor_s`, and only after `min_samples` finished. A late call gets one hedge, the same
request sent again, when its `admit` callback agrees (for a managed model: the call belongs to
a run's attempt that carries an `ExtraCalls` budget with room for one call, the provider's
breaker is closed, its limiter admits a request at once, the run's budget would not be
crossed). The first valid reply (an HTTP 200 with a JSON object) wins; the other request is
cancelled by shutting its socket (`CancelToken`), and both are reported (`HedgeOutcome`) so the
loser's usage is still counted. A call whose first request fails while its hedge runs waits
for the hedge. Requests that cannot be cancelled (no socket seen yet, a proxied client) are not
hedged: a hedge is only worth its call if the waiting caller can take its reply.

`ExtraCalls` is the one budget of extra model calls of a run, shared by these hedges and the
engine's backup attempts, so `AMAPREDUCE_BACKUP_MAX_EXTRA` bounds both together.
"""

from __future__ import annotations

import contextvars
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CancelToken", "ExtraCalls", "HedgeOutcome", "HedgePolicy", "Hedger", "LatencyWindow", "RequestCancelled",
           "p75"]

T = TypeVar("T")


def p75(values: list[float]) -> float:
    """The 75th percentile (nearest rank) of `values`, which is not empty."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.75 * len(ordered)) - 1)]


class RequestCancelled(Exception):
    """The request was cancelled: its hedge (or the request it hedged) answered first."""


class ExtraCalls:
    """A run's budget of extra model calls (hedged requests and backup attempts), thread-safe.

    The cap is `max_extra` times the calls the run needs (`needed`, kept current by the engine's
    `Stragglers`). Work that may cost extra calls reserves them first (`reserve`) and, once
    decided, gives the reservation back and charges what it really cost (`settle`)."""

    def __init__(self, max_extra: float, *, needed: float = 0.0) -> None:
        self.max_extra = max_extra
        self.needed = needed
        """Model calls the run needs (planned batches times a finished attempt's calls)."""
        self._lock = threading.Lock()
        self.spent = 0.0
        """Extra calls made so far."""
        self.reserved = 0.0
        """Extra calls held by work not yet decided."""
        self.hedges = 0
        """Hedged requests sent."""
        self.late = 0
        """Late calls that asked for a hedge (sent or not)."""
        self.calls = 0
        """Calls answered so far (`count_call`): what the share of late calls is measured against."""
        self.waiting = False
        """Whether work waits for a worker slot (the bulk of a run, as the engine last saw it)."""
        self.held_back = 0.0
        """Extra calls hedges leave for the late calls still to come while work waits: a late call
        near the end delays the whole run, while an early one delays only its worker, whose next
        batches the others take; so when the budget cannot hedge them all, the earliest go unhedged."""

    @property
    def cap(self) -> float:
        """The most extra calls the run may make."""
        return self.max_extra * self.needed

    def fits(self, calls: float) -> bool:
        """Whether `calls` more extra calls stay within the cap (reserving nothing)."""
        with self._lock:
            return self.spent + self.reserved + calls <= self.cap + 1e-9

    def reserve(self, calls: float) -> bool:
        """Hold `calls` extra calls if they fit the cap; False (nothing held) if not."""
        with self._lock:
            if self.spent + self.reserved + calls > self.cap + 1e-9:
                return False
            self.reserved += calls
            return True

    def settle(self, reserved: float, spent: float) -> None:
        """Give back a reservation of `reserved` calls and charge the `spent` extra calls made."""
        with self._lock:
            self.reserved = max(0.0, self.reserved - reserved)
            self.spent += spent

    def count_call(self) -> None:
        """One more call of the run was answered."""
        with self._lock:
            self.calls += 1

    def late_share(self, *, at_least: int = 20) -> float:
        """The share of the run's calls found late so far (over at least `at_least` calls, so a
        run's first late calls do not make it look as if every call were)."""
        with self._lock:
            return self.late / max(at_least, self.calls)

    def take_hedge(self, *, again: bool = False) -> bool:
        """Charge one hedged request if it fits the cap (less `held_back` while work waits);
        `again`: the same late call asks once more (it counts as late once)."""
        with self._lock:
            self.late += not again
            held = self.held_back if self.waiting else 0.0
            if self.spent + self.reserved + 1 > self.cap - held + 1e-9:
                return False
            self.spent += 1
            self.hedges += 1
            return True


class HedgePolicy(BaseModel):
    """When a late call gets a hedge (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    multiple: float = Field(default=2.0, ge=1)
    """A call is late past this multiple of its shape's finished calls' 75th percentile."""
    floor_s: float = Field(default=0.1, ge=0)
    """The shortest run time that makes a call late, whatever the percentile says."""
    min_samples: int = Field(default=16, ge=1)
    """Finished calls needed before the percentile is trusted."""
    window: int = Field(default=256, ge=8)
    """Latest finished calls kept per shape."""


class LatencyWindow:
    """The latest finished calls' durations per call shape, and the lateness threshold they give
    (thread-safe; a threshold is recomputed only after a new sample)."""

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._by_shape: dict[int, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=policy.window)
        self._cached: dict[int, float | None] = {}

    def add(self, shape: int, seconds: float) -> bool:
        """Record one finished call; True when it gave the first threshold of all."""
        with self._lock:
            first = len(self._all) + 1 == self.policy.min_samples
            self._by_shape.setdefault(shape, deque(maxlen=self.policy.window)).append(seconds)
            self._all.append(seconds)
            self._cached.clear()
            return first

    def threshold_s(self, shape: int) -> float | None:
        """How long a call of `shape` may run before it is late; None before `min_samples`."""
        with self._lock:
            if shape in self._cached:
                return self._cached[shape]
            own = self._by_shape.get(shape)
            values = own if own is not None and len(own) >= self.policy.min_samples else self._all
            value = (max(self.policy.floor_s, self.policy.multiple * p75(list(values)))
                     if len(values) >= self.policy.min_samples else None)
            self._cached[shape] = value
            return value


class CancelToken:
    """Cancels one HTTP request from another thread by shutting its socket down.

    The transport attaches the request's socket as it writes and reads (`transport.cancellable`);
    `cancel` then makes the blocked read return, so the request fails at once. Once the request
    ended (`detach`), cancelling does nothing: the connection may already serve another request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.cancelled = False
        self._ended = False

    @property
    def cancellable(self) -> bool:
        """Whether a socket is attached (the request is on the wire)."""
        with self._lock:
            return self._sock is not None and not self._ended

    def attach(self, sock: socket.socket) -> None:
        """The request's socket (called by the transport before each read and write)."""
        with self._lock:
            if self._ended or sock is self._sock:
                return
            self._sock = sock
            cancelled = self.cancelled
        if cancelled:
            _shut(sock)

    def detach(self) -> None:
        """The request ended: a later `cancel` must not touch its connection."""
        with self._lock:
            self._ended = True
            self._sock = None

    def cancel(self) -> None:
        """Cancel the request: shut its socket now, or as soon as it has one."""
        with self._lock:
            self.cancelled = True
            sock = None if self._ended else self._sock
        if sock is not None:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


@dataclass(frozen=True)
class HedgeOutcome(Generic[T]):
    """How a hedged call ended (reported once, in the caller's thread, before the call returns)."""

    winner: str
    """`first` (the original request answered first) or `hedge`."""
    after_s: float
    """How long the original request had run when the hedge was sent."""
    threshold_s: float
    loser_reply: T | None
    """The losing request's reply when it answered too (else it was cancelled)."""
    request_bytes: int
    """The request's size (an estimate of a cancelled loser's prompt)."""
    hedge_error: str | None = None
    """Why the hedge failed, when it did (the first request then answered, or failed too)."""


@dataclass(eq=False)
class _Race(Generic[T]):
    send: Callable[[CancelToken], T]
    shape: int
    started_at: float
    context: contextvars.Context
    request_bytes: int
    first: CancelToken = field(default_factory=CancelToken)
    hedge: CancelToken | None = None
    closed: bool = False
    """No hedge may start any more (the first request ended, or a hedge was sent)."""
    asked: bool = False
    """A hedge was asked for and refused: it is asked again at `retry_at`."""
    retry_at: float = 0.0
    first_ended: bool = False
    winner: str | None = None
    hedge_after_s: float = 0.0
    threshold_s: float = 0.0
    hedge_reply: T | None = None
    hedge_error: BaseException | None = None
    hedge_done: threading.Event = field(default_factory=threading.Event)


class Hedger:
    """Races a late request against one hedged copy (see the module's docstring).

    Args:
        policy: the lateness rule.
        admit: asked (in the caller's context, from the hedger's thread) whether a hedge of a
            request of that many bytes may be sent now, and whether it was asked for that call
            before; it charges whatever it admits (an `ExtraCalls` budget, a limiter ticket).
            None: never hedge. A refused call is asked again every half threshold while it runs.
        report: told of each hedged call's outcome, in the caller's thread and context.
        clock: `time.monotonic` (tests pass a fake one and call `check` themselves).
        watch: run the hedger's own thread, which sends hedges when calls turn late (tests that
            drive `check` by hand pass False).
    """

    def __init__(self, policy: HedgePolicy | None = None, *, admit: Callable[[int, bool], bool] | None = None,
                 report: Callable[[HedgeOutcome[object]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, watch: bool = True) -> None:
        self.policy = policy or HedgePolicy()
        self.latencies = LatencyWindow(self.policy)
        self._admit = admit
        self._report = report
        self._clock = clock
        self._watch = watch
        self._cond = threading.Condition()
        self._inflight: dict[int, _Race[object]] = {}
        self._thread: threading.Thread | None = None
        self._sleeping_until: float | None = None
        self.sent = 0
        """Hedged requests sent by this hedger."""

    def race(self, send: Callable[[CancelToken], T], *, shape: int = 0, request_bytes: int = 0) -> T:
        """Send a request with `send(token)` (in this thread) and return the first valid reply:
        its own, or its hedge's when it ran late and a hedge was admitted and answered first.

        Raises whatever `send` raised when no hedge answered validly."""
        race: _Race[T] = _Race(send=send, shape=shape, started_at=self._clock(), context=contextvars.copy_context(),
                               request_bytes=request_bytes)
        self._track(race)
        reply: T | None = None
        error: BaseException | None = None
        try:
            reply = send(race.first)
        except BaseException as exc:  # noqa: BLE001 - decided below, re-raised unless the hedge won
            error = exc
        with self._cond:
            self._inflight.pop(id(race), None)
            if not self._inflight:
                self._cond.notify()  # the watcher ends when nothing is in flight (`_watch_loop`)
            race.first_ended = True
            hedge = race.hedge
            race.closed = True
            if race.winner is None and error is None:
                race.winner = "first"
        if race.winner == "first":
            if self.latencies.add(shape, self._clock() - race.started_at):
                self._wake()  # the first threshold: calls already in flight may be late
            if hedge is not None:
                hedge.cancel()  # not waited for: a cancelled request ends at once, its usage is estimated
                self._told(race, "first", race.hedge_reply)
            return reply  # type: ignore[return-value]
        if hedge is None and error is not None:
            raise error
        race.hedge_done.wait()  # the hedge won, or the first request failed and the hedge decides
        if race.hedge_error is None:
            self._told(race, "hedge", reply)
            return race.hedge_reply  # type: ignore[return-value]
        self._told(race, "first", None)
        raise error if error is not None else race.hedge_error

    def _told(self, race: _Race[T], winner: str, loser_reply: T | None) -> None:
        if self._report is not None:
            failed = race.hedge_error
            self._report(HedgeOutcome(winner=winner, after_s=race.hedge_after_s, threshold_s=race.threshold_s,
                                      loser_reply=loser_reply, request_bytes=race.request_bytes,
                                      hedge_error=None if failed is None or isinstance(failed, RequestCancelled)
                                      else f"{type(failed).__name__}: {failed}"))

    def _track(self, race: _Race[T]) -> None:
        if self._admit is None:
            race.closed = True
            return
        with self._cond:
            self._inflight[id(race)] = race  # type: ignore[assignment]
            if not self._watch:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch_loop, name="amapreduce-hedger", daemon=True)
                self._thread.start()
            threshold = self.latencies.threshold_s(race.shape)
            if threshold is not None and (self._sleeping_until is None
                                          or race.started_at + threshold < self._sleeping_until):
                self._cond.notify()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def check(self) -> float | None:
        """Send a hedge for each call that is late now; return when the next one turns late (None:
        none will with the calls in flight). The hedger's thread calls it; tests may too."""
        now = self._clock()
        late: list[tuple[_Race[object], float]] = []
        wake: float | None = None
        with self._cond:
            for race in reversed(self._inflight.values()):  # newest first: hedging it saves the most
                if race.closed:
                    continue
                threshold = self.latencies.threshold_s(race.shape)
                if threshold is None:
                    continue
                due = max(race.started_at + threshold, race.retry_at)
                if now >= due:
                    race.retry_at = now + threshold / 2  # if refused now, asked again then
                    late.append((race, threshold))
                else:
                    wake = due if wake is None else min(wake, due)
        for race, threshold in late:
            self._hedge(race, now, threshold)
        return wake

    def _hedge(self, race: _Race[object], now: float, threshold: float) -> None:
        if not race.first.cancellable:  # the caller could not take the hedge's reply: not worth a call
            return
        again, race.asked = race.asked, True
        if self._admit is None or not race.context.run(self._admit, race.request_bytes, again):
            return
        with self._cond:
            race.closed = True
            if race.first_ended:  # it answered meanwhile; the admitted call is spent all the same
                return
            race.hedge = CancelToken()
            race.hedge_after_s = now - race.started_at
            race.threshold_s = threshold
            self.sent += 1
            token = race.hedge
        threading.Thread(target=race.context.run, args=(self._send_hedge, race, token), name="amapreduce-hedge",
                         daemon=True).start()

    def _send_hedge(self, race: _Race[object], token: CancelToken) -> None:
        try:
            race.hedge_reply = race.send(token)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            race.hedge_error = exc
        with self._cond:
            won = race.winner is None and race.hedge_error is None
            if won:
                race.winner = "hedge"
            first_running = not race.first_ended
        if won and first_running:
            race.first.cancel()
        race.hedge_done.set()

    def _watch_loop(self) -> None:
        """The watcher thread: hedge late calls until none is in flight, then end (the next tracked
        call starts a new one), so no thread outlives the calls of a run that stopped."""
        while True:
            wake = self.check()
            with self._cond:
                if not self._inflight:
                    self._thread = None
                    return
                now = self._clock()
                if wake is not None and wake <= now:
                    continue
                self._sleeping_until = wake
                self._cond.wait(None if wake is None else wake - now)
                self._sleeping_until = None
