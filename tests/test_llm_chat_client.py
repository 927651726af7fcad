"""The lean chat client (issue 28, point 6): the SDK's `create` request and reply, less its per-call
transform; errors and request options as the SDK's."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion
from smolagents import OpenAIModel

from amapreduce.llm.chat_client import LeanOpenAIClient
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ModelSpec, build_model
from amapreduce.llm.retry import classify

REPLY = {
    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": '{"query": "q"}'}}]}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
}
PARAMS: dict[str, Any] = {  # shaped as smolagents sends a sub-agent's step
    "model": "m",
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "You search."}]},
        {"role": "user", "content": "Find the capital of Country_001."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "nothing found"},
    ],
    "tools": [{"type": "function", "function": {"name": "final_answer", "description": "d",
                                                "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}}],
    "tool_choice": "required",
    "stop": ["Observation:"],
    "temperature": 0.0,
}


def client(status: int = 200, headers: dict[str, str] | None = None) -> tuple[openai.OpenAI, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = REPLY if status == 200 else {"error": {"message": "slow down", "type": "rate_limit"}}
        return httpx.Response(status, json=body, headers=headers)

    sdk = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-lean", max_retries=0,
                        http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    return sdk, seen


def test_the_lean_create_sends_what_the_sdk_sends_and_returns_its_reply_type() -> None:
    sdk, seen = client()
    expected = sdk.chat.completions.create(**PARAMS)
    got = LeanOpenAIClient(sdk).chat.completions.create(**PARAMS)
    assert isinstance(got, ChatCompletion) and got == expected
    sdk_request, lean_request = seen
    assert json.loads(lean_request.content) == json.loads(sdk_request.content)
    assert lean_request.url == sdk_request.url and lean_request.method == "POST"
    assert lean_request.headers["authorization"] == sdk_request.headers["authorization"] == "Bearer sk-lean"


def test_a_429_is_the_sdks_rate_limit_error_with_its_retry_after() -> None:
    sdk, _ = client(429, {"retry-after": "1"})
    with pytest.raises(openai.RateLimitError) as caught:
        LeanOpenAIClient(sdk).chat.completions.create(**PARAMS)
    transient = classify(caught.value)
    assert transient is not None and transient.kind == "rate_limit" and transient.retry_after_s == 1


def test_request_options_go_to_the_sdks_create() -> None:
    sdk, seen = client()
    LeanOpenAIClient(sdk).chat.completions.create(**PARAMS, extra_headers={"X-Trace": "1"}, extra_body={"seed": 3})
    body = json.loads(seen[0].content)
    assert seen[0].headers["x-trace"] == "1" and body["seed"] == 3 and "extra_headers" not in body


def test_an_api_base_model_uses_the_lean_client() -> None:
    model = build_model(ModelSpec(model_id="m", api_base="http://127.0.0.1:9/v1"), role="subagent", meter=UsageMeter())
    assert isinstance(model.inner, OpenAIModel) and isinstance(model.inner.client, LeanOpenAIClient)
    assert str(model.inner.client.base_url) == "http://127.0.0.1:9/v1/"  # every other attribute is the SDK client's
