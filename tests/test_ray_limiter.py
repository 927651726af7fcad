"""One budget for the cluster: the provider limiter, breaker and spend of a Ray run are one actor's.

The cross-process test runs in a child process that starts a local Ray itself (`ray.init(num_cpus=2)`)
with two worker processes (the test process keeps its sockets to loopback, as in test_eval_ray). It
asserts on the grant times the actor recorded, never on how fast anything ran: no window of the
policy may hold more grants than its limit, however slow the machine. The models are simulated
(deterministic code, not an LLM) and are called in-process by the workers: no HTTP is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from amapreduce.breaker import BreakerPolicy
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ModelSpec, build_model, use_provider_gates
from amapreduce.ratelimit import WindowLimiter, WindowPolicy
from amapreduce.testing.scripted import FunctionModel

RPM, WINDOW_S, CALLS = 3, 1.0, 6
"""Each of two workers makes CALLS calls under RPM per WINDOW_S (a short window keeps the test short)."""

RAY_DRIVER = r"""
import json, os, sys
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from smolagents.models import ChatMessage, MessageRole
from amapreduce.breaker import BreakerPolicy
from amapreduce.errors import BudgetExceeded, ProviderUnavailable
from amapreduce.llm.meter import Budget, UsageMeter
from amapreduce.llm.models import ManagedModel, ModelSpec, build_model
from amapreduce.ratelimit import WindowPolicy
from amapreduce.cluster.limits import ClusterGates, ClusterLimiter, cluster_limits, cluster_meter
from amapreduce.settings import load_settings
from amapreduce.testing.scripted import FunctionModel

RPM, WINDOW_S, CALLS = (int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
POLICY = WindowPolicy(rpm=RPM, window_s=WINDOW_S)
DOWN = BreakerPolicy(failures=2, cooldown_s=600.0, max_wait_s=0.0)
ASK = [ChatMessage(role=MessageRole.USER, content="How many moons has Mars? " * 10)]

def simulated():
    return FunctionModel(lambda messages, info: "two", model_id="simulated/answer")

@ray.remote(num_cpus=0, max_concurrency=2)
class Barrier:
    # both workers start calling together, whatever it takes Ray to start the second one
    def __init__(self):
        import threading
        self.barrier = threading.Barrier(2)
    def arrive(self):
        self.barrier.wait(timeout=120)

def together(barrier):
    ray.get(barrier.arrive.remote())

@ray.remote(num_cpus=1, max_retries=0)
def caller(limits, barrier):
    together(barrier)
    # a model whose limiter is the cluster's window (as every model built inside cluster_limits)
    gate = ClusterGates(ray.get_actor(limits.name, namespace=limits.namespace)).limiter("provider-x", POLICY)
    model = ManagedModel(simulated(), role="subagent", meter=UsageMeter(), limiter=gate)
    for _ in range(CALLS):
        model.generate(ASK)
    return os.getpid()

@ray.remote(num_cpus=1, max_retries=0)
def spender(limits, barrier):
    together(barrier)
    # models built by the factory path inside cluster_limits: the cluster's window, breaker and budget
    with cluster_limits(limits):
        meter = cluster_meter(limits, load_settings())
        spec = ModelSpec(model_id="simulated/answer", api_base="http://127.0.0.1:9/v1", rpm=10_000)
        model = build_model(spec, role="subagent", meter=meter, inner=simulated(), breaker=DOWN)
        calls = 0
        try:
            while calls < 1000:
                model.generate(ASK)
                calls += 1
        except BudgetExceeded:
            pass
        return {"pid": os.getpid(), "calls": calls, "tokens": meter.total().total_tokens}

@ray.remote(num_cpus=1, max_retries=0)
def sees_an_outage(limits):
    with cluster_limits(limits):
        spec = ModelSpec(model_id="simulated/answer", api_base="http://127.0.0.1:9/v1")
        model = build_model(spec, role="subagent", meter=UsageMeter(), inner=simulated(), breaker=DOWN)
        model.breaker.record(False, "ConnectionError: refused")
        return os.getpid()

out = {}
limiter = ClusterLimiter.start(budget=Budget(max_tokens=2_000))
out["callers"] = ray.get([caller.remote(limiter.limits, barrier) for barrier in [Barrier.remote()] for _ in range(2)])
grants = limiter.grants()
out["grants"] = [t for key, t in grants if key == "provider-x"]
out["spenders"] = ray.get([spender.remote(limiter.limits, barrier) for barrier in [Barrier.remote()] for _ in range(2)])
out["spent"] = limiter.spent()
out["factory_grants"] = sum(1 for key, _ in limiter.grants() if key == "127.0.0.1:9")
out["outages"] = ray.get([sees_an_outage.remote(limiter.limits) for _ in range(2)])
# two outage failures, one in each worker, opened the cluster's breaker: the driver is refused too
breaker = ClusterGates(ray.get_actor(limiter.limits.name, namespace="amapreduce")).breaker("127.0.0.1:9", DOWN)
try:
    breaker.admit()
    out["breaker"] = "admitted"
except ProviderUnavailable as exc:
    out["breaker"] = str(exc)
# a provider's Retry-After holds every caller of the key back
gates = ClusterGates(ray.get_actor(limiter.limits.name, namespace="amapreduce"))
quiet = gates.limiter("provider-y", WindowPolicy(rpm=1000, window_s=60.0))
first = quiet.acquire()
quiet.defer(0.4)
again = gates.limiter("provider-y", WindowPolicy(rpm=1000, window_s=60.0)).acquire()
out["deferred"] = again[0] - first[0]
limiter.stop()
out["pid"] = os.getpid()
print(json.dumps(out))
ray.shutdown()
"""


@pytest.mark.slow
def test_the_cluster_limiter_holds_across_two_worker_processes() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMAPREDUCE_")}
    env.update(AMAPREDUCE_ENV_FILE=os.devnull, RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, "-c", RAY_DRIVER, str(RPM), str(WINDOW_S), str(CALLS)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])

    # two worker processes, neither of them the driver, made every call
    assert len(set(out["callers"])) == 2 and out["pid"] not in out["callers"]
    grants = sorted(out["grants"])
    assert len(grants) == 2 * CALLS
    # never more than RPM grants in any window: the (RPM+1)-th grant after any grant is a window later
    assert all(grants[i + RPM] - grants[i] >= WINDOW_S for i in range(len(grants) - RPM))

    # the factory's models (built inside `cluster_limits`) took their tickets from the cluster's window
    spenders = out["spenders"]
    assert len({s["pid"] for s in spenders}) == 2 and all(s["calls"] > 0 for s in spenders)
    assert out["factory_grants"] == sum(s["calls"] for s in spenders)
    # ... and were charged to one budget: together they stopped at it, each worker at most one call over
    per_call = max(s["tokens"] // s["calls"] for s in spenders)
    spent_tokens = out["spent"][1]
    assert spent_tokens == sum(s["tokens"] for s in spenders)
    assert 2_000 <= spent_tokens < 2_000 + 2 * per_call
    assert sum(s["tokens"] for s in spenders) < 2 * 2_000  # one budget, not one per worker

    # one breaker for the cluster: a failure in each of two workers opened it for everyone
    assert out["breaker"].startswith("provider '127.0.0.1:9' is unavailable: 2 requests in a row failed")
    # Retry-After: the next grant waited at least the deferral
    assert out["deferred"] >= 0.4


def test_a_retry_after_defers_every_caller_of_a_local_limiter() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = WindowLimiter(WindowPolicy(rpm=100), clock=lambda: now[0], sleep=sleep)
    assert limiter.acquire()[0] == 100.0
    limiter.defer(5.0)
    limiter.defer(1.0)  # a shorter deferral changes nothing
    assert limiter.acquire()[0] >= 105.0 and sum(slept) >= 5.0


class _Gates:
    """Records what a model factory asked of the installed gates."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, Any]] = []
        self.window = WindowLimiter(WindowPolicy(rpm=100))

    def limiter(self, key: str, policy: WindowPolicy) -> WindowLimiter:
        self.asked.append(("limiter", key, policy))
        return self.window

    def breaker(self, key: str, policy: BreakerPolicy) -> Any:
        from amapreduce.breaker import CircuitBreaker

        self.asked.append(("breaker", key, policy))
        return CircuitBreaker(key, policy)


def test_models_built_under_installed_gates_use_them_and_the_default_comes_back() -> None:
    gates = _Gates()
    spec = ModelSpec(model_id="simulated/x", api_base="http://127.0.0.1:9/v1", rpm=5, tpm=900)
    policy = BreakerPolicy(failures=3, cooldown_s=1.0, max_wait_s=0.0)
    previous = use_provider_gates(gates)
    try:
        model = build_model(spec, role="subagent", meter=UsageMeter(), inner=FunctionModel(lambda m, i: "ok"),
                            breaker=policy)
        model.generate([])
    finally:
        assert use_provider_gates(previous) is gates
    assert gates.asked == [("limiter", "127.0.0.1:9", WindowPolicy(rpm=5, tpm=900)), ("breaker", "127.0.0.1:9", policy)]
    assert model.limiter is gates.window and gates.window.window_counts()[0] == 1
    local = build_model(spec, role="subagent", meter=UsageMeter(), inner=FunctionModel(lambda m, i: "ok"))
    assert local.limiter is not gates.window and len(gates.asked) == 2  # this process's own limiter again


def test_nothing_imports_ray_unless_asked() -> None:
    code = ("import sys\n"
            "import amapreduce.cluster, amapreduce.cluster.limits, amapreduce.cluster.wide, amapreduce.session.session\n"
            "import amapreduce.cli.mapreduce\n"
            "print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "False"


def test_a_worker_meter_holds_its_own_budget_and_the_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ClusterMeter` checks the worker's own budget (an evaluation trial's `--max-tokens`, as a local
    trial's meter does) and then the cluster's spend against the run's budget; both in the one
    wording of a spent budget. A stand-in for Ray's `get` and the actor: no cluster needed."""
    from amapreduce.cluster import limits as ray_limits
    from amapreduce.errors import BudgetExceeded
    from amapreduce.llm.meter import Budget
    from amapreduce.llm.usage import Usage

    class Actor:
        spent_so_far = (0.0, 0)

        class _Remote:
            def __init__(self, fn: Any) -> None:
                self.remote = fn

        def __init__(self) -> None:
            self.begin = self._Remote(lambda tag, later: self._state())
            self.end = self._Remote(lambda cost, tokens, tag, role, usage, later: self._state())

        def _state(self) -> Any:
            return ray_limits.CallState(*self.spent_so_far, halted=None, down=frozenset())

    class FakeRay:
        @staticmethod
        def get(value: Any) -> Any:
            return value

    monkeypatch.setattr(ray_limits, "_ray", lambda: FakeRay)
    actor = Actor()
    meter = ray_limits.ClusterMeter(actor, Budget(max_cost_usd=1.0), local_budget=Budget(max_tokens=100))
    meter.check()
    meter.record("subagent", "m", Usage(requests=1, input_tokens=60, output_tokens=40))
    with pytest.raises(BudgetExceeded, match="token budget of 100 is spent \\(100 tokens\\)"):
        meter.check()
    other = ray_limits.ClusterMeter(actor, Budget(max_cost_usd=1.0), local_budget=Budget(max_tokens=100))
    actor.spent_so_far = (1.5, 10)
    with pytest.raises(BudgetExceeded, match="cost budget of \\$1 is spent across the cluster"):
        other.check()


def test_the_ledger_keeps_each_attempts_calls_and_entries_and_a_halt_reaches_only_its_run() -> None:
    """The limiter actor's class, in this process: a call's usage goes to its attempt's ledger in the
    same step as the run's spend; `left` hands an attempt's record over once; `halt` stops one wide
    run's attempts, not another's nor the untagged calls of an `ask`'s manager."""
    from amapreduce.cluster.limits import AttemptLedger, LimiterActor
    from amapreduce.llm.meter import Budget
    from amapreduce.llm.usage import Usage
    from amapreduce.mapreduce.checkpoint import ExecutionStarted

    actor = LimiterActor(Budget(max_tokens=100), 0.0, 5)
    assert actor.spend(0.5, 10, "r1.0.0", "subagent", Usage(requests=1, input_tokens=10)) == (0.5, 15)
    actor.spend(0.25, 4, "r1.0.0", "subagent", Usage(requests=1, input_tokens=4))
    actor.spend(0.0, 3)  # the manager's call: the run's spend only
    start, again = ExecutionStarted(execution=1, decision={}, plan={}), ExecutionStarted(execution=2, decision={}, plan={})
    actor.keep("r1.0.0", 1, again)  # arrived first, journaled second
    actor.keep("r1.0.0", 0, start)
    assert actor.left("r1.0.0") == AttemptLedger(usage={"subagent": Usage(requests=2, input_tokens=14)},
                                                 entries=[start, again])
    assert actor.left("r1.0.0") == AttemptLedger(usage={}, entries=[])  # handed over once
    assert actor.spent() == (0.75, 22)
    actor.halt("r1", "chunk 0: the token budget is spent")
    assert actor.state("r1.3.1") == (0.75, 22, "chunk 0: the token budget is spent")
    assert actor.state("r2.0.0")[2] is None and actor.state()[2] is None
    assert actor.halted("r1.0.2") == "chunk 0: the token budget is spent"


class _Handle:
    """A `LimiterActor` in this process behind Ray's call syntax (`handle.method.remote(...)`),
    recording each call it serves: the round trips a worker would make."""

    def __init__(self, actor: Any) -> None:
        self.actor, self.calls = actor, []

    def __getattr__(self, name: str) -> Any:
        method, calls = getattr(self.actor, name), self.calls

        class Method:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                return method(*args, **kwargs)
        return Method()


def _in_process(monkeypatch: pytest.MonkeyPatch, budget: Any = None) -> Any:
    """A limiter actor in this process, reached through a stand-in for Ray (no cluster needed)."""
    from amapreduce.cluster import limits as ray_limits
    from amapreduce.llm.meter import Budget

    class FakeRay:
        @staticmethod
        def get(value: Any) -> Any:
            return value

    monkeypatch.setattr(ray_limits, "_ray", lambda: FakeRay)
    return _Handle(ray_limits.LimiterActor(budget or Budget(), 0.0, 0))


def _model(handle: Any, meter: Any, **spec: Any) -> Any:
    from amapreduce.cluster.limits import ClusterGates

    previous = use_provider_gates(ClusterGates(handle))
    try:
        return build_model(ModelSpec(model_id="simulated/x", api_base="http://127.0.0.1:9/v1", **spec), role="subagent",
                           meter=meter, inner=FunctionModel(lambda m, i: "ok"),
                           breaker=BreakerPolicy(failures=2, cooldown_s=600.0, max_wait_s=0.0))
    finally:
        use_provider_gates(previous)


def test_a_model_call_is_one_round_trip_to_the_cluster_limiter_and_its_gates_are_settled_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no budget: a thread's first call asks the actor as it begins (halt, budget, breakers),
    each later call only at its end, which carries its spend, its window ticket's tokens and its
    breaker's answer; the usage of every call is in the attempt's ledger when the call returns."""
    from amapreduce.cluster.limits import ClusterMeter

    handle = _in_process(monkeypatch)
    meter = ClusterMeter(handle, handle.actor.budget(), tag="r1.0.0")
    model = _model(handle, meter)
    handle.actor.record("127.0.0.1:9", BreakerPolicy(failures=2, cooldown_s=600.0, max_wait_s=0.0), False, "down")
    for _ in range(3):
        model.generate([])
    assert handle.calls == ["begin", "end", "end", "end"]
    breaker = handle.actor._breakers["127.0.0.1:9"]
    assert breaker._failures == 0  # the answers reached the cluster's breaker: "in a row" is kept
    assert handle.actor.left("r1.0.0").usage == meter.by_role()  # every call's usage, as the worker counts it
    assert handle.actor.spent() == (0.0, meter.total().total_tokens)

    # a provider rate: one more round trip per call for the window's turn; the tokens go with the end
    handle.calls.clear()
    limited = ClusterMeter(handle, handle.actor.budget(), tag="r1.1.0")
    windowed = _model(handle, limited, rpm=10_000, tpm=1_000_000)
    for _ in range(2):
        windowed.generate([])
    assert handle.calls == ["begin", "acquire", "end", "acquire", "end"]
    assert handle.actor._tickets == {}  # each ticket settled with the call's tokens
    window = handle.actor._windows["127.0.0.1:9"]
    assert window.window_counts() == (2, limited.total().total_tokens)


def test_with_a_budget_each_call_asks_the_cluster_as_it_begins_and_none_starts_once_it_is_spent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers (meters) on one budget, calling in turn: every call begins with the run's spend
    as the actor holds it, so the first call after the budget is crossed, in either worker, is
    refused: the run is over by at most the call that crossed it (none was in flight)."""
    from amapreduce.cluster.limits import ClusterMeter
    from amapreduce.errors import BudgetExceeded
    from amapreduce.llm.meter import Budget

    handle = _in_process(monkeypatch, Budget(max_tokens=50))
    meters = [ClusterMeter(handle, Budget(max_tokens=50), tag=f"r1.{k}.0") for k in range(2)]
    models = [_model(handle, meter) for meter in meters]
    calls, stopped = 0, set()
    while len(stopped) < 2 and calls < 100:
        for k, model in enumerate(models):
            try:
                model.generate([])
                calls += 1
            except BudgetExceeded:
                stopped.add(k)
    per_call = meters[0].total().total_tokens // max(1, meters[0].total().requests)
    spent = handle.actor.spent()[1]
    assert spent == sum(m.total().total_tokens for m in meters)
    assert 50 <= spent < 50 + per_call  # not one call more than the one that crossed it
    assert handle.calls.count("begin") == calls + 2 and handle.calls.count("end") == calls  # + the two refusals


def test_a_dead_workers_calls_are_all_in_the_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    """No call's usage waits in a worker: each call's end is sent before the call returns, so a worker that dies
    after any call has left that call's usage in its attempt's ledger (and in the run's spend);
    read after each call, the ledger adds up to the worker's own count, role by role."""
    from amapreduce.cluster.limits import ClusterMeter
    from amapreduce.llm.usage import Usage

    handle = _in_process(monkeypatch)
    meter = ClusterMeter(handle, handle.actor.budget(), tag="r2.0.0")
    model = _model(handle, meter, rpm=10_000)
    read = Usage()
    for calls in range(1, 4):
        model.generate([])
        left = handle.actor.left("r2.0.0").usage  # as the driver reads it when the worker died here
        assert left["subagent"].requests == 1
        read = read + left["subagent"]
        assert read == meter.by_role()["subagent"] and meter.total().requests == calls
    assert handle.actor.spent()[1] == meter.total().total_tokens


def test_a_retry_is_admitted_by_the_cluster_breaker_after_the_answers_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request of a call is admitted on the breaker state its call began with; a retry
    asks the actor, after delivering the answers its call deferred (they may close the breaker)."""
    from amapreduce.cluster.limits import ClusterGates, ClusterMeter

    handle = _in_process(monkeypatch)
    meter = ClusterMeter(handle, handle.actor.budget(), tag="r3.0.0")
    breaker = ClusterGates(handle).breaker("127.0.0.1:9", BreakerPolicy(failures=2, cooldown_s=600.0, max_wait_s=0.0))
    meter.check()
    assert breaker.admit() is False and handle.calls == ["begin"]
    breaker.record(False, None)  # answered (a 429, say): deferred to the call's end
    assert handle.calls == ["begin"]
    assert breaker.admit() is False
    assert handle.calls == ["begin", "deliver", "admit"]
    breaker.record(False, "ConnectionError: refused")  # an outage failure is told at once
    assert handle.calls[-1] == "record" and handle.actor._breakers["127.0.0.1:9"]._failures == 1


def test_with_no_budget_a_call_sends_its_end_without_waiting_and_flush_waits_for_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No budget, no provider rate: a call's end (its spend, usage and answers) is sent before the
    call returns but not waited for; the thread's next call takes its reply, and `flush` (a chunk or
    trial returning) waits for every end still unanswered. With a budget each end is waited for."""
    from amapreduce.cluster import limits as ray_limits
    from amapreduce.cluster.limits import CallState, ClusterMeter
    from amapreduce.llm.meter import Budget

    handle = _in_process(monkeypatch)
    waited: list[Any] = []

    class Recording:
        @staticmethod
        def get(value: Any) -> Any:
            waited.append(value)
            return value

    monkeypatch.setattr(ray_limits, "_ray", lambda: Recording)
    meter = ClusterMeter(handle, handle.actor.budget(), tag="r4.0.0")
    model = _model(handle, meter)
    for _ in range(3):
        model.generate([])
    assert handle.calls == ["begin", "end", "end", "end"]
    assert len(waited) == 1 and isinstance(waited[0], CallState)  # the first call's begin only
    meter.flush()
    assert len(waited) == 2 and len(waited[1]) == 3  # the three ends, waited for at once
    assert handle.actor.left("r4.0.0").usage == meter.by_role()

    waited.clear()
    budgeted = ClusterMeter(handle, Budget(max_tokens=10_000), tag="r4.1.0")
    charged = _model(handle, budgeted)
    for _ in range(2):
        charged.generate([])
    assert len(waited) == 4  # each call's begin and end
    budgeted.flush()
    assert len(waited) == 4  # nothing left unanswered
