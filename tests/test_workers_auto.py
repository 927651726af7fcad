"""Workers that fit the server (issue 37, part 4): `--workers auto` runs the server's slots where it
reports them, else adapts the attempts in flight: grown while throughput rises, halved on a timeout or
a 429 (`mapreduce.concurrency`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from solvers import WorldSolver, world, world_decision
from typer.testing import CliRunner

from amapreduce.decision import Decision
from amapreduce.llm.retry import ProviderRetry
from amapreduce.llm.wrappers.trace import CallEvents
from amapreduce.mapreduce.concurrency import AUTO_MAX_WORKERS, AUTO_START_WORKERS, AdaptiveWorkers
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.events import WorkersChanged
from amapreduce.mapreduce.solver import BatchRequest
from amapreduce.settings import load_settings


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(adapted: AdaptiveWorkers, clock: FakeClock, *, capacity: int, attempts: int, base_s: float = 1.0) -> list[int]:
    """A server that computes `capacity` requests at once (more only queue): each attempt in flight
    takes `base_s * max(1, in flight / capacity)`; the limits seen, attempt by attempt (deterministic)."""
    seen = []
    for _ in range(attempts):
        limit = adapted.limit
        clock.now += base_s * max(1.0, limit / capacity) / limit  # `limit` in flight finish at this rate
        adapted.settled("ok")
        seen.append(adapted.limit)
    return seen


def test_the_limit_grows_while_throughput_rises_and_holds_once_the_server_is_saturated() -> None:
    clock = FakeClock()
    changes: list[tuple[int, int, str]] = []
    adapted = AdaptiveWorkers(16, clock=clock, on_change=lambda *c: changes.append(c))
    seen = serve(adapted, clock, capacity=4, attempts=400)
    assert seen[0] == AUTO_START_WORKERS and seen[-1] == 4  # the server's 4: more did not help, so it held
    assert [c[1] for c in changes] == [4, 8, 4]  # doubled while it helped, the doubling that did not taken back
    assert "throughput rose" in changes[0][2] and "saturated below 8" in changes[2][2]


def test_the_slow_start_reaches_a_hosted_apis_capacity_in_a_few_windows_and_takes_back_what_only_queued() -> None:
    clock = FakeClock()
    hosted = AdaptiveWorkers(AUTO_MAX_WORKERS, clock=clock)
    seen = serve(hosted, clock, capacity=1000, attempts=60)
    assert seen[-1] == AUTO_MAX_WORKERS  # 2, 4, 8, 16, 32: four windows (60 attempts), not 30 steps of one
    changes: list[tuple[int, int, str]] = []
    adapted = AdaptiveWorkers(64, clock=(other := FakeClock()), on_change=lambda *c: changes.append(c))
    seen = serve(adapted, other, capacity=12, attempts=600)
    assert [c[1] for c in changes] == [4, 8, 16, 32, 16]  # 32 brought no more than 16 (the server's 12): back to 16
    assert seen[-1] == 16  # and one more would not help either: it holds
    single = AdaptiveWorkers(32, clock=(one := FakeClock()))
    assert serve(single, one, capacity=1, attempts=100)[-1] == AUTO_START_WORKERS  # a one-slot server: back to 2


def test_pressure_halves_the_limit_once_per_burst_and_never_below_one() -> None:
    clock = FakeClock()
    adapted = AdaptiveWorkers(32, start=16, clock=clock)
    adapted.pressure("429")
    adapted.pressure("429")  # the same burst: the calls in flight at once all got a 429
    assert adapted.limit == 8
    adapted.settled("ok")
    adapted.settled("timeout")  # a deadline passed: the next signal halves again
    assert adapted.limit == 4
    for _ in range(5):
        adapted.settled("ok")
        adapted.pressure("429")
    assert adapted.limit == 1


def test_the_limit_never_grows_past_its_maximum() -> None:
    clock = FakeClock()
    adapted = AdaptiveWorkers(3, clock=clock)
    assert serve(adapted, clock, capacity=100, attempts=200)[-1] == 3
    with pytest.raises(ValueError, match="at least 1"):
        AdaptiveWorkers(0)


def test_an_adapted_engine_never_has_more_in_flight_than_its_limit() -> None:
    truth = world(60)
    lock, running, most = threading.Lock(), [0], [0]

    def hook(request: BatchRequest) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])

    class Counting(WorldSolver):
        def solve(self, request: BatchRequest):  # type: ignore[no-untyped-def]
            try:
                return super().solve(request)
            finally:
                with lock:
                    running[0] -= 1

    engine = MapReduceEngine(Counting(truth, hook=hook, sleep=(0.001, 0.003)),
                             config=EngineConfig(workers=6, adaptive=True, patch_rounds=0, max_batches=None))
    limits = [AUTO_START_WORKERS]
    engine.events.subscribe(WorkersChanged, lambda e: limits.append(e.workers))
    result = engine.run(Decision.parse(world_decision(truth)))
    assert result.summary.completeness.complete
    assert engine.concurrency is not None and 1 <= engine.concurrency.limit <= 6
    assert most[0] <= max(limits)  # the invariant, whatever the machine's timing


def test_a_rate_limited_provider_halves_an_adapted_engine_through_the_models_retries() -> None:
    from amapreduce.session.parts import _adapt_to_rate_limits

    engine = MapReduceEngine(WorldSolver(world(1)), config=EngineConfig(workers=32, adaptive=True))
    assert engine.concurrency is not None
    engine.concurrency.pressure("start high")  # 2 -> 1: let it start from 8 instead
    engine.concurrency = AdaptiveWorkers(32, start=8)

    class Model:
        events = CallEvents(role="subagent", model_id="m")

    unsubscribe = _adapt_to_rate_limits(engine, Model())  # type: ignore[arg-type]
    Model.events.emit(ProviderRetry(role="subagent", model_id="m", retry=1, kind="server", delay_s=0.1, error=None))
    assert engine.concurrency.limit == 8  # a 5xx is no sign of too many in flight
    Model.events.emit(ProviderRetry(role="subagent", model_id="m", retry=1, kind="rate_limit", delay_s=0.1, error=None))
    assert engine.concurrency.limit == 4
    unsubscribe()  # the run's parts closed: a model that outlives them tells this engine nothing more
    engine.concurrency.settled("ok")
    Model.events.emit(ProviderRetry(role="subagent", model_id="m", retry=1, kind="rate_limit", delay_s=0.1, error=None))
    assert engine.concurrency.limit == 4


def test_settings_and_the_engine_config_read_auto() -> None:
    assert load_settings({}, workers="auto").workers_auto
    assert load_settings({"AMAPREDUCE_WORKERS": "auto"}).workers_auto
    assert not load_settings({}, workers="4").workers_auto and load_settings({}, workers="4").workers == 4
    auto = load_settings({}, workers="auto")
    assert EngineConfig.from_settings(auto, decisions_by="user", slots=3).model_dump(include={"workers", "adaptive"}) == {
        "workers": 3, "adaptive": False}  # the server's slots, where it reports them
    assert EngineConfig.from_settings(auto, decisions_by="user").model_dump(include={"workers", "adaptive"}) == {
        "workers": AUTO_MAX_WORKERS, "adaptive": True}
    fixed = load_settings({}, workers="4")
    assert EngineConfig.from_settings(fixed, decisions_by="user", slots=3).workers == 4  # a number given is kept


def test_auto_is_the_default_for_an_api_base_endpoint_and_a_number_given_wins() -> None:
    base = "http://127.0.0.1:8080/v1"
    assert load_settings({}, api_base=base).workers_auto
    assert load_settings({"OPENAI_BASE_URL": base}).workers_auto  # however the endpoint is given
    assert not load_settings({}).workers_auto and load_settings({}).workers == 8  # a LiteLLM provider keeps 8
    assert not load_settings({}, api_base=base, workers="8").workers_auto
    assert not load_settings({"AMAPREDUCE_WORKERS": "6"}, api_base=base).workers_auto
    assert not load_settings({}, api_base=base, workers_auto=False).workers_auto  # asked off, stays off (a resume)


def test_the_cli_takes_auto_and_refuses_anything_else(tmp_path: Path) -> None:
    from amapreduce.cli.app import app

    done = CliRunner().invoke(app, ["mapreduce", "run", str(tmp_path / "d.json"), "--workers", "many"])
    assert done.exit_code == 2 and "neither a number of at least 1 nor" in " ".join(done.output.split())
    assert not (tmp_path / "runs").exists()  # refused before anything is made
    shown = " ".join(CliRunner().invoke(app, ["mapreduce", "run", "--help"]).output.split())
    assert "--workers" in shown and "or `auto`" in shown.replace("│ ", "")


def test_mapreduce_run_with_workers_auto_adapts_and_traces_each_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path users run: `mapreduce run --workers auto` against a loopback endpoint that reports no
    slots (a simulated model: deterministic code) adapts its workers, and the trace says how."""
    import json
    import re

    from amapreduce.cli.app import main
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.llm.messages import message_text
    from amapreduce.session.rundir import read_run
    from amapreduce.testing.openai_server import OpenAICompatibleServer
    from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer
    from amapreduce.trace import read_trace

    def sub_agent(messages: list[object], info: ModelInfo) -> object:
        asked = re.findall(r"code of (item\d{3})\?", "\n".join(message_text(m) for m in messages).rsplit("Sub-questions:", 1)[-1])
        return final_answer(json.dumps([{"task": 1, "item": item, "code": item.upper()} for item in asked]))

    decision = tmp_path / "d.json"
    decision.write_text(json.dumps({
        "task_matrix": [[f"item{i:03d}"] for i in range(40)], "template": "What is the code of __0__?",
        "json_schema": {"type": "object", "properties": {"item": {}, "code": {}}},
        "batch_strategy": {"type": "per_atom", "rationale": "independent look-ups"}}), encoding="utf-8")
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    with OpenAICompatibleServer(FunctionModel(sub_agent, model_id="sim-model"), latency_s=0.01) as server, \
            allow_model_requests():
        code = main(["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                     "--workers", "auto", "--json"])
        out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["status"] == "complete" and out["rows"] == 40
    run = read_run(tmp_path / "runs", out["run_dir"])
    changes = list(read_trace(run.path / "trace.jsonl", event="workers"))
    assert all(c["workers"] != c["previous"] and c["why"] for c in changes)  # each change says why
    assert read_run_settings(run.path)["workers_auto"] is True  # a resume adapts too


def read_run_settings(path: Path) -> dict[str, object]:
    from amapreduce.session.journal import read_run_journal

    saved = read_run_journal(path)
    assert saved is not None
    return dict(saved.first.settings)


def test_an_attempt_abandoned_at_its_deadline_closes_its_request_on_the_server(tmp_path: Path) -> None:
    """The server sees the connection of an abandoned attempt's model call close (so it may stop
    computing a reply nobody reads), instead of the call running on in a stuck thread."""
    import select
    import socket
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from smolagents.models import ChatMessage, MessageRole

    from amapreduce.llm.factory import new_meter
    from amapreduce.llm.guard import allow_model_requests
    from amapreduce.mapreduce.solver import SolverReply
    from amapreduce.session.parts import build_models

    closed = threading.Event()

    class Never(BaseHTTPRequestHandler):
        """Reads the request, answers nothing, and notes when the client closes the connection."""

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("content-length", "0")))
            for _ in range(600):  # up to a minute: the test fails, not hangs, if nothing closes it
                readable, _, _ = select.select([self.connection], [], [], 0.1)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    closed.set()
                    return

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Never)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = load_settings({}, model="sim-model", api_base=f"http://127.0.0.1:{server.server_address[1]}/v1",
                                 api_key="sk-test-abandon", endpoint_probe=False, runs_dir=tmp_path / "runs",
                                 extraction_model="none", retry_max_retries=0, model_timeout_s=60)
        meter = new_meter(settings)
        model = build_models(settings, ("subagent",), meter=meter)["subagent"]

        class Asking:
            def solve(self, request: BatchRequest) -> SolverReply:
                model.generate([ChatMessage(role=MessageRole.USER, content=request.prompt)])
                return SolverReply(output="[]")

        engine = MapReduceEngine(Asking(), config=EngineConfig(workers=1, max_attempts=1, patch_rounds=0,
                                                               batch_timeout_s=0.5))
        with allow_model_requests():
            result = engine.run(Decision.parse(world_decision(world(1))))
        assert [a.outcome for a in result.attempts] == ["timeout"]
        assert closed.wait(30), "the abandoned attempt's request stayed open on the server"
        for _ in range(100):  # the dropped call is charged as its worker's thread unwinds
            if meter.total().requests:
                break
            time.sleep(0.05)
        charged = meter.total()  # the request was sent: charged as sent, its prompt an estimate
        assert charged.requests == 1 and charged.abandoned == 1 and charged.input_tokens > 0 and charged.output_tokens == 0
    finally:
        server.shutdown()
        server.server_close()
