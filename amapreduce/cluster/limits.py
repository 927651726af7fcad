"""One budget for the cluster: providers' rate limits, breakers and the spend of a Ray run, in one actor.

Why. A provider's quota (requests and tokens per minute, `Retry-After`) and its outage are facts
about the provider, not about a process: with `--executor ray`, N worker processes each holding
their own limiter would get N times the quota, and each would find an outage on its own. A cost
budget (`--max-cost`, `--max-tokens`) is one sum over the whole run. So the driver starts one
named actor (`ClusterLimiter.start`) that holds, per provider, the same `ratelimit.WindowLimiter`
and `breaker.CircuitBreaker` a local run uses, and the run's spend; every worker's model calls go
through it.

How a worker finds it: by plain data. A job carries `ClusterLimits` (the actor's name and
namespace, and the run's budget); the worker enters `cluster_limits(limits)`, which looks the
actor up and installs it as the process's `llm.models.ProviderGates`, so every model built inside takes its tickets from
the cluster's window and asks the cluster's breaker, and builds its meter with `cluster_meter`,
which adds each call's spend to the cluster's sum and checks the budget against that sum. Nothing
outside `run.ray_*` modules knows Ray.

The ledger. The actor also keeps, per attempt of a piece of work (a chunk or a trial, named by a
`tag` the driver gives it), the usage of every call it made (added in the same actor call that
adds the call's spend to the run's sum, so the ledger and the budget never disagree) and the
journal entries its engine settled (`keep`). A worker that dies takes its own record with it; the
actor's stays, and the driver reads it (`left`) to account for the dead attempt's calls and to
let its retry go on from the batches already settled. `halt` tells every worker of one wide run
(the tags `RUN.CHUNK.TRY` of its attempts) that the run stops; others sharing the actor (an `ask`'s
manager) go on: a queued attempt starts, sees it and gives back nothing; a running one stops before its
next call, as a spent budget stops it (`DriverStopped`), and returns what it found.

Round trips. Each model call tells the actor as it ends (`LimiterActor.end`): its spend and
usage, and what its gates deferred to it (`Deferred`: the window ticket's tokens, a closed
breaker's answer). The end is handed to Ray before the call returns (a worker killed in the
next instant may lose the ends still on their way out, its calls of that instant). It is waited for when the run has a budget (the next call, anywhere in the
cluster, is checked against a sum that holds it) or the call settles a window ticket; otherwise it
is not, and no round trip is waited for on the call's path: the thread's next call takes the
end's reply (the run's spend, the halt, which breakers are not closed), there by then, and a
chunk or trial that returns waits for the ends still unanswered (`ClusterMeter.flush`), so its
ledger and the run's sum hold every call before the driver reads them. A call asks as it begins
(`begin`: the run's spend for the budget check, the halt, which breakers are not closed) when the
run has a budget, or the thread has no answer yet. So a run with no budget and no provider rate
waits for no round trip per call (its first call per thread: one), and one with a budget waits for
two (with RPM/TPM, one more for the window's turn). The price of the first case: a halt or a
breaker opened elsewhere reaches a thread at the end of its call in flight, so it may send one
more request before it stops. A request whose breaker was not closed at the call's start, a
retry, an outage and a probe's outcome ask the actor at once, as before. Worker processes look the
actor up once per run (`_actor`).

The actor is threaded (`max_concurrency`): a caller waiting for its turn in the window, or for
the breaker's probe, holds one of the actor's threads, as a thread of a local run would wait in
its process. An open breaker's error is built in the caller (`breaker.provider_unavailable`)
from the outage the actor reports, so no exception crosses the process boundary. Its clock is the
actor's: grant times (`ClusterLimiter.grants`) are comparable across machines. Its class lives in
`cluster.actor`, which its process imports without the model layer this module needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amapreduce.breaker import BreakerPolicy, provider_unavailable
from amapreduce.cluster.actor import MAX_CONCURRENCY, AttemptLedger, CallState, Deferred, LimiterActor
from amapreduce.cluster.ray import require_ray
from amapreduce.errors import BudgetExceeded, ConfigError
from amapreduce.llm.meter import Budget, Price, UsageMeter, check_budget
from amapreduce.llm.models import BreakerGate, use_provider_gates
from amapreduce.llm.usage import Usage
from amapreduce.ratelimit import WindowGate, WindowPolicy

if TYPE_CHECKING:
    from amapreduce.journal import JournalEntry
    from amapreduce.settings import Settings

__all__ = ["MAX_CONCURRENCY", "NAMESPACE", "AttemptLedger", "AttemptSink", "CallState", "ClusterGates", "ClusterLimiter",
           "ClusterLimits", "ClusterMeter", "Deferred", "DriverStopped", "LimiterActor", "cluster_limits", "cluster_meter",
           "cluster_worker", "halted"]

UNWAITED_KEPT = 256
"""Ends sent without waiting that a meter keeps to wait for at its `flush` (older ones are waited
for, answered long since, as more are sent)."""
NAMESPACE = "amapreduce"
"""The Ray namespace of the limiter actors (a named actor is found by name within one namespace)."""


def _ray() -> Any:
    return require_ray()  # the one check that names the `ray` extra


@dataclass(frozen=True)
class ClusterLimits:
    """How a worker reaches the cluster's limiter: plain data that crosses to any node."""

    name: str
    namespace: str = NAMESPACE
    budget: Budget = dataclasses.field(default_factory=Budget)
    """The run's budget, as the actor holds it (a worker's meter needs no round trip to learn it)."""


class DriverStopped(BudgetExceeded):
    """The run's driver stopped the cluster (another chunk's stop, Ctrl-C): a worker's next call
    is refused as a spent budget's is, so its engine stops cleanly and returns its rows."""


class _RemoteWindow:
    """A provider's window in the actor, as a `WindowGate`; a ticket's third item is its number there."""

    def __init__(self, actor: Any, key: str, policy: WindowPolicy) -> None:
        self._actor, self._key, self.policy = actor, key, policy

    def acquire(self, tokens: int = 0, *, skip_deferral: bool = False) -> list[float]:
        number, granted = _ray().get(self._actor.acquire.remote(self._key, self.policy, max(0, tokens), skip_deferral))
        return [granted, float(max(0, tokens)), float(number)]

    def settle(self, ticket: list[float], tokens: int) -> None:
        ticket[1] = float(max(0, tokens))
        call = _open(self._actor)
        if call is not None:  # sent with the call's spend
            call.later.settled.append((self._key, self.policy, int(ticket[2]), max(0, tokens)))
            return
        _ray().get(self._actor.settle.remote(self._key, self.policy, int(ticket[2]), max(0, tokens)))

    def defer(self, seconds: float) -> None:
        _ray().get(self._actor.defer.remote(self._key, self.policy, seconds))


class _RemoteBreaker:
    """A provider's breaker in the actor, as a `BreakerGate`; its error is raised here."""

    def __init__(self, actor: Any, key: str, policy: BreakerPolicy) -> None:
        self._actor, self.key, self.policy = actor, key, policy

    def admit(self) -> bool:
        call = _open(self._actor)
        if call is not None and not call.admitted:  # the call's first request
            call.admitted = True
            if self.key not in call.state.down:  # closed when the call began: no round trip
                return False
        elif call is not None and call.later.answered:  # a retry: the answers before it reach the breaker first
            answered, call.later.answered = call.later.answered, []
            _ray().get(self._actor.deliver.remote(None, Deferred(answered=answered)))
        probe, outage = _ray().get(self._actor.admit.remote(self.key, self.policy))
        if outage is not None:
            raise provider_unavailable(outage)
        return bool(probe)

    def record(self, probe: bool, outage: str | None) -> None:
        call = _open(self._actor)
        if call is not None and outage is None and not probe:  # an answer: sent with the call's spend
            call.later.answered.append((self.key, self.policy))
            return
        _ray().get(self._actor.record.remote(self.key, self.policy, probe, outage))

    def release(self, probe: bool) -> None:
        _ray().get(self._actor.release.remote(self.key, self.policy, probe))


class ClusterGates:
    """The cluster's limiters and breakers as this process's `llm.models.ProviderGates`."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def limiter(self, key: str, policy: WindowPolicy) -> WindowGate:
        return _RemoteWindow(self._actor, key, policy)

    def breaker(self, key: str, policy: BreakerPolicy) -> BreakerGate:
        return _RemoteBreaker(self._actor, key, policy)


_thread = threading.local()
"""This thread's model call in flight (`_Call`), between its meter's `check` and `record`."""


class _Call:
    """One model call of this thread, from its `ClusterMeter.check` to its `record`: where the run
    stood when it began (the first admission of its request asks the actor only for a provider
    whose breaker was not closed then) and what its gates deferred to its end (`Deferred`)."""

    def __init__(self, actor: Any, state: CallState, later: Deferred) -> None:
        self.actor, self.state, self.later = actor, state, later
        self.admitted = False


def _open(actor: Any) -> _Call | None:
    """This thread's model call in flight on `actor`'s limiter (None: none; gates then ask the actor at once)."""
    call: _Call | None = getattr(_thread, "call", None)
    return call if call is not None and call.actor is actor else None


class ClusterMeter(UsageMeter):
    """A worker's usage meter whose budget is the cluster's: each call's spend is added to the
    run's sum in the actor, and `check` compares that sum with the run's budget, after this
    worker's own budget (`local_budget`, the settings' `--max-cost`/`--max-tokens` of one run: an
    evaluation's trial keeps its per-trial token budget on Ray as it has locally).

    The worker's own usage (`by_role`, `to_json`) stays its own: the driver adds it to the run's
    meter when the worker's result comes back.
    """

    def __init__(self, actor: Any, budget: Budget, *, local_budget: Budget | None = None, tag: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(budget=budget, **kwargs)
        self._actor = actor
        self.local_budget = local_budget or Budget()
        self.tag = tag
        """The attempt whose ledger in the actor each call's usage is added to (None: none kept)."""
        self._limited = budget.max_cost_usd is not None or budget.max_tokens is not None
        """Whether the run has a budget: then each call asks the actor for the run's spend as it begins."""
        self._seen = threading.local()
        """Per thread: the `CallState` the actor gave at the end of the thread's last call, or the
        reply to that end, sent without waiting (`record`)."""
        self._unwaited: list[Any] = []
        """The ends sent without waiting and not yet waited for (`flush`)."""
        self._unwaited_lock = threading.Lock()

    def check(self) -> None:
        """Before a model call: the run's halt and budget, as the actor says at this call's `begin`,
        or, with no cluster budget to hold, as it said at the end of this thread's previous call
        (no round trip: see the module doc)."""
        previous = _open(self._actor)  # a call that never ended (it failed): what it deferred goes now
        later = previous.later if previous is not None else Deferred()
        state: Any = getattr(self._seen, "state", None)
        self._seen.state = None  # used once
        if state is not None and not isinstance(state, CallState):  # the previous end's reply, there by now
            state = _ray().get(state)
        if state is None or self._limited:
            state = _ray().get(self._actor.begin.remote(self.tag, later))
            later = Deferred()
        _thread.call = _Call(self._actor, state, later)
        if state.halted is not None:
            raise DriverStopped(f"the run's driver stopped the cluster ({state.halted})", kind="halted")
        check_budget(self.budget, state.cost_usd, state.tokens, where=" across the cluster")
        own = self.total()  # after the cluster's: where both are the run's budget, the cluster's is reached first
        check_budget(self.local_budget, own.cost_usd, own.total_tokens)

    def record(self, role: str, model_id: str, usage: Usage) -> Usage:
        """A call's spend and what its gates deferred, in one actor call (`LimiterActor.end`), sent
        before the call returns. Waited for when the run has a budget (the next call anywhere in the
        cluster is checked against a sum that holds it) or the call settles a window ticket (the
        window counts its tokens exactly); otherwise not: the thread's next `check` takes the reply,
        there by then, and `flush` waits for the rest (see the module doc)."""
        priced = super().record(role, model_id, usage)
        call = _open(self._actor)
        _thread.call = None
        later = call.later if call is not None else Deferred()
        reply = self._actor.end.remote(priced.cost_usd, priced.total_tokens, self.tag, role,
                                       priced if self.tag is not None else None, later)
        if self._limited or later.settled:
            self._seen.state = _ray().get(reply)
            return priced
        self._seen.state = reply
        with self._unwaited_lock:
            self._unwaited.append(reply)
            done = self._unwaited[:-UNWAITED_KEPT] if len(self._unwaited) > 2 * UNWAITED_KEPT else []
            del self._unwaited[:len(done)]
        if done:  # answered long ago: let Ray forget them
            _ray().get(done)
        return priced

    def flush(self) -> None:
        """Wait until the actor holds every call's end (a chunk or trial that returns its usage)."""
        with self._unwaited_lock:
            sent, self._unwaited = self._unwaited, []
        if sent:
            _ray().get(sent)


_ACTORS: dict[ClusterLimits, Any] = {}
"""The limiter actors this process has found, by their limits: one name look-up per run, not per chunk."""


def _actor(limits: ClusterLimits) -> Any:
    actor = _ACTORS.get(limits)
    if actor is not None:
        return actor
    try:
        actor = _ray().get_actor(limits.name, namespace=limits.namespace)
    except ValueError as exc:
        raise ConfigError(f"the cluster's limiter {limits.name!r} is gone ({exc}); its driver has ended.") from None
    return _known(limits, actor)


def _known(limits: ClusterLimits, actor: Any) -> Any:
    if len(_ACTORS) >= 16:  # a long-lived worker serves run after run: forget the old runs' actors
        _ACTORS.clear()
    _ACTORS[limits] = actor
    return actor


@contextlib.contextmanager
def cluster_limits(limits: ClusterLimits | None) -> Iterator[None]:
    """Inside: every model built in this process uses the cluster's limiters and breakers (None:
    this process's own, as a local run). The gates in force before are put back on the way out."""
    if limits is None:
        yield
        return
    previous = use_provider_gates(ClusterGates(_actor(limits)))
    try:
        yield
    finally:
        use_provider_gates(previous)


def cluster_meter(limits: ClusterLimits | None, settings: Settings, *,
                  prices_by_prefix: Mapping[str, Price] | None = None, tag: str | None = None) -> UsageMeter:
    """A worker's meter: charged to the cluster's budget (`ClusterMeter`, its calls kept in the
    ledger of attempt `tag`), or with `limits` None the settings' own budget (`llm.factory.new_meter`)."""
    from amapreduce.llm.factory import new_meter

    local = new_meter(settings, prices_by_prefix=prices_by_prefix)
    if limits is None:
        return local
    return ClusterMeter(_actor(limits), limits.budget, local_budget=local.budget, prices=local.prices, tag=tag)


@contextlib.contextmanager
def cluster_worker(limits: ClusterLimits | None, settings: Settings, *,
                   prices_by_prefix: Mapping[str, Price] | None = None, tag: str | None = None) -> Iterator[UsageMeter]:
    """Inside: `limits` in force (`cluster_limits`) and the worker's meter (`cluster_meter`); once the
    work inside returns, every call's spend is in the cluster's sum (`ClusterMeter.flush`), so a
    chunk or trial that comes back has reported all it spent."""
    with cluster_limits(limits):
        meter = cluster_meter(limits, settings, prices_by_prefix=prices_by_prefix, tag=tag)
        yield meter
        if isinstance(meter, ClusterMeter):
            meter.flush()


class AttemptSink:
    """A worker's journal sink that also keeps each entry in the actor's ledger of attempt `tag`,
    so the work of a worker that dies is not lost.

    Sent without waiting for the actor: the engine journals from its one loop, which must not wait
    a round trip per settled batch (on a busy machine that tripled the time per batch). (Sending
    them with the next model call's end instead, which is waited for, saved those calls but
    measured no faster: see docs/scaling.md.) Each entry carries its number, so the ledger keeps
    journal order. An entry still on its way when the worker is killed is lost with it, and its
    batch is asked again by the retry (the calls it made are in the ledger: each call's end is
    sent before the call returns); `flush` waits for all of them (a chunk that comes back)."""

    def __init__(self, limits: ClusterLimits, tag: str) -> None:
        self._actor, self._tag = _actor(limits), tag
        self.entries: list[JournalEntry] = []
        self._sent: list[Any] = []

    def append(self, entry: JournalEntry) -> None:
        self._sent.append(self._actor.keep.remote(self._tag, len(self.entries), entry))
        self.entries.append(entry)

    def flush(self) -> None:
        """Wait until the actor holds every entry sent."""
        sent, self._sent = self._sent, []
        _ray().get(sent)


def halted(limits: ClusterLimits, tag: str) -> str | None:
    """Why the driver halted attempt `tag`'s run (None: it goes on): a queued attempt asks first."""
    return _ray().get(_actor(limits).halted.remote(tag))  # type: ignore[no-any-return]


class ClusterLimiter:
    """The driver's handle on the cluster's limiter actor: start it, hand out `limits`, stop it.

    Args:
        actor: the actor (see `start`).
        limits: how workers find it.
    """

    def __init__(self, actor: Any, limits: ClusterLimits, *, owned: bool = True) -> None:
        self._actor = actor
        self.limits = limits
        self._owned = owned

    @classmethod
    def find(cls, limits: ClusterLimits) -> ClusterLimiter:
        """A handle on a limiter another part of the driver started (`stop` leaves it running)."""
        return cls(_actor(limits), limits, owned=False)

    @property
    def actor(self) -> Any:
        """The actor's handle (a driver's own `ClusterMeter` charges it directly, no name lookup)."""
        return self._actor

    @classmethod
    def start(cls, *, budget: Budget | None = None, spent: Usage | None = None) -> ClusterLimiter:
        """Start a limiter actor for one run (Ray must be initialised), charged with `spent` (what the
        driver had already spent, e.g. before a resume) against `budget`."""
        ray = _ray()
        limits = ClusterLimits(name=f"limits-{uuid.uuid4().hex}", budget=budget or Budget())
        remote = ray.remote(num_cpus=0, max_concurrency=MAX_CONCURRENCY, max_restarts=0)(LimiterActor)
        actor = remote.options(name=limits.name, namespace=limits.namespace).remote(
            budget or Budget(), spent.cost_usd if spent else 0.0, spent.total_tokens if spent else 0)
        # not waited for: a named actor's name is registered as it is created, so a worker's look-up
        # finds it at once and its first call waits for the actor's start, which overlaps the
        # chunks' own (their worker processes start and import meanwhile)
        return cls(_known(limits, actor), limits)

    def spent(self) -> tuple[float, int]:
        """The run's (dollars, tokens) so far, across the cluster."""
        cost, tokens = _ray().get(self._actor.spent.remote())
        return float(cost), int(tokens)

    def grants(self) -> list[tuple[str, float]]:
        """Every (provider, grant time) given so far, on the actor's clock."""
        return list(_ray().get(self._actor.grants.remote()))

    def left(self, tag: str) -> AttemptLedger:
        """What attempt `tag` left in the actor (see `LimiterActor.left`)."""
        ledger = _ray().get(self._actor.left.remote(tag))
        return ledger if isinstance(ledger, AttemptLedger) else AttemptLedger(usage={}, entries=[])

    def forget(self, tag: str) -> None:
        """Attempt `tag` came back: its copy in the actor is not needed."""
        self._actor.forget.remote(tag)

    def halt(self, run: str, reason: str) -> None:
        """Tell every worker of wide run `run` that it stops (see `LimiterActor.halt`)."""
        _ray().get(self._actor.halt.remote(run, reason))

    def stop(self) -> None:
        """End the actor (its limits end with the run); a limiter found (`find`) is left running."""
        if self._owned:
            _ACTORS.pop(self.limits, None)
            _ray().kill(self._actor, no_restart=True)
