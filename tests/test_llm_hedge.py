"""Hedged model calls (`amapreduce.llm.hedge`) against a real HTTP server on loopback: a late
request gets one hedge and the first valid reply wins, the loser is cancelled and both are
counted; no hedge before the threshold is known or crossed; the run's extra-call cap holds.

No wall-clock assertion: the server holds a request until the test releases it (events), and
the hedger runs on a fake clock, its lateness check called by the test (`Hedger.check`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from smolagents import OpenAIModel
from smolagents.models import ChatMessage, MessageRole

from amapreduce.llm.chat_client import ChatCompletionsClient, Reply
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.hedge import STALE, ExtraCalls, HedgeOutcome, HedgePolicy, Hedger, LatencyWindow
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.llm.scope import UsageScope, usage_scope
from amapreduce.llm.wrappers.base import layer_of
from amapreduce.llm.wrappers.hedge import HedgeModel
from amapreduce.mapreduce.backup import BackupPolicy, Stragglers
from tests.fake_clock import FakeTime


def completion(text: str, prompt_tokens: int) -> dict[str, Any]:
    return {"id": text, "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2}}


class Script:
    """The n-th request is held until `release[n]` is set, then answered with `answers[n]`."""

    def __init__(self, answers: list[dict[str, Any]], held: set[int]) -> None:
        self.answers = answers
        self.release = [threading.Event() for _ in answers]
        for n, event in enumerate(self.release):
            if n not in held:
                event.set()
        self.arrived = [threading.Event() for _ in answers]
        self.answered = [threading.Event() for _ in answers]
        self._lock = threading.Lock()
        self.count = 0


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []
    scripts: list[Script] = []

    def start(script: Script) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                with script._lock:
                    n, script.count = script.count, script.count + 1
                script.arrived[n].set()
                script.release[n].wait(30)
                content = json.dumps(script.answers[n]).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content)
                    script.answered[n].set()
                except OSError:  # the client cancelled the request and closed the connection
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scripts.append(script)
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for script in scripts:
        for event in script.release:
            event.set()
    for server in servers:
        server.shutdown()
        server.server_close()


def trained(hedger: Hedger, shape: int = 1, seconds: float = 1.0) -> Hedger:
    """`hedger` after `min_samples` finished calls of `seconds` each."""
    for _ in range(hedger.policy.min_samples):
        hedger.latencies.add(shape, seconds)
    return hedger


def request() -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Find the capital of Country_001."}]}


def wait_attached(hedger: Hedger) -> None:
    """Until the request in flight has its socket attached (it is on the wire)."""
    for _ in range(2000):
        with hedger._cond:
            races = list(hedger._inflight.values())
        if races and races[0].first.cancellable:
            return
        threading.Event().wait(0.005)
    raise AssertionError("the request never went on the wire")


def test_a_late_request_gets_a_hedge_and_the_faster_reply_wins(serve: Any) -> None:
    script = Script([completion("slow", 10), completion("fast", 10)], held={0})
    client = ChatCompletionsClient(base_url=serve(script), api_key="k")
    clock, outcomes = FakeTime(), list[HedgeOutcome[Any]]()
    admitted: list[tuple[int, bool]] = []

    def admit(size: int, again: bool, overdue: float) -> bool:
        admitted.append((size, again))
        return True

    client.hedger = trained(Hedger(HedgePolicy(min_samples=3, multiple=1.5), admit=admit,
                                   report=outcomes.append, clock=clock.clock, watch=False))
    with allow_model_requests(), ThreadPoolExecutor(1) as pool:
        call: Future[Reply] = pool.submit(client.post, "chat/completions", request())
        assert script.arrived[0].wait(10)
        wait_attached(client.hedger)
        assert client.hedger.check() == 1.2  # not late yet: 1.2 x the p90 of 1 s comes before 1.5 x the p75
        clock.sleep(1.2)
        assert client.hedger.check() in (None, 2.4) and client.hedger.sent == 1  # 2.4: a second hedge if this one is late too
        answer = call.result(timeout=10)
    assert answer.id == "fast"  # the hedge's reply, while the first request was still held
    assert not script.answered[0].is_set()  # ... and never answered: it was cancelled
    assert len(admitted) == 1 and admitted[0][1] is False
    (outcome,) = outcomes
    assert outcome.winner == "hedge" and outcome.after_s == 1.2 and outcome.threshold_s == 1.2
    assert outcome.losers == (None,) and outcome.request_bytes > 0


def test_the_first_reply_wins_when_it_comes_before_the_hedges(serve: Any) -> None:
    script = Script([completion("first", 10), completion("hedge", 10)], held={0, 1})
    client = ChatCompletionsClient(base_url=serve(script), api_key="k")
    clock, outcomes = FakeTime(), list[HedgeOutcome[Any]]()
    client.hedger = trained(Hedger(HedgePolicy(min_samples=1), admit=lambda size, again, overdue: True, report=outcomes.append,
                                   clock=clock.clock, watch=False))
    with allow_model_requests(), ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.post, "chat/completions", request())
        assert script.arrived[0].wait(10)
        wait_attached(client.hedger)
        clock.sleep(2.0)
        client.hedger.check()
        assert script.arrived[1].wait(10)  # the hedge is on the wire, held too
        script.release[0].set()
        assert call.result(timeout=10).id == "first"
    assert [o.winner for o in outcomes] == ["first"] and outcomes[0].losers == (None,)


def test_no_hedge_before_enough_calls_finished_nor_below_the_threshold(serve: Any) -> None:
    script = Script([completion("only", 10)], held={0})
    client = ChatCompletionsClient(base_url=serve(script), api_key="k")
    clock = FakeTime()
    asked: list[int] = []

    def admit(size: int, again: bool, overdue: float) -> bool:
        asked.append(size)
        return True

    hedger = Hedger(HedgePolicy(min_samples=3, multiple=2.0, floor_s=0.5, spread=3.0), admit=admit,
                    clock=clock.clock, watch=False)
    client.hedger = hedger
    hedger.latencies.add(1, 1.0)
    hedger.latencies.add(1, 1.0)
    with allow_model_requests(), ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.post, "chat/completions", request())
        assert script.arrived[0].wait(10)
        wait_attached(hedger)
        clock.sleep(100.0)
        assert hedger.check() is None and not asked  # two calls finished: no threshold yet
        hedger.latencies.add(1, 0.1)
        assert hedger.latencies.threshold_s(1) == 2.0  # 2 x the p75 (1 s)
        clock.now = 0.0
        clock.sleep(1.9)
        assert hedger.check() == 2.0 and not asked  # below the threshold
        script.release[0].set()
        assert call.result(timeout=10).id == "only"
    assert hedger.sent == 0 and not asked and script.count == 1
    floor = Hedger(HedgePolicy(min_samples=1, floor_s=0.5))
    floor.latencies.add(0, 0.01)
    assert floor.latencies.threshold_s(0) == 0.5  # never below the floor
    assert floor.latencies.threshold_s(7) == 0.5  # a shape with too few calls uses all calls


def test_the_threshold_is_the_sooner_of_the_p75_and_the_p90_rule() -> None:
    steady = LatencyWindow(HedgePolicy(min_samples=10, floor_s=0.0))
    for seconds in [0.2] * 9 + [0.21]:
        steady.add(0, seconds)
    assert steady.threshold_s(0) == pytest.approx(1.2 * 0.2)  # steady latency: 20 % past nine calls in ten
    varied = LatencyWindow(HedgePolicy(min_samples=10, floor_s=0.0))
    for seconds in (0.5, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0, 2.5, 5.0, 8.0):
        varied.add(0, seconds)
    assert varied.threshold_s(0) == pytest.approx(2.0 * 2.5)  # widely varying: twice the p75, not 1.2 x 5 s


def test_a_late_call_that_should_end_before_a_hedge_could_is_left_alone() -> None:
    window = LatencyWindow(HedgePolicy(min_samples=4, floor_s=0.0, spread=3.0))
    for _ in range(4):
        window.add(0, 1.0)  # threshold 2 x 1 s
    assert window.ends_soon(0, 2.0, 9.5) is None  # no late call ended unhedged yet: hedge
    window.add(0, 10.0)  # a late call that ran 10 s, 5 thresholds
    threshold = window.threshold_s(0)
    assert threshold == 2.0
    assert window.ends_soon(0, threshold, 9.5) == 10.0  # due within a call's time: not worth one
    assert window.ends_soon(0, threshold, 3.0) is None  # far from it: hedge
    assert window.ends_soon(0, threshold, 10.5) is None  # outlived the late calls seen: hedge


def test_a_hedge_that_runs_late_too_gets_a_second_one_and_every_loser_is_reported(serve: Any) -> None:
    script = Script([completion("first", 10), completion("hedge", 10), completion("second", 10)], held={0, 1})
    client = ChatCompletionsClient(base_url=serve(script), api_key="k")
    clock, outcomes = FakeTime(), list[HedgeOutcome[Any]]()
    asks: list[tuple[bool, float]] = []

    def admit(size: int, again: bool, overdue: float) -> bool:
        asks.append((again, overdue))
        return True

    client.hedger = trained(Hedger(HedgePolicy(min_samples=1, spread=3.0), admit=admit, report=outcomes.append,
                                   clock=clock.clock, watch=False))
    with allow_model_requests(), ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.post, "chat/completions", request())
        assert script.arrived[0].wait(10)
        wait_attached(client.hedger)
        clock.sleep(2.0)
        assert client.hedger.check() == 4.0  # the hedge is sent; it turns late 2 s later
        assert script.arrived[1].wait(10)
        clock.sleep(2.0)
        assert client.hedger.check() is None  # the second hedge (the most a call sends): nothing more to watch
        assert call.result(timeout=10).id == "second"
    assert asks == [(False, 1.0), (True, 1.0)] and client.hedger.sent == 2
    (outcome,) = outcomes
    assert outcome.winner == "hedge" and outcome.hedges == 2 and outcome.losers == (None, None)
    assert not script.answered[0].is_set() and not script.answered[1].is_set()  # both cancelled


def test_while_work_waits_a_late_call_long_refused_is_left_alone() -> None:
    extra = ExtraCalls(0.05, needed=200)  # 10 extra calls
    extra.waiting = True
    assert not extra.take_hedge(overdue=STALE + 0.5) and extra.late == 1  # counted late, not hedged
    assert extra.take_hedge(again=True, overdue=STALE)
    extra.waiting = False  # the run's end: what it still saves delays the whole run
    assert extra.take_hedge(overdue=10 * STALE) and extra.late == 2


def test_a_managed_model_counts_both_requests_and_charges_the_runs_extra_calls(serve: Any) -> None:
    script = Script([completion("slow", 10), completion("fast", 30)], held={0})
    client = ChatCompletionsClient(base_url=serve(script), api_key="k")
    meter = UsageMeter()
    model = ManagedModel(OpenAIModel(model_id="m", client=client), role="subagent", meter=meter)
    assert isinstance(client.hedger, Hedger)  # a managed model installs one on our client
    hedging = layer_of(model, HedgeModel)  # the stack's hedge layer: what admits and charges a hedge
    clock = FakeTime()
    outcomes: list[HedgeOutcome[Any]] = []

    def report(outcome: HedgeOutcome[Any]) -> None:
        outcomes.append(outcome)
        hedging.hedged(outcome)

    hedger = client.hedger = trained(Hedger(HedgePolicy(min_samples=1), admit=hedging.may_hedge, report=report,
                                            clock=clock.clock, watch=False), shape=1)
    extra = ExtraCalls(0.05, needed=20)  # a cap of one extra call
    scope = UsageScope({"batch_id": "batch-001", "attempt": 1}, extra_calls=extra)

    def generate() -> ChatMessage:
        with usage_scope(scope):
            return model.generate([ChatMessage(role=MessageRole.USER, content="Find the capital of Country_001.")])

    with allow_model_requests(), ThreadPoolExecutor(1) as pool:
        call = pool.submit(generate)
        assert script.arrived[0].wait(10)
        wait_attached(hedger)
        clock.sleep(5.0)
        hedger.check()
        assert call.result(timeout=10).content == "fast"
    assert extra.spent == 1 and extra.hedges == 1 and extra.late == 1 and extra.calls == 1 and not extra.fits(1)
    used = meter.by_role()["subagent"]
    (outcome,) = outcomes  # the loser was cancelled: charged its request's size / 4 as its prompt
    assert used.requests == 2 and used.input_tokens == 30 + outcome.request_bytes // 4 and outcome.losers == (None,)
    assert used.abandoned == 1  # of the two requests, the cancelled one: its prompt an estimate (`Usage.abandoned`)
    assert scope.usage("subagent") == used  # the attempt's usage holds both requests


def test_the_extra_call_cap_holds_across_hedges_and_backups() -> None:
    extra = ExtraCalls(0.05, needed=40)  # 2 extra calls
    assert [extra.take_hedge() for _ in range(3)] == [True, True, False] and extra.late == 3
    st = Stragglers(BackupPolicy(min_samples=1))
    st.plan(20)
    st.extra.take_hedge()  # one hedged request of the run's 20 x 1 calls: the whole 5 % cap
    assert st.extra_calls == 1 and not st.room() and not st.admit()
    # While attempts wait for a slot, hedges leave the calls expected late at the run's end.
    tail = ExtraCalls(0.05, needed=200)  # 10 extra calls
    tail.held_back, tail.waiting = 8, True
    assert [tail.take_hedge() for _ in range(3)] == [True, True, False]
    tail.waiting = False  # nothing waits: the rest of the cap is the tail's
    assert tail.take_hedge(again=True) and tail.late == 3


def test_a_managed_model_hedges_only_inside_a_run_with_room(serve: Any) -> None:
    client = ChatCompletionsClient(base_url="http://127.0.0.1:9/v1", api_key="k")
    model = layer_of(ManagedModel(OpenAIModel(model_id="m", client=client), role="subagent", meter=UsageMeter()),
                     HedgeModel)
    assert not model.may_hedge(400, False)  # no run's scope: no budget for extra calls
    with usage_scope(UsageScope(extra_calls=ExtraCalls(0.05, needed=10))):
        assert not model.may_hedge(400, False)  # 5 % of 10 calls: not one whole call
    with usage_scope(UsageScope(extra_calls=ExtraCalls(0.05, needed=40))):
        assert model.may_hedge(400, False) and model.may_hedge(400, False) and not model.may_hedge(400, False)
