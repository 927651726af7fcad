"""OpenTelemetry traces (issue 13, part 2): one trace per run, every sub-agent under its batch, no key.

Before: with openinference's smolagents instrumentation on, the offline demo gave 8 traces: the
engine's worker threads started from an empty context, so each sub-agent run was a trace of its
own. Now `--otel` / `AMAPREDUCE_OTEL=1` turns the instrumentation on together with our spans (run,
plan stage, memory retrieval, map and patch rounds, batches, attempts), the executor runs every
job in a copy of its submitter's context, and every attribute is redacted of configured keys.

Offline throughout: spans go to the SDK's in-memory exporter (a fresh tracer provider per test:
the global one is never set), or to a loopback OTLP/HTTP collector; the models are simulated
(deterministic code, not LLMs), in process or behind the loopback OpenAI-compatible server.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from amapreduce import telemetry
from amapreduce.cli.app import main
from amapreduce.decision import Decision
from amapreduce.demo.run import run_demo
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.solver import SUBAGENT_NAME, SmolagentsSolver
from amapreduce.session import RunOptions, Session
from amapreduce.settings import Settings, load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call
from amapreduce.trace import REDACTED, register_secrets
from tests.test_cli_exit_codes import CLOSED_PORT, Items, decision_file, serving, workdir  # noqa: F401 - autouse
from tests.test_mapreduce_solver import lookup_capital

KEY = "sk-proj-OTELkey0123456789abcdefXYZ"

OUR_STRUCTURE = ("amapreduce.attempt", "amapreduce.batch")


@pytest.fixture(autouse=True)
def tracing_off_after() -> Iterator[None]:
    """No test leaves tracing on (nor smolagents instrumented) for the next."""
    yield
    telemetry.disable()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, exporting through a provider `enable` makes for this test (redacted at export)."""
    exporter = InMemorySpanExporter()
    telemetry.enable(exporter=exporter)
    yield exporter
    telemetry.disable()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


class Tree:
    """Finished spans indexed by id, with each span's chain of ancestors."""

    def __init__(self, finished: tuple[ReadableSpan, ...]) -> None:
        self.spans = list(finished)
        self.by_id = {s.context.span_id: s for s in self.spans}
        self.children: dict[int, list[ReadableSpan]] = collections.defaultdict(list)
        for s in self.spans:
            if s.parent is not None:
                self.children[s.parent.span_id].append(s)

    def parent(self, s: ReadableSpan) -> ReadableSpan | None:
        return None if s.parent is None else self.by_id[s.parent.span_id]  # KeyError: a dangling parent

    def ancestors(self, s: ReadableSpan) -> list[ReadableSpan]:
        out = []
        while (p := self.parent(s)) is not None:
            out.append(p)
            s = p
        return out

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def traces(self) -> dict[int, list[ReadableSpan]]:
        out: dict[int, list[ReadableSpan]] = collections.defaultdict(list)
        for s in self.spans:
            out[s.context.trace_id].append(s)
        return out


def all_text(finished: tuple[ReadableSpan, ...]) -> list[str]:
    """Every string a span carries out: attribute values, event names and attributes, status texts."""
    out: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, tuple | list):
            for v in value:
                add(v)

    for s in finished:
        for value in (s.attributes or {}).values():
            add(value)
        for event in s.events:
            add(event.name)
            for value in (event.attributes or {}).values():
                add(value)
        add(s.status.description)
    return out


def assert_sub_agents_under_their_batches(tree: Tree) -> int:
    """Every sub-agent run's span is a child of an attempt span, itself a child of the span of the
    same batch, under the map or a patch round; returns how many sub-agent runs there were."""
    agents = tree.named(f"{SUBAGENT_NAME}.run")
    for agent in agents:
        attempt = tree.parent(agent)
        assert attempt is not None and attempt.name == "amapreduce.attempt"
        batch = tree.parent(attempt)
        assert batch is not None and batch.name == "amapreduce.batch"
        assert batch.attributes["amapreduce.batch_id"] == attempt.attributes["amapreduce.batch_id"]
        phase = tree.parent(batch)
        assert phase is not None and phase.name in ("amapreduce.map", "amapreduce.patch_round")
    return len(agents)


# -- the demo: one trace per run -------------------------------------------------------------------


def test_each_demo_run_is_one_trace_with_every_sub_agent_under_its_batch(
    spans: InMemorySpanExporter, cache: Path, tmp_path: Path
) -> None:
    """The issue's check: was 8 traces for one demo run (the 7 sub-agent runs orphaned)."""
    # Stands in for a key a provider echoed: the manager's search results quote it, so the tool
    # span's output would carry it.
    register_secrets(["Countries of North America"])
    settings = Settings.model_validate({"cache_dir": cache, "runs_dir": tmp_path / "runs", "workers": 4})
    memory = tmp_path / "memory"
    first = run_demo("sbx_en_001", settings, memory_store=memory, sample=1)  # teaches the memory a hint
    second = run_demo("sbx_en_008", settings, memory_store=memory)  # the same family: the hint is retrieved
    assert first.ask.status == second.ask.status == "complete"
    finished = spans.get_finished_spans()
    tree = Tree(finished)

    traces = tree.traces()
    assert len(traces) == 2  # one per run, never shared
    for outcome in (first, second):
        (members,) = [t for t in traces.values() if any(
            s.attributes.get("session.id") == outcome.ask.run_dir.path.name for s in t)]
        roots = [s for s in members if s.parent is None]
        assert [r.name for r in roots] == ["amapreduce.run"]
        (root,) = roots
        assert root.attributes["amapreduce.status"] == "complete" and root.attributes["amapreduce.kind"] == "demo"
        assert root.attributes["amapreduce.rows"] == outcome.ask.record.completeness.rows
        assert all(tree.ancestors(s)[-1] is root for s in members if s is not root)
        assert any(s.attributes.get("openinference.span.kind") == "AGENT" and tree.parent(s) is root for s in members)
        sub = Tree(tuple(members))
        # Every attempt the JSONL trace (unchanged, still written) records is a span with a sub-agent run under it.
        events = [json.loads(line) for line in (outcome.ask.run_dir.path / "trace.jsonl").read_text().splitlines()]
        attempts = [e for e in events if e["event"] == "attempt"]
        assert len(sub.named("amapreduce.attempt")) == len(attempts) > 0
        assert assert_sub_agents_under_their_batches(sub) == len(attempts)
        (plan,) = sub.named("amapreduce.plan")
        tool = sub.parent(plan)
        assert tool is not None and tool.attributes.get("tool.name") == "mapreduce"
        (retrieval,) = sub.named("amapreduce.memory.retrieve")
        assert sub.parent(retrieval) is plan and retrieval.attributes["openinference.span.kind"] == "RETRIEVER"
        assert retrieval.attributes["input.value"] == outcome.ask.record.query
    hints = second.memory["prior"]["hint_ids"] if second.memory else []
    (retrieved,) = [s for s in tree.named("amapreduce.memory.retrieve") if "retrieval.documents.0.document.id" in s.attributes]
    assert hints and retrieved.attributes["retrieval.documents.0.document.id"] == hints[0]
    text = all_text(finished)
    assert not [t for t in text if "Countries of North America" in t]
    assert any(REDACTED in t for t in text)  # it was there, masked


# -- the engine: retries and patch rounds ----------------------------------------------------------


def test_retries_and_patch_rounds_stay_under_their_batch_in_one_trace() -> None:
    """A provider of the caller's own (a notebook's Phoenix): every attempt of a batch under that
    batch's span, the patch round's batch under the patch-round span, all in the caller's trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.enable(tracer_provider=provider)
    asked: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def sub_agent(messages: list[Any], info: ModelInfo) -> Reply:
        text = "\n".join(message_text(m) for m in messages)
        country = "Japan" if "Japan" in text.rsplit("Sub-questions:", 1)[-1] else "France"
        if "The capital of" not in text:
            return tool_call("lookup_capital", country=country)
        with lock:
            asked[country] += 1
            times = asked[country]
        capital = {"France": "Paris", "Japan": "Tokyo"}[country]
        # Japan's capital is found only by the third sub-agent: both map attempts leave it missing.
        found = capital if country == "France" or times >= 3 else None
        return final_answer(json.dumps([{"task": 1, "country": country, "capital": found}]))

    solver = SmolagentsSolver(model=FunctionModel(sub_agent), tools=[lookup_capital], max_steps=4)
    decision = Decision.parse({"task_matrix": [["France"], ["Japan"]], "template": "Capital of __0__",
                               "json_schema": ["country", "capital"]})
    engine = MapReduceEngine(solver, config=EngineConfig(workers=2, max_attempts=2, patch_rounds=1))
    with telemetry.span("notebook cell"):
        result = engine.run(decision)
    provider.shutdown()
    assert result.summary.missing_cells == 0 and result.summary.patch_rounds == 1
    tree = Tree(exporter.get_finished_spans())
    assert len(tree.traces()) == 1 and [s.name for s in tree.spans if s.parent is None] == ["notebook cell"]
    assert assert_sub_agents_under_their_batches(tree) == 4  # France 1, Japan 2, the patch 1
    batches = {s.attributes["amapreduce.batch_id"]: s for s in tree.named("amapreduce.batch")}
    japan = [b for b in batches.values() if tree.parent(b).name == "amapreduce.map" and b.attributes["amapreduce.attempts"] == 2]
    assert len(japan) == 1 and len(tree.children[japan[0].context.span_id]) == 2
    settled = [e for e in japan[0].events if e.name == "amapreduce.attempt_settled"]
    assert [e.attributes["amapreduce.attempt"] for e in settled] == [1, 2]
    (patch,) = tree.named("amapreduce.patch_round")
    assert patch.attributes["amapreduce.round"] == 1
    assert [tree.parent(b) for b in batches.values()].count(patch) == 1


# -- no key in any span ----------------------------------------------------------------------------


def test_no_key_in_what_openinference_records_with_the_callers_provider(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real client path (OpenAIModel → LLM spans with the input messages) and a question that
    quotes the key: openinference records the agent's task before any masking, so its attribute
    values are redacted as they are set (`TraceConfig.mask`), whatever provider exports them."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.enable(tracer_provider=provider)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAICompatibleServer(FunctionModel(Items(), model_id="sim-model"), api_key=KEY) as server:
        from amapreduce.llm.guard import allow_model_requests

        with allow_model_requests():
            code = main(["ask", f"What is the code of each item? (key {KEY})", "--model", "sim-model",
                         "--api-base", server.base_url, "--no-memory", "--otel", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["status"] == "complete"
    finished = exporter.get_finished_spans()
    tree = Tree(finished)
    assert len(tree.traces()) == 1 and assert_sub_agents_under_their_batches(tree) == 6
    llm = [s for s in finished if s.attributes.get("openinference.span.kind") == "LLM"]
    # What openinference records of each model call: the messages sent (as `llm.input_messages.*`,
    # or inside `input.value` when the test guard's wrapper hides `generate`'s signature from it).
    manager_calls = [s for s in llm if any("What is the code of each item?" in v for v in all_text((s,)))]
    assert len(manager_calls) == 3  # plan, execute, answer
    assert all(any(f"What is the code of each item? (key {REDACTED})" in v for v in all_text((s,))) for s in manager_calls)
    text = all_text(finished)
    assert not [t for t in text if KEY in t]
    (run,) = tree.named("amapreduce.run")
    assert run.attributes["input.value"] == f"What is the code of each item? (key {REDACTED})"
    assert any(s.attributes.get("openinference.span.kind") == "AGENT" and REDACTED in s.attributes["input.value"]
               for s in finished)


def test_a_key_the_provider_echoes_is_in_no_span_event_or_status(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provider refusing a key echoes it ("Incorrect API key provided: sk-..."); the exceptions
    openinference records (message and stack trace) carry it. Spans leaving through a provider
    `enable` made are redacted whole at export."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAICompatibleServer(FunctionModel(Items(), model_id="sim-model"), api_key="sk-the-right-one-000000") as server:
        from amapreduce.llm.guard import allow_model_requests

        with allow_model_requests():
            code = main(["mapreduce", "run", decision_file(Path.cwd()), "--model", "sim-model",
                         "--api-base", server.base_url, "--otel", "--json"])
        assert server.authorization and all(a == f"Bearer {KEY}" for a in server.authorization)  # sent, and echoed
    assert code == 1 and json.loads(capsys.readouterr().out)["status"] == "failed"
    finished = spans.get_finished_spans()
    assert len(Tree(finished).traces()) == 1
    text = all_text(finished)
    assert not [t for t in text if KEY in t]
    assert any(f"Incorrect API key provided: {REDACTED}" in t for t in text)
    (run,) = [s for s in finished if s.name == "amapreduce.run"]
    assert run.attributes["amapreduce.status"] == "failed" and run.status.status_code.name == "ERROR"


# -- off by default, and what turns it on ----------------------------------------------------------


def test_with_tracing_off_no_opentelemetry_module_is_imported(cache: Path, tmp_path: Path) -> None:
    """A whole demo run with tracing off, in a fresh interpreter: nothing of OpenTelemetry or
    openinference is loaded (the JSONL trace is the record, as before)."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from amapreduce.demo.run import run_demo\n"
        "from amapreduce.settings import Settings\n"
        "out = run_demo(None, Settings(cache_dir=Path(sys.argv[1]), runs_dir=Path(sys.argv[2])))\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'openinference'))\n"
        "print(json.dumps({'status': out.ask.status, 'loaded': loaded,\n"
        "                  'trace': (out.ask.run_dir.path / 'trace.jsonl').is_file()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(cache), str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"status": "complete", "loaded": [], "trace": True}


def test_off_again_smolagents_is_as_it_was_and_spans_cost_nothing() -> None:
    from smolagents import MultiStepAgent, Tool

    run, call = MultiStepAgent.run, Tool.__call__
    assert not telemetry.active() and telemetry.span("a") is telemetry.span("b")  # one shared no-op context
    with telemetry.span("a") as handle:
        assert handle is telemetry.NO_SPAN
    assert telemetry.open_span("b") is telemetry.NO_SPAN
    telemetry.enable(exporter=InMemorySpanExporter())
    assert telemetry.active() and MultiStepAgent.run is not run  # instrumented
    telemetry.disable()
    assert not telemetry.active() and MultiStepAgent.run is run and Tool.__call__ is call


def test_our_attribute_names_are_openinferences() -> None:
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

    assert telemetry.SPAN_KIND == SpanAttributes.OPENINFERENCE_SPAN_KIND
    assert telemetry.INPUT_VALUE == SpanAttributes.INPUT_VALUE and telemetry.OUTPUT_VALUE == SpanAttributes.OUTPUT_VALUE
    assert telemetry.SESSION_ID == SpanAttributes.SESSION_ID
    assert telemetry.CHAIN == OpenInferenceSpanKindValues.CHAIN.value
    assert telemetry.RETRIEVER == OpenInferenceSpanKindValues.RETRIEVER.value
    assert list(telemetry.retrieval_documents([("h1", "text", 2.0)])) == [
        f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.0.document.id", f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.0.document.content",
        f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.0.document.score"]


@pytest.mark.parametrize("command", ["demo", "ask", "mapreduce", "eval", "env"])
def test_without_the_extra_otel_is_a_usage_error_that_names_the_install(
    command: str, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the install line, and nothing made: no run directory, no evaluation folder."""
    monkeypatch.setitem(sys.modules, "openinference.instrumentation.smolagents", None)  # as if not installed
    monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(cache))
    model = ["--model", "sim-model", "--api-base", CLOSED_PORT]
    argv = {
        "demo": ["demo", "--no-memory", "--otel"],
        "ask": ["ask", "What is the code of each item?", *model, "--no-memory", "--otel"],
        "mapreduce": ["mapreduce", "run", decision_file(tmp_path), *model, "--otel"],
        "eval": ["eval", "run", "--benchmark", "sandbox", "--out", str(tmp_path / "eval"), "--no-memory", "--otel"],
        "env": ["demo", "--no-memory"],
    }[command]
    if command == "env":
        monkeypatch.setenv("AMAPREDUCE_OTEL", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pip install 'amapreduce[otel]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() and not (tmp_path / "eval").exists()
    assert not telemetry.active()


class _Collector(BaseHTTPRequestHandler):
    """A loopback OTLP/HTTP collector: keeps each request's path and body."""

    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


def test_amapreduce_otel_sends_each_run_to_the_collector_the_otel_variables_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "otel-test")
        settings = load_settings({"AMAPREDUCE_OTEL": "1", "AMAPREDUCE_API_KEY": KEY, "AMAPREDUCE_MODEL": "m"},
                                 runs_dir=tmp_path / "runs")
        assert settings.otel
        options = RunOptions(query=f"what leaks {KEY}?", inner=lambda role: FunctionModel(lambda m, i: "x"), web_tools=[],
                             show_progress=False)
        with Session(settings, options):  # its pre-flight turned tracing on; the run is one span
            assert telemetry.active()
        telemetry.disable()  # flushes the batch of spans
    finally:
        server.shutdown()
        server.server_close()
    ((path, body),) = _Collector.received
    assert path == "/v1/traces" and KEY.encode() not in body
    request = ExportTraceServiceRequest.FromString(body)
    (resource,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
    names = [s.name for scope in resource.scope_spans for s in scope.spans]
    assert service == "otel-test" and names == ["amapreduce.run"]


@pytest.mark.parametrize(("variables", "message"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin' is not supported"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json' is not supported"),
])
def test_an_exporter_the_variables_ask_for_and_we_lack_is_a_config_error(
    variables: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from amapreduce.errors import ConfigError

    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        telemetry.enable()
    assert not telemetry.active()
