"""Endpoint capabilities are found by asking the server (`llm.endpoint`), and each finding becomes one
request adapter (`llm.dialect`), tested alone.

The dialect server below answers as llama-cpp-python's server 0.3.36 was measured to (curl, this
project's machine): list content refused with an HTTP 500 whose body is pydantic's validation error,
OpenAI's `json_schema` refused with a 500, `{"type": "json_object", "schema": S}` held by a grammar,
tools ignored unless a tool is named (its plain chat format), and a prompt past the context window
refused with `context_length_exceeded` naming the window. It decides nothing a model would: it
replies by the request's form only. The real server is probed in tests/test_real_model.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from amapreduce.errors import ConfigError
from amapreduce.llm.dialect import (
    FitToolChoice,
    FlattenContent,
    ReplyBudget,
    StructuredOutput,
    UnescapeArguments,
    adapt_reply,
    adapt_request,
    adapters_for,
)
from amapreduce.llm.endpoint import (
    EndpointCapabilities,
    context_window_in,
    endpoint_capabilities,
    probe_endpoint,
)
from amapreduce.llm.retry import classify, context_overflow, rejected_status
from amapreduce.settings import load_settings

WINDOW = 2048


class DialectServer:
    """A loopback server with llama-cpp-python's dialect (see the module doc); counts its requests."""

    def __init__(self, *, named_tools_only: bool = True, props: dict[str, Any] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.gets: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                server.gets.append(self.path)
                if self.path.endswith("/v1/models"):
                    self._send(200, {"object": "list", "data": [{"id": "/models/x.gguf", "object": "model",
                                                                 "owned_by": "me", "permissions": []}]})
                elif self.path == "/props" and props is not None:
                    self._send(200, props)
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                status, reply = server.answer(body)
                self._send(status, reply)

        self.named_tools_only = named_tools_only
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if any(isinstance(m.get("content"), list) for m in body["messages"]):
            return 500, {"error": {"message": "10 validation errors: {'type': 'string_type', 'loc': ('body', "
                                              "'messages', 0, 'ChatCompletionRequestSystemMessage', 'content'), "
                                              "'msg': 'Input should be a valid string'}", "type": "internal_server_error"}}
        if sum(len(m["content"] or "") for m in body["messages"]) // 4 > WINDOW:
            return 400, {"error": {"message": f"This model's maximum context length is {WINDOW} tokens.",
                                   "type": "invalid_request_error", "code": "context_length_exceeded"}}
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_schema":
            return 500, {"error": {"message": "", "type": "internal_server_error"}}
        message: dict[str, Any] = {"role": "assistant", "content": "ok"}
        if response_format.get("type") == "json_object" and "schema" in response_format:
            schema = response_format["schema"]
            message["content"] = json.dumps({k: v.get("enum", ["x"])[0] for k, v in schema["properties"].items()})
        choice = body.get("tool_choice")
        if body.get("tools") and (isinstance(choice, dict) or not self.named_tools_only):
            if choice == "required":
                return 500, {"error": {"message": "AssertionError", "type": "internal_server_error"}}
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup",
                                                              "arguments": '{"word": "&#34;pie&#34;"}'}}]}
        return 200, {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}

    def __enter__(self) -> DialectServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def plain() -> Iterator[DialectServer]:
    with DialectServer() as server:
        yield server


def test_the_probe_finds_llama_cpp_pythons_dialect(plain: DialectServer) -> None:
    found = probe_endpoint(plain.base_url, "smollm2")
    assert found.server == "llama-cpp-python" and found.probed
    assert found.list_content is False
    assert found.structured == "json_object_schema"
    assert found.tool_choices == ("named",) and found.tool_calling is False
    assert found.context_window == WINDOW
    assert found.escapes_arguments is True  # the named call's arguments came back as `&#34;pie&#34;`
    assert len(plain.requests) <= 10 and all(r["max_tokens"] <= 40 for r in plain.requests)


def test_a_chat_format_with_function_calling_honours_auto_not_required() -> None:
    with DialectServer(named_tools_only=False) as server:
        found = probe_endpoint(server.base_url, "smollm2")
    assert found.tool_choices == ("auto", "named") and found.tool_calling is True


def test_llama_cpp_props_give_the_window_and_slots() -> None:
    props = {"default_generation_settings": {"n_ctx": 8192}, "total_slots": 4}
    with DialectServer(props=props) as server:
        found = probe_endpoint(server.base_url, "m")
    assert (found.server, found.context_window, found.slots) == ("llama.cpp", 8192, 4)


def test_findings_are_kept_per_server_and_not_asked_again(plain: DialectServer, tmp_path: Path) -> None:
    first = endpoint_capabilities(plain.base_url, "smollm2", cache_dir=tmp_path)
    sent = len(plain.requests)
    again = endpoint_capabilities(plain.base_url, "smollm2", cache_dir=tmp_path)
    assert again == first and len(plain.requests) == sent  # read from the cache folder: no chat request
    assert len(list((tmp_path / "endpoints").glob("*.json"))) == 1
    later = endpoint_capabilities(plain.base_url, "smollm2", cache_dir=tmp_path, clock=lambda: 10**12)
    assert later == first and len(plain.requests) > sent  # past its age: asked again


def test_an_endpoint_that_refuses_everything_is_a_setup_error() -> None:
    class Refusing(DialectServer):
        def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            return 404, {"error": {"message": "model 'nope' not found"}}

    with Refusing() as server, pytest.raises(ConfigError, match="model 'nope' not found"):
        probe_endpoint(server.base_url, "nope")


def test_settings_override_each_finding(plain: DialectServer, tmp_path: Path) -> None:
    from amapreduce.llm.factory import endpoint_for

    settings = load_settings({}, api_base=plain.base_url, cache_dir=tmp_path, tool_choice="off",
                             structured_output="none", message_content="string", context_window=4096)
    found = endpoint_for(settings, "smollm2")
    assert found is not None
    assert (found.tool_choices, found.structured, found.list_content, found.context_window) == ((), "none", False, 4096)
    unprobed = endpoint_for(load_settings({}, api_base=plain.base_url, endpoint_probe=False), "m")
    assert unprobed is not None and unprobed.probed is False and unprobed.structured == "json_schema"


def test_a_validation_500_is_a_refusal_not_an_outage() -> None:
    import httpx

    from amapreduce.llm.chat_client import http_error

    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    body = {"error": {"message": "10 validation errors: {'type': 'string_type', 'loc': ('body', 'messages', 0), "
                                 "'msg': 'Input should be a valid string'}"}}
    refused = http_error(httpx.Response(500, json=body, request=request))
    assert classify(refused) is None and rejected_status(refused) == 500
    outage = http_error(httpx.Response(500, json={"error": {"message": "CUDA out of memory"}}, request=request))
    assert classify(outage) is not None and rejected_status(outage) is None
    overflow = http_error(httpx.Response(400, json={"error": {"message": "This model's maximum context length is "
                                                                         "2048 tokens.", "code": "context_length_exceeded"}},
                                         request=request))
    assert context_overflow(overflow) and rejected_status(overflow) is None


@pytest.mark.parametrize(("text", "window"), [
    ("Requested tokens (5000) exceed context window of 4096", 4096),
    ("This model's maximum context length is 2048 tokens. However, you requested 3032", 2048),
    ("something else", None),
])
def test_the_window_a_refusal_names(text: str, window: int | None) -> None:
    assert context_window_in(text) == window


# -- the adapters, each alone ---------------------------------------------------------------------

PARTS = {"model": "m", "messages": [{"role": "system", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]},
                                    {"role": "user", "content": "q"}]}


def test_flatten_content_joins_text_parts() -> None:
    out = FlattenContent().request(PARTS)
    assert out["messages"][0]["content"] == "a\nb" and out["messages"][1]["content"] == "q"
    assert isinstance(PARTS["messages"][0]["content"], list)  # the caller's request is not changed


def test_fit_tool_choice() -> None:
    assert FitToolChoice(("auto", "named")).request({"tool_choice": "required"})["tool_choice"] == "auto"
    assert FitToolChoice(("named",)).request({"tool_choice": "required"}) == {}
    named = {"tool_choice": {"type": "function", "function": {"name": "x"}}}
    assert FitToolChoice(("named",)).request(named) == named


SCHEMA = {"type": "object", "properties": {"rows": {"type": "array"}}, "required": ["rows"]}
ASKED = {"messages": [{"role": "user", "content": "fill"}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "rows", "schema": SCHEMA}}}


def test_structured_output_in_each_dialect() -> None:
    assert StructuredOutput("json_schema").request(ASKED) == ASKED
    assert StructuredOutput("json_object_schema").request(ASKED)["response_format"] == {"type": "json_object",
                                                                                        "schema": SCHEMA}
    bare = StructuredOutput("json_object").request(ASKED)
    assert bare["response_format"] == {"type": "json_object"} and '"rows"' in bare["messages"][-1]["content"]
    none = StructuredOutput("none").request(ASKED)
    assert "response_format" not in none and none["messages"][-1]["content"].startswith("fill\n\nReply with one JSON")
    assert ASKED["messages"][-1]["content"] == "fill"


def test_every_request_bounds_its_reply_within_the_window() -> None:
    assert ReplyBudget(2048).request({"messages": []})["max_tokens"] == 2048
    assert ReplyBudget(2048).request({"messages": [], "max_tokens": 300})["max_tokens"] == 300
    long = {"messages": [{"role": "user", "content": "x" * 5400}]}
    assert ReplyBudget(2048, context_window=2048).request(long)["max_tokens"] < 2048 - 1800
    assert ReplyBudget(100, key="max_completion_tokens").request({"max_tokens": 5}) == {"max_completion_tokens": 5}


def test_unescape_arguments_keeps_them_json() -> None:
    reply = {"choices": [{"message": {"tool_calls": [{"function": {"name": "f",
                                                                   "arguments": '{"q": "&#34;a&#34; &amp; b"}'}}]}}]}
    fixed = UnescapeArguments().reply(reply)
    assert json.loads(fixed["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"q": '"a" & b'}


def test_the_adapters_an_endpoint_gets() -> None:
    llama = EndpointCapabilities(base_url="b", model_id="m", list_content=False, tool_choices=("auto", "named"),
                                 structured="json_object_schema", escapes_arguments=True, context_window=2048)
    kinds = [type(a).__name__ for a in adapters_for(llama, role="subagent")]
    assert kinds == ["FlattenContent", "FitToolChoice", "StructuredOutput", "ReplyBudget", "UnescapeArguments"]
    openai = EndpointCapabilities(base_url="b", model_id="m")
    assert [type(a).__name__ for a in adapters_for(openai, role="judge")] == ["ReplyBudget"]
    adapters = adapters_for(llama, role="manager")
    out = adapt_request(adapters, {**PARTS, "tool_choice": "required", **{"response_format": ASKED["response_format"]}})
    assert out["tool_choice"] == "auto" and out["response_format"]["type"] == "json_object"
    assert isinstance(out["messages"][0]["content"], str) and out["max_tokens"] <= 2048
    assert adapt_reply(adapters, {"choices": []}) == {"choices": []}
