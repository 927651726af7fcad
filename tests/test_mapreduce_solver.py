"""The default solver runs a real smolagents ToolCallingAgent per attempt (scripted model)."""

from __future__ import annotations

import functools
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


def _capitals_request(attempt: int = 1) -> BatchRequest:
    prompt = "Find the capitals.\n\nSub-questions:\n1. capital of France\n2. capital of Japan"
    return BatchRequest(batch_id="batch-001", attempt=attempt, prompt=prompt, tasks=("France", "Japan"), column_specs=())


def test_the_sub_agent_system_prompt_is_ours_rendered_once_per_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    import smolagents.agents

    import amapreduce.mapreduce.solver as solver_module
    from amapreduce.prompts import render_prompt

    renders: list[tuple[str, str]] = []
    real_render = solver_module.render_prompt

    def counting_render(name: str, key: str, **variables: object) -> str:
        renders.append((name, key))
        return real_render(name, key, **variables)

    monkeypatch.setattr(solver_module, "render_prompt", counting_render)
    system_prompts: list[str] = []

    def recording_sub_agent(messages: list, info: ModelInfo) -> object:
        system_prompts.append(message_text(messages[0]))
        return sub_agent(messages, info)

    solver = SmolagentsSolver(model=FunctionModel(recording_sub_agent), tools=[lookup_capital], max_steps=4)
    assert renders == [("search_agent", "instructions"), ("search_agent", "system_prompt")]
    # From here on nothing is rendered, compiled or parsed per attempt: not our prompt, not
    # smolagents' Jinja system prompt, not its template YAML.
    compiles: list[str] = []
    monkeypatch.setattr(smolagents.agents, "populate_template", lambda template, variables: compiles.append(template))
    monkeypatch.setattr(smolagents.agents.yaml, "safe_load", lambda text: compiles.append(text))
    for attempt in (1, 2, 3):
        reply = solver.solve(_capitals_request(attempt))
        assert json.loads(reply.output)[1]["capital"] == "Tokyo" and reply.trace["state"] == "success"
    assert len(renders) == 2 and compiles == []
    expected = render_prompt("search_agent", "system_prompt", instructions=render_prompt("search_agent", "instructions"))
    assert solver.system_prompt == expected
    assert system_prompts == [expected] * 6
    assert "You are an expert assistant who can solve any task" not in expected  # not smolagents' default


def test_caller_instructions_replace_the_default_guidance() -> None:
    solver = SmolagentsSolver(model=FunctionModel(sub_agent), instructions="Only use the gazetteer.")
    assert "Only use the gazetteer." in solver.system_prompt
    assert "crawl_page" not in solver.system_prompt
    assert solver.system_prompt.startswith("You are a research sub-agent that acts only through tool calls")


def test_structured_final_answer_comes_back_as_json_text_with_the_steps_traced() -> None:
    rows = [{"task": 1, "country": "France", "capital": "Paris"}, {"task": 2, "country": "Japan", "capital": "Tokyo"}]

    def structured(messages: list, info: ModelInfo) -> object:
        if info.call_index == 0:
            return [tool_call("lookup_capital", country="France"), tool_call("lookup_capital", country="Japan")]
        return final_answer(rows)  # a list, not JSON text

    reply = SmolagentsSolver(model=FunctionModel(structured), tools=[lookup_capital], max_steps=4).solve(_capitals_request())
    assert type(reply.output) is str and json.loads(reply.output) == rows
    assert reply.steps == 2 and reply.usage.requests == 2
    assert [call["name"] for call in reply.trace["tool_calls"]] == ["lookup_capital", "lookup_capital", "final_answer"]
    assert reply.trace["tool_calls"][0]["arguments"] == {"country": "France"}


def test_a_sub_agent_that_runs_out_of_steps_says_so_in_its_trace() -> None:
    def never_done(messages: list, info: ModelInfo) -> object:
        if not any(message_text(m).startswith("An agent tried to answer") for m in messages):
            return tool_call("lookup_capital", country="France")
        return '[{"task": 1, "country": "France", "capital": "Paris"}]'  # the max-steps answer, no tools

    reply = SmolagentsSolver(model=FunctionModel(never_done), tools=[lookup_capital], max_steps=2).solve(_capitals_request())
    assert reply.trace["state"] == "max_steps_error" and reply.steps == 3
    assert json.loads(reply.output)[0]["capital"] == "Paris"


# A whole engine run in a fresh interpreter: which modules the run itself imports (inside its
# worker threads), after the solver was built.
RUN_IMPORTS = """
import json, sys
sys.path.insert(0, {tests!r})
from test_mapreduce_solver import lookup_capital
from amapreduce.decision import Decision
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.solver import SmolagentsSolver
from amapreduce.testing.scripted import FunctionModel, final_answer, tool_call

def sub_agent(messages, info):
    if info.call_index % 2 == 0:
        return tool_call("lookup_capital", country="France")
    return final_answer([{{"task": 1, "country": "France", "capital": "Paris"}}])  # structured rows

assert "litellm" not in sys.modules
model = ManagedModel(FunctionModel(sub_agent, model_id="openai/gpt-4o-mini"), role="subagent", meter=UsageMeter())
solver = SmolagentsSolver(model=model, tools=[lookup_capital], max_steps=4)
from amapreduce.llm.models import ModelSpec, build_model
client = build_model(ModelSpec(model_id="m", api_base="http://127.0.0.1:9/v1"), role="subagent", meter=UsageMeter())
SmolagentsSolver(model=client)  # an --api-base model: never called
built = set(sys.modules)
d = Decision.parse({{"task_matrix": [["France"]], "template": "Capital of __0__", "json_schema": ["country", "capital"]}})
result = MapReduceEngine(solver, config=EngineConfig(workers=4)).run(d)
print(json.dumps({{"records": result.table.records(), "at_build": sorted(m for m in built if m in ("litellm", "torch", "openai")),
                  "during_run": sorted(set(sys.modules) - built)}}))
"""


def test_a_run_imports_nothing_heavy_in_its_worker_threads(repo_root: Path) -> None:
    import subprocess
    import sys

    code = RUN_IMPORTS.format(tests=str(repo_root / "tests"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["records"] == [{"country": "France", "capital": "Paris"}]
    # Neither the openai SDK (an --api-base model's client is `amapreduce.llm.chat_client`) nor LiteLLM
    # is imported by a run that uses no LiteLLM model: the meter reads the price map LiteLLM ships as a file.
    assert report["at_build"] == []
    # torch (which smolagents imports to check a structured answer for a tensor) is never imported.
    heavy = [m for m in report["during_run"] if m.split(".")[0] in {"torch", "litellm", "openai", "jinja2", "yaml"}]
    assert heavy == [] and "torch" not in report["at_build"]


def test_building_a_solver_on_an_openai_compatible_model_sends_nothing() -> None:
    from smolagents import OpenAIModel

    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.models import ManagedModel
    from amapreduce.testing.openai_server import OpenAICompatibleServer

    with OpenAICompatibleServer(FunctionModel(lambda messages, info: "hi")) as server:
        meter = UsageMeter()
        client = OpenAIModel(model_id="m", api_base=server.base_url, api_key="x")
        SmolagentsSolver(model=ManagedModel(client, role="subagent", meter=meter))
        assert server.requests == [] and meter.total().requests == 0


def test_start_up_garbage_is_collected_once_per_process_before_the_fan_out_and_nothing_is_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from amapreduce.llm.meter import UsageMeter
    from amapreduce.llm.models import ManagedModel
    from amapreduce.mapreduce import solver as solver_module

    calls: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(
        solver_module, "_collect_start_up_garbage", functools.cache(solver_module._collect_start_up_garbage.__wrapped__)
    )
    model = ManagedModel(FunctionModel(lambda messages, info: "hi"), role="subagent", meter=UsageMeter())
    SmolagentsSolver(model=model)
    assert calls == ["collect"]  # before any attempt runs, so no worker thread pays for it; never a freeze
    SmolagentsSolver(model=model)
    assert calls == ["collect"]  # a second run in the same process does not collect again
