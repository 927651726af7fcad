"""The default solver runs a real smolagents ToolCallingAgent per attempt (scripted model)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from smolagents import tool

from amapreduce.decision import Decision
from amapreduce.errors import BatchTimeout
from amapreduce.llm.messages import message_text
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.solver import BatchRequest, SmolagentsSolver
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer, tool_call

CAPITALS = {"France": "Paris", "Japan": "Tokyo"}


@tool
def lookup_capital(country: str) -> str:
    """Return the capital of a country from a tiny offline gazetteer.

    Args:
        country: the country's name.
    """
    return f"The capital of {country} is {CAPITALS.get(country, 'unknown')} (https://gazetteer.example/{country})"


def sub_agent(messages: list, info: ModelInfo) -> object:
    """A simulated sub-agent: look each country up, then answer with JSON rows."""
    text = "\n".join(message_text(m) for m in messages)
    if info.call_index % 2 == 0 or "capital of" not in text.split("Sub-questions:")[-1]:
        tasks = [line.split(". ", 1)[1] for line in text.split("Sub-questions:")[-1].splitlines() if ". " in line]
        return [tool_call("lookup_capital", country=t.split()[-1]) for t in tasks]
    rows = []
    for k, country in enumerate(CAPITALS, 1):
        if f"The capital of {country} is" in text:
            rows.append({"task": k, "country": country, "capital": CAPITALS[country], "source": f"https://gazetteer.example/{country}"})
    return final_answer(json.dumps(rows))


def test_engine_with_tool_calling_sub_agents(repo_root: Path) -> None:
    system_prompts: list[str] = []

    def recording_sub_agent(messages: list, info: ModelInfo) -> object:
        system_prompts.append(message_text(messages[0]))
        return sub_agent(messages, info)

    model = FunctionModel(recording_sub_agent)
    solver = SmolagentsSolver(model=model, tools=[lookup_capital], max_steps=4)
    d = Decision.parse({"task_matrix": [["France"], ["Japan"]], "template": "Capital of __0__", "json_schema": ["country", "capital"], "batch_size": 2})
    result = MapReduceEngine(solver, config=EngineConfig(workers=2)).run(d)
    assert result.table.records() == [{"country": "France", "capital": "Paris"}, {"country": "Japan", "capital": "Tokyo"}]
    assert result.table.rows[1].cells["capital"].source == "https://gazetteer.example/Japan"
    assert result.summary.usage.requests == 2 and result.summary.usage.input_tokens > 0
    assert model.calls == 2
    # The sub-agent saw the search-agent instructions from prompts/search_agent.yaml, on every call.
    prompts_file = repo_root / "prompts" / "search_agent.yaml"
    instructions = yaml.safe_load(prompts_file.read_text(encoding="utf-8"))["instructions"]
    lines = [line.strip() for line in instructions.splitlines() if line.strip()]
    assert len(system_prompts) == 2 and lines
    assert all(line in prompt for prompt in system_prompts for line in lines)
    assert result.attempts[0].outcome == "ok"


def test_sub_agent_is_stopped_at_its_deadline() -> None:
    def looping(messages: list, info: ModelInfo) -> object:
        time.sleep(0.05)
        return tool_call("lookup_capital", country=f"X{info.call_index}")

    solver = SmolagentsSolver(model=FunctionModel(looping), tools=[lookup_capital], max_steps=1000)
    request = BatchRequest(batch_id="batch-001", attempt=1, prompt="go", tasks=("go",), column_specs=(), deadline=time.monotonic() + 0.2)
    with pytest.raises(BatchTimeout, match="stopped at its deadline"):
        solver.solve(request)


def test_max_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="`max_steps` must be >= 1, got 0"):
        SmolagentsSolver(model=FunctionModel(lambda m, i: "x"), max_steps=0)


def test_attempt_usage_is_what_the_meter_charged_failed_attempts_included() -> None:
    from amapreduce.llm.meter import Price, PriceTable, UsageMeter
    from amapreduce.llm.models import ManagedModel

    def flaky(messages: list, info: ModelInfo) -> object:
        if info.call_index == 1:  # the first attempt's second call fails for good, after one billed call
            raise ValueError("malformed request")
        return sub_agent(messages, info)

    meter = UsageMeter(prices=PriceTable({"sim-model": Price(input=1e-6, output=2e-6)}, use_litellm=False))
    model = ManagedModel(FunctionModel(flaky, model_id="sim-model"), role="subagent", meter=meter)
    solver = SmolagentsSolver(model=model, tools=[lookup_capital], max_steps=4)
    d = Decision.parse({"task_matrix": [["France"], ["Japan"]], "template": "Capital of __0__", "json_schema": ["country", "capital"], "batch_size": 2})
    result = MapReduceEngine(solver, config=EngineConfig(workers=1)).run(d)
    assert [a.outcome for a in result.attempts] == ["error", "ok"]
    assert result.attempts[0].usage.requests == 1 and result.attempts[0].usage.cost_usd > 0
    charged = meter.by_role()["subagent"]
    assert result.summary.usage.requests == charged.requests == 3
    assert result.summary.usage.cost_usd == pytest.approx(charged.cost_usd)
    assert result.summary.usage.input_tokens == charged.input_tokens
