"""Hedged model calls: another copy of one slow HTTP request; the first valid reply wins.

Why: a search sub-agent's attempt is several model calls in a row, and a provider's latency has a
heavy tail (one call in twenty taking ten times the median is common). A batch whose call
straggles holds its worker for the whole tail, and a backup of the whole batch
(`mapreduce.backup`) comes too late for stragglers met in the bulk of a run (it waits for free
slots) and redoes every call of the attempt. Hedging the one slow request costs one call and
starts as soon as that call is late ("The Tail at Scale", Dean and Barroso, 2013).

The rule: a call is late once it has run longer than `HedgePolicy.multiple` times the 75th
percentile of the calls of the same shape (the same number of messages, i.e. the same step of a
sub-agent; all calls while a shape has too few) that this client finished lately, or
`HedgePolicy.spread` times their 90th percentile if that comes first (steady latencies make a
call 20 % slower than nine in ten already a straggler), never less than `floor_s`, and only
after `min_samples` finished. A late call gets a hedge, the same request sent again, when its
`admit` callback agrees (for a managed model: the call belongs to a run's attempt that carries
an `ExtraCalls` budget with room for one call, the provider's breaker is closed, its limiter
admits a request at once, the run's budget would not be crossed); if that hedge runs late too
(one in twenty does, under a tail of one in twenty), a second one (`max_hedges`). A late call
that should end before a hedge could answer (the late calls that ended unhedged lasted about
as long) is left alone. The first valid reply (an HTTP 200 with a JSON object) wins; the other
requests are cancelled by shutting their sockets (`CancelToken`), and all are reported
(`HedgeOutcome`) so the losers' usage is still counted. A call whose first request fails while
a hedge runs waits for the hedges. Requests that cannot be cancelled (no socket seen yet, a
proxied client) are not hedged: a hedge is only worth its call if the waiting caller can take
its reply.

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
           "STALE", "p75", "percentile"]

T = TypeVar("T")


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0 < q <= 1, nearest rank) of `values`, which is not empty."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def p75(values: list[float]) -> float:
    """The 75th percentile (nearest rank) of `values`, which is not empty."""
    return percentile(values, 0.75)


STALE = 3.0
"""While batches wait for a worker, a late call refused its hedge until it has run this many
lateness thresholds is left alone: what a hedge would still save of it is little (it delays only
its own worker, whose next batches the others take), and the budget is worth more at the run's
end, where a late call delays the whole run. Once nothing waits, it is asked again."""


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

    def take_hedge(self, *, again: bool = False, overdue: float = 1.0) -> bool:
        """Charge one hedged request if it fits the cap (less `held_back` while work waits);
        `again`: the same late call asks once more (it counts as late once); `overdue`: how many
        lateness thresholds it has run (while work waits, past `STALE` it is left alone)."""
        with self._lock:
            self.late += not again
            if self.waiting and overdue > STALE:
                return False
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
    """A call is late past this multiple of its shape's finished calls' 75th percentile, ..."""
    spread: float = Field(default=1.2, ge=1)
    """... or past this multiple of their 90th percentile, whichever comes first: where calls of a
    step take about the same time (a provider's steady latency), a call 20 % slower than nine in
    ten of them is already a straggler; where they vary widely, the 75th percentile rule holds."""
    floor_s: float = Field(default=0.1, ge=0)
    """The shortest run time that makes a call late, whatever the percentile says."""
    min_samples: int = Field(default=16, ge=1)
    """Finished calls needed before the percentile is trusted."""
    window: int = Field(default=256, ge=8)
    """Latest finished calls kept per shape."""
    max_hedges: int = Field(default=2, ge=1)
    """Hedged requests one call may send: a second once the first hedge has run late too (with a
    heavy tail, one hedge in twenty straggles as well)."""
    ask_again: float = Field(default=0.125, gt=0)
    """A refused late call is asked again after this share of the threshold (the cap grows as the
    run learns how many calls it needs, and the limiter frees up)."""


class LatencyWindow:
    """The latest finished calls' durations per call shape, the lateness threshold they give, and
    how long late calls lasted (thread-safe; a threshold is recomputed only after a new sample)."""

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._by_shape: dict[int, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=policy.window)
        self._cached: dict[int, float | None] = {}
        self._late: deque[float] = deque(maxlen=policy.window)
        """Late calls that ended without a hedge's help: their durations over their threshold."""

    def add(self, shape: int, seconds: float) -> bool:
        """Record one finished call; True when it gave the first threshold of all."""
        threshold = self.threshold_s(shape)
        with self._lock:
            if threshold is not None and seconds > threshold:
                self._late.append(seconds / threshold)
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
            value = None
            if len(values) >= self.policy.min_samples:
                seen = list(values)
                value = max(self.policy.floor_s, min(self.policy.multiple * p75(seen),
                                                     self.policy.spread * percentile(seen, 0.9)))
            self._cached[shape] = value
            return value

    def ends_soon(self, shape: int, threshold: float, elapsed: float) -> float | None:
        """When a late call of `shape` that has run `elapsed` s is expected to end, if that comes
        before a hedge sent now could answer (in the median time of the shape's calls); else None
        (hedge it).

        Expected from the late calls that ended unhedged: the median of their durations over
        their threshold. A call that outlives that is a worse straggler than they were: hedged."""
        with self._lock:
            if not self._late:
                return None
            expected = sorted(self._late)[len(self._late) // 2] * threshold
            own = self._by_shape.get(shape)
            values = list(own if own is not None and len(own) >= self.policy.min_samples else self._all)
        if values and expected - percentile(values, 0.5) <= elapsed < expected:
            return expected
        return None


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
    """`first` (the original request answered first) or `hedge` (one of its hedges did)."""
    after_s: float
    """How long the original request had run when its first hedge was sent."""
    threshold_s: float
    losers: tuple[T | None, ...]
    """One entry per request that lost: its reply when it answered too, else None (it was
    cancelled, or failed). A call with one hedge has one loser; with two, two."""
    request_bytes: int
    """The request's size (an estimate of a cancelled loser's prompt)."""
    hedge_error: str | None = None
    """Why the last hedge failed, when one did (the first request then answered, or failed too)."""

    @property
    def hedges(self) -> int:
        """Hedged requests the call sent."""
        return len(self.losers)


@dataclass(eq=False)
class _Copy(Generic[T]):
    """One hedged request of a call."""

    token: CancelToken
    sent_at: float
    reply: T | None = None
    error: BaseException | None = None
    ended: bool = False


@dataclass(eq=False)
class _Race(Generic[T]):
    send: Callable[[CancelToken], T]
    shape: int
    started_at: float
    context: contextvars.Context
    request_bytes: int
    first: CancelToken = field(default_factory=CancelToken)
    hedges: list[_Copy[T]] = field(default_factory=list)
    closed: bool = False
    """No hedge may start any more (the first request ended, a hedge won, or all were sent)."""
    asked: bool = False
    """A hedge was asked for (sent or refused): a later ask is the same late call asking again."""
    retry_at: float = 0.0
    first_ended: bool = False
    winner: int | None = None
    """0: the first request won; k: its k-th hedge did."""
    threshold_s: float = 0.0
    settled: threading.Event = field(default_factory=threading.Event)
    """Set once a hedge won, or once the first request and every hedge ended."""

    def due(self, threshold: float) -> float:
        """When the newest request turns late (and a refused ask may be asked again)."""
        newest = self.hedges[-1].sent_at if self.hedges else self.started_at
        return max(newest + threshold, self.retry_at)

    def all_ended(self) -> bool:
        return self.first_ended and all(copy.ended for copy in self.hedges)


class Hedger:
    """Races a late request against up to `HedgePolicy.max_hedges` hedged copies (see the module's docstring).

    Args:
        policy: the lateness rule.
        admit: asked (in the caller's context, from the hedger's thread) whether a hedge of a
            request of that many bytes may be sent now, whether it was asked for that call
            before, and how many thresholds the call's newest request has run; it charges whatever it admits (an `ExtraCalls` budget, a limiter ticket).
            None: never hedge. A refused call is asked again a little later while it runs.
        report: told of each hedged call's outcome, in the caller's thread and context.
        clock: `time.monotonic` (tests pass a fake one and call `check` themselves).
        watch: run the hedger's own thread, which sends hedges when calls turn late (tests that
            drive `check` by hand pass False).
    """

    def __init__(self, policy: HedgePolicy | None = None, *, admit: Callable[[int, bool, float], bool] | None = None,
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
        its own, or a hedge's when it ran late and a hedge was admitted and answered first.

        Raises whatever `send` raised when no hedge answered validly."""
        race: _Race[T] = _Race(send=send, shape=shape, started_at=self._clock(), context=contextvars.copy_context(),
                               request_bytes=request_bytes)
        self._track(race)
        reply: T | None = None
        error: BaseException | None = None
        try:
            reply = send(race.first)
        except BaseException as exc:  # noqa: BLE001 - decided below, re-raised unless a hedge won
            error = exc
        with self._cond:
            self._inflight.pop(id(race), None)
            if not self._inflight:
                self._cond.notify()  # the watcher ends when nothing is in flight (`_watch_loop`)
            race.first_ended = True
            race.closed = True
            if race.winner is None and error is None:
                race.winner = 0
            hedges = list(race.hedges)
            settled = race.winner is not None or race.all_ended()
        if race.winner == 0:
            if self.latencies.add(shape, self._clock() - race.started_at):
                self._wake()  # the first threshold: calls already in flight may be late
            if hedges:
                for copy in hedges:
                    copy.token.cancel()  # not waited for: a cancelled request ends at once, its usage is estimated
                self._told(race, "first", tuple(copy.reply for copy in hedges))
            return reply  # type: ignore[return-value]
        if not hedges and error is not None:
            raise error
        if not settled:
            race.settled.wait()  # a hedge won, or the first request failed and the hedges decide
        if race.winner is not None:
            won = hedges[race.winner - 1]
            self._told(race, "hedge", (reply, *(copy.reply for copy in hedges if copy is not won)))
            return won.reply  # type: ignore[return-value]
        self._told(race, "first", tuple(None for _ in hedges))
        raise error if error is not None else hedges[-1].error  # type: ignore[misc]

    def _told(self, race: _Race[T], winner: str, losers: tuple[T | None, ...]) -> None:
        if self._report is not None:
            failed = next((copy.error for copy in reversed(race.hedges)
                           if copy.error is not None and not isinstance(copy.error, RequestCancelled)), None)
            self._report(HedgeOutcome(winner=winner, after_s=race.hedges[0].sent_at - race.started_at,
                                      threshold_s=race.threshold_s, losers=losers,
                                      request_bytes=race.request_bytes,
                                      hedge_error=None if failed is None else f"{type(failed).__name__}: {failed}"))

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
                due = race.due(threshold)
                if now >= due:
                    soon = self.latencies.ends_soon(race.shape, threshold, now - race.started_at)
                    if soon is not None:  # it should answer before a hedge could: asked again once it did not
                        due = race.retry_at = race.started_at + soon
                    else:
                        race.retry_at = now + max(threshold * self.policy.ask_again, 0.01)  # if refused now
                        late.append((race, threshold))
                        continue
                wake = due if wake is None else min(wake, due)
        for race, threshold in late:
            self._hedge(race, now, threshold)
            with self._cond:
                if not race.closed:  # refused, or its hedge may need one more: when to look again
                    due = race.due(threshold)
                    wake = due if wake is None else min(wake, due)
        return wake

    def _hedge(self, race: _Race[object], now: float, threshold: float) -> None:
        if not race.first.cancellable:  # the caller could not take the hedge's reply: not worth a call
            return
        again, race.asked = race.asked, True
        newest = race.hedges[-1].sent_at if race.hedges else race.started_at
        overdue = (now - newest) / threshold if threshold > 0 else 1.0
        if self._admit is None or not race.context.copy().run(self._admit, race.request_bytes, again, overdue):
            return
        with self._cond:
            if race.closed:  # it answered meanwhile; the admitted call is spent all the same
                return
            copy: _Copy[object] = _Copy(token=CancelToken(), sent_at=now)
            race.hedges.append(copy)
            race.closed = len(race.hedges) >= self.policy.max_hedges
            race.threshold_s = threshold
            self.sent += 1
        threading.Thread(target=race.context.copy().run, args=(self._send_hedge, race, copy), name="amapreduce-hedge",
                         daemon=True).start()

    def _send_hedge(self, race: _Race[object], copy: _Copy[object]) -> None:
        try:
            copy.reply = race.send(copy.token)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            copy.error = exc
        with self._cond:
            copy.ended = True
            won = race.winner is None and copy.error is None
            if won:
                race.winner = race.hedges.index(copy) + 1
                race.closed = True
            rivals = [] if not won else [other.token for other in race.hedges if other is not copy and not other.ended]
            first_running = won and not race.first_ended
            settled = won or race.all_ended()
        if first_running:
            race.first.cancel()
        for token in rivals:
            token.cancel()
        if settled:
            race.settled.set()

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
