"""Scripted (simulated) models drive a real smolagents ToolCallingAgent, and the guard holds."""

from __future__ import annotations

import pytest
from smolagents import ToolCallingAgent, tool

from amapreduce.llm.guard import ModelRequestsBlocked
from amapreduce.llm.messages import message_text
from amapreduce.testing.scripted import (
    FunctionModel,
    ModelInfo,
    ScriptedModel,
    ScriptExhausted,
    final_answer,
    tool_call,
)


@tool
def lookup(name: str) -> str:
    """Look up a capital.

    Args:
        name: a country name.
    """
    return {"France": "Paris"}.get(name, "unknown")


def test_scripted_model_drives_tool_calling_agent() -> None:
    model = ScriptedModel([tool_call("lookup", name="France"), final_answer("Paris")])
    agent = ToolCallingAgent(tools=[lookup], model=model, max_steps=3, verbosity_level=0)
    assert agent.run("Capital of France?") == "Paris"
    assert model.calls == 2
    assert model.input_tokens > 0 and model.output_tokens > 0


def test_function_model_sees_observations() -> None:
    seen: list[str] = []

    def reply(messages: list, info: ModelInfo) -> object:
        if info.call_index == 0:
            assert "lookup" in info.tools and "final_answer" in info.tools
            return tool_call("lookup", name="France")
        seen.append("\n".join(message_text(m) for m in messages))
        return final_answer("done")

    agent = ToolCallingAgent(tools=[lookup], model=FunctionModel(reply), max_steps=3, verbosity_level=0)
    agent.run("go")
    assert "Paris" in seen[0]


def test_script_exhausted_is_loud() -> None:
    model = ScriptedModel(["only one"])
    model.generate([])
    with pytest.raises(ScriptExhausted, match="has 1 replies but was called 2 times"):
        model.generate([])


def test_real_model_calls_are_blocked_under_test() -> None:
    from smolagents import OpenAIModel

    model = OpenAIModel(model_id="gpt-test", api_base="http://127.0.0.1:9/v1", api_key="x")
    with pytest.raises(ModelRequestsBlocked, match="model requests are blocked under test"):
        model.generate([])


def test_opt_in_reaches_only_loopback_endpoints() -> None:
    from smolagents import OpenAIModel

    from amapreduce.llm.guard import allow_model_requests

    remote = OpenAIModel(model_id="gpt-test", api_base="https://api.example.com/v1", api_key="x")
    with allow_model_requests(), pytest.raises(ModelRequestsBlocked):
        remote.generate([])
