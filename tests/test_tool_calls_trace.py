"""Every tool call of every agent is in the trace (issue 29, point 4): a sub-agent's refused
`crawl_page` shows in `trace.jsonl` with the URL policy's reason; outcome, duration, bytes and
redacted arguments for each call; the same facts on the call's own OpenTelemetry span."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from smolagents import Tool

from amapreduce.agents.tool_calls import ARG_CHARS, record_tool_calls, tool_trace
from amapreduce.cli.app import main
from amapreduce.errors import ToolCallFailed
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer, tool_call
from amapreduce.trace import TraceWriter, forget_secrets, read_trace, register_secrets

METADATA_URL = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"


def sub_agent_tries_the_metadata_address(messages: list[Any], info: ModelInfo) -> Any:
    """A sub-agent that first asks `crawl_page` for the cloud metadata address, then answers."""
    text = "\n".join(message_text(m) for m in messages)
    if "refused URL" not in text:
        return tool_call("crawl_page", url=METADATA_URL)
    items = re.findall(r"code of (item\d{3})\?", text.rsplit("Sub-questions:", 1)[-1])
    return final_answer(json.dumps([{"task": 1, "item": i, "code": i.upper()} for i in items]))


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(FunctionModel(sub_agent_tries_the_metadata_address, model_id="sim-model")) as srv:
        yield srv


def test_a_sub_agents_refused_crawl_page_is_in_the_trace_with_the_policys_reason(
        server: OpenAICompatibleServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    decision = tmp_path / "decision.json"
    decision.write_text(json.dumps({
        "task_matrix": [["item000"]], "template": "What is the code of __0__?",
        "json_schema": {"type": "object", "properties": {"item": {}, "code": {"description": "the item's code"}}},
    }), encoding="utf-8")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-tool-trace-test")
    monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
    with allow_model_requests():
        code = main(["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    calls = list(read_trace(Path(out["run_dir"]) / "trace.jsonl", event="tool"))
    refused = [c for c in calls if c["tool"] == "crawl_page"]
    assert len(refused) == 1, calls
    call = refused[0]
    assert call["agent"] == "subagent" and call["batch_id"] and call["attempt"] == 1
    assert call["outcome"] == "refused" and call["args"] == {"url": METADATA_URL}
    assert "refused URL" in call["reason"] and "169.254.169.254" in call["reason"]  # the policy's own words
    assert call["bytes"] == 0 and call["duration_s"] >= 0


class Echo(Tool):  # type: ignore[misc]
    name = "echo"
    description = "Echo the text back, or fail on `fail`."
    inputs = {"text": {"type": "string", "description": "text"},
              "api_key": {"type": "string", "description": "a credential", "nullable": True}}
    output_type = "string"

    def forward(self, text: str, api_key: str | None = None) -> str:
        if text == "fail":
            raise ToolCallFailed("the backend is down; try later")
        return text * 2


def test_each_call_records_outcome_duration_bytes_and_redacted_arguments(tmp_path: Path) -> None:
    register_secrets(["sk-very-secret-value"])
    try:
        tool = record_tool_calls(record_tool_calls(Echo()))  # wrapping twice records once
        trace = TraceWriter(tmp_path / "trace.jsonl")
        tool(text="héllo", api_key="x")  # outside a run: nothing recorded
        with tool_trace(trace):
            assert tool(text="héllo sk-very-secret-value", api_key="abc") == "héllo sk-very-secret-value" * 2
            with pytest.raises(ToolCallFailed):
                tool(text="fail")
            tool(text="y" * (ARG_CHARS + 10))
        trace.close()
    finally:
        forget_secrets()
    ok, failed, long = list(read_trace(tmp_path / "trace.jsonl", event="tool"))
    assert ok["tool"] == "echo" and ok["agent"] == "manager" and ok["outcome"] == "ok"
    assert ok["args"] == {"text": "héllo [REDACTED]", "api_key": "[REDACTED]"}
    assert ok["bytes"] == len(("héllo sk-very-secret-value" * 2).encode())
    assert failed["outcome"] == "error" and failed["error"] == "ToolCallFailed: the backend is down; try later"
    assert failed["bytes"] == 0 and "reason" not in failed
    assert long["args"]["text"].endswith("… [10 more chars]")


def test_the_facts_go_on_the_tool_span_openinference_opens(tmp_path: Path) -> None:
    pytest.importorskip("openinference.instrumentation.smolagents")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from amapreduce import telemetry

    exporter = InMemorySpanExporter()
    telemetry.enable(exporter=exporter)
    try:
        tool = record_tool_calls(Echo())
        trace = TraceWriter(tmp_path / "trace.jsonl")
        with tool_trace(trace):
            tool(text="abc")
        trace.close()
    finally:
        telemetry.disable()
    spans = [s for s in exporter.get_finished_spans() if s.attributes and s.attributes.get("amapreduce.tool_outcome")]
    assert len(spans) == 1  # the openinference TOOL span, not a second one of ours
    attributes = dict(spans[0].attributes or {})
    assert attributes["openinference.span.kind"] == "TOOL"
    assert attributes["amapreduce.tool_outcome"] == "ok" and attributes["amapreduce.tool_bytes"] == 6
