"""`ask` with a model that cannot call tools: the planner (`agents.planner`) scouts in code, has the
model write the decision in one structured call, and runs it through the `mapreduce` tool.

The models here are simulated (deterministic code, not LLMs) and honest: the planner's reads its
entities from the excerpts in its own prompt, and a sub-agent reads its values from what its tools
returned. The corpus is a real local index (`web.corpus`) of a few pages.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from amapreduce.agents.planner import (
    CANNOT_PLAN,
    DRAFT_SCHEMA,
    Planner,
    draft_decision,
    excerpt_budget,
    planner_reason,
    relevant_passages,
)
from amapreduce.cli.app import main
from amapreduce.cli.exit_codes import run_exit_code
from amapreduce.decision.model import Decision
from amapreduce.errors import DecisionError, SearchUnavailable
from amapreduce.llm.endpoint import EndpointCapabilities
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.session import RunOptions, Session
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, final_answer, tool_call
from amapreduce.trace import NullTrace, read_trace
from amapreduce.web.backends.base import SearchBackend
from amapreduce.web.corpus import build_corpus_index
from amapreduce.web.models import SearchResult
from amapreduce.web.service import WebService
from amapreduce.web.tools import WebSearchTool, build_web_tools

QUESTION = "What is the capital of each Nordic country?"
CAPITALS = {"Denmark": "Copenhagen", "Finland": "Helsinki", "Iceland": "Reykjavik", "Norway": "Oslo",
            "Sweden": "Stockholm"}
FILLER = "Reindeer herding, long winters and midsummer festivals are often mentioned by travel writers. " * 4
NO_TOOLS = EndpointCapabilities(base_url="http://127.0.0.1:1/v1", model_id="tiny", server="llama-cpp-python",
                                tool_choices=(), structured="json_object_schema", context_window=2048, probed=True)


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A corpus: one page lists the Nordic countries (among paragraphs about other things), one page
    per country says its capital."""
    root = tmp_path / "pages"
    root.mkdir()
    noise = "\n\n".join(f"## Travel note {i}\n\n{FILLER}" for i in range(12))
    (root / "nordic.md").write_text(
        f"# The Nordic region\n\n{noise}\n\n## Nordic countries\n\n"
        "The Nordic countries are Denmark, Finland, Iceland, Norway and Sweden.\n\n"
        f"## More travel notes\n\n{noise}\n", encoding="utf-8")
    for country, capital in CAPITALS.items():
        (root / f"{country.lower()}.md").write_text(
            f"# {country}\n\nThe capital of {country} is {capital}.\n", encoding="utf-8")
    build_corpus_index([root], tmp_path / "index", name="nordic")
    return tmp_path / "index"


# -- the simulated models ---------------------------------------------------------------------


def excerpts_of(prompt: str) -> str:
    """The excerpts the planner's prompt shows (between its two headings)."""
    return prompt.split("Web excerpts:", 1)[1].rsplit("Question:", 1)[0]


def planner_reply(prompt: str) -> str:
    """The manager's structured reply, from its prompt alone: the countries the excerpts list."""
    listed = re.search(r"The Nordic countries are ([^.]+)\.", excerpts_of(prompt))
    entities = re.split(r",\s*|\s+and\s+", listed.group(1)) if listed else []
    return json.dumps({"template": "What is the capital of __0__?", "entity_column": "country",
                       "columns": [{"name": "capital", "description": "city name"}], "entities": entities})


def subagent_reply(text: str) -> Any:
    """A search sub-agent: search its sub-question, read pages until one says the capital, answer."""
    tail = text.rsplit("Sub-questions:", 1)[-1]
    country = re.search(r"capital of (\w+)\?", tail).group(1)  # type: ignore[union-attr]
    found = re.search(rf"The capital of {country} is (\w+)\.", tail)
    if found:
        return final_answer(json.dumps([{"task": 1, "country": country, "capital": found.group(1)}]))
    if "corpus://" not in tail:
        return tool_call("web_search", query=f"capital of {country}")
    read = set(re.findall(r"URL: (corpus://\S+)", tail))
    unread = [u for u in re.findall(r"\((corpus://[^)\s]+)\)", tail) if u not in read]
    return tool_call("crawl_page", url=unread[0]) if unread else final_answer("[]")


def simulated(planner: Any = planner_reply) -> Any:
    """Offered tools, it is a sub-agent; asked without tools, it is the planner (`planner(prompt)`)."""

    def play(messages: list[Any], info: ModelInfo) -> Any:
        text = "\n".join(message_text(m) for m in messages)
        if info.tools:
            return subagent_reply(text)
        return planner(text)

    return play


def planner_requests(server: OpenAICompatibleServer) -> list[dict[str, Any]]:
    """The requests the planner sent (the sub-agents' carry tools)."""
    return [r for r in server.requests if not r.get("tools")]


def events(outcome: Any, name: str) -> list[dict[str, Any]]:
    return [e for e in read_trace(outcome.run_dir.path / "trace.jsonl") if e.get("event") == name]


def http_settings(server: OpenAICompatibleServer, tmp_path: Path, index: Path, **overrides: Any) -> Any:
    return load_settings({}, model="tiny", api_base=server.base_url, search_backend=f"corpus:{index}",
                         runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", extraction_model="none",
                         tool_choice="off", solver="agent", workers=2, **overrides)


# -- end to end over HTTP ---------------------------------------------------------------------


def test_a_model_without_tool_calling_plans_in_one_structured_call(tmp_path: Path, index: Path) -> None:
    with OpenAICompatibleServer(FunctionModel(simulated(), model_id="tiny")) as server, allow_model_requests():
        settings = http_settings(server, tmp_path, index, context_window=2048)
        with Session(settings, RunOptions(query=QUESTION, show_progress=False)) as session:
            outcome = session.ask()
    assert outcome.status == "complete" and run_exit_code(outcome.ending.status) == 0
    assert outcome.table.records() == [{"country": c, "capital": v} for c, v in CAPITALS.items()]
    assert outcome.markdown.startswith("```markdown\n| country | capital |")
    (manager,) = events(outcome, "manager")
    assert manager["mode"] == "planner" and "tool_choice=off" in manager["why"]
    (request,) = planner_requests(server)  # one structured call: the first reply was valid
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["schema"] == DRAFT_SCHEMA
    assert request["max_tokens"] == 512  # a quarter of the 2,048-token window
    prompt = "\n".join(message_text(m) for m in request["messages"])
    assert len(prompt) // 3 + request["max_tokens"] <= 2048  # the excerpts were cut to fit the window
    assert "The Nordic countries are Denmark" in prompt and prompt.count("Reindeer") < 24  # of 96 on the page
    assert outcome.meter.by_role()["manager"].requests == 1
    # the same execution as a tool-calling manager's: the mapreduce tool's plan stage, then execute
    stages = [e["stage"] for e in events(outcome, "tool_call")]
    assert stages == ["plan", "execute"] and outcome.record.completeness.mapreduce_calls == 2
    (scout,) = events(outcome, "planner_scout")
    assert scout["crawled"] and scout["crawled"][0] == "corpus://nordic/nordic.md"
    (reply,) = events(outcome, "planner_reply")
    assert reply["valid"] and reply["entities"] == reply["grounded"] == 5
    result = json.loads((outcome.run_dir.path / "result.json").read_text(encoding="utf-8"))
    assert result["status"] == "complete" and result["kind"] == "ask"
    assert result["decisions"][0]["template"] == "What is the capital of __0__?"
    assert result["manager_answer"].startswith("Planned without tool calling: 5 entities")


def test_a_server_without_structured_output_gets_the_schema_in_the_prompt(tmp_path: Path, index: Path) -> None:
    """`structured: none`: the endpoint layer writes the schema into the prompt; the reply, in prose
    around a fence, is read leniently."""

    def chatty(prompt: str) -> str:
        assert '"entity_column"' in prompt.rsplit("Question:", 1)[1]  # the schema, after the question
        return f"Sure! Here is the plan:\n```json\n{planner_reply(prompt)}\n```\nHope it helps."

    with OpenAICompatibleServer(FunctionModel(simulated(chatty), model_id="tiny")) as server, allow_model_requests():
        settings = http_settings(server, tmp_path, index, structured_output="none")
        with Session(settings, RunOptions(query=QUESTION, show_progress=False)) as session:
            outcome = session.ask()
    assert outcome.status == "complete" and len(outcome.table) == 5
    (request,) = planner_requests(server)
    assert "response_format" not in request


def test_a_model_that_cannot_plan_fails_the_run_and_names_the_alternatives(
    tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    with OpenAICompatibleServer(FunctionModel(simulated(lambda prompt: "I like turtles."), model_id="tiny")) as server, \
            allow_model_requests():
        monkeypatch.setenv("AMAPREDUCE_TOOL_CHOICE", "off")
        monkeypatch.setenv("AMAPREDUCE_SEARCH_BACKEND", f"corpus:{index}")
        monkeypatch.setenv("AMAPREDUCE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("AMAPREDUCE_EXTRACTION_MODEL", "none")
        monkeypatch.setenv("AMAPREDUCE_RUNS_DIR", str(tmp_path / "runs"))
        code = main(["ask", QUESTION, "--model", "tiny", "--api-base", server.base_url, "--json"])
        requests = planner_requests(server)
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "failed"
    assert "could not write a decision" in out["error"] and "the reply held no JSON object" in out["error"]
    assert "amapreduce mapreduce run DECISION.json" in out["error"] and "amapreduce enrich LIST.csv" in out["error"]
    assert len(requests) == 2  # the structured call and its one retry, with the problem in the prompt
    assert "Your last reply could not be used: the reply held no JSON object" in message_text(requests[1]["messages"][-1])
    (run,) = (tmp_path / "runs").iterdir()
    result = json.loads((run / "result.json").read_text(encoding="utf-8"))
    assert result["status"] == "failed" and result["error"] == out["error"]


# -- in process, the manager model's capabilities set ----------------------------------------


def in_process(tmp_path: Path, index: Path, planner: Any) -> tuple[Any, FunctionModel]:
    """An `ask` whose manager model says (as a probe of llama-cpp-python would) that it calls no tool."""
    model = FunctionModel(simulated(planner), model_id="simulated/tiny")
    settings = load_settings({}, model="simulated/tiny", runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache",
                             extraction_model="none", workers=2)
    web_tools = build_web_tools(settings, backend=f"corpus:{index}")
    with Session(settings, RunOptions(query=QUESTION, inner=lambda role: model, web_tools=web_tools,
                                      show_progress=False)) as session:
        session.models["manager"].capabilities = NO_TOOLS
        return session.ask(), model


def test_an_unusable_first_reply_gets_one_retry_with_the_problem(tmp_path: Path, index: Path) -> None:
    prompts: list[str] = []

    def first_wrong(prompt: str) -> str:
        prompts.append(prompt)
        if "Your last reply could not be used" not in prompt:
            return json.dumps({"template": "Capitals?", "entity_column": "country", "columns": [], "entities": []})
        return planner_reply(prompt)

    outcome, _ = in_process(tmp_path, index, first_wrong)
    assert outcome.status == "complete" and len(outcome.table) == 5
    assert len(prompts) == 2 and '"entities" is empty' in prompts[1]
    assert prompts[1].startswith(prompts[0])  # the retry keeps the prompt's prefix
    (manager,) = events(outcome, "manager")
    assert "llama-cpp-python" in manager["why"] and "call no tool" in manager["why"]
    assert [e["valid"] for e in events(outcome, "planner_reply")] == [False, True]
    assert outcome.meter.by_role()["manager"].requests == 2


class DownBackend(SearchBackend):
    """A search backend whose circuit breaker has given up."""

    name = "down"

    def search(self, query: str, n: int) -> list[SearchResult]:
        raise SearchUnavailable("search backend 'down' is unavailable", provider="down", failures=3, last_error=None)


def test_a_search_outage_while_scouting_fails_the_run_as_the_managers_would(tmp_path: Path) -> None:
    model = FunctionModel(lambda messages, info: pytest.fail("no model call after the outage"), model_id="simulated/tiny")
    settings = load_settings({}, model="simulated/tiny", runs_dir=tmp_path / "runs", extraction_model="none",
                             tool_choice="off")
    with Session(settings, RunOptions(query=QUESTION, inner=lambda role: model, show_progress=False,
                                      web_tools=[WebSearchTool(WebService(DownBackend()))])) as session:
        outcome = session.ask()
    assert outcome.status == "failed" and "search backend 'down' is unavailable" in (outcome.ending.reason or "")
    assert run_exit_code(outcome.ending.status) == 1 and model.calls == 0


def test_a_manager_with_tool_calling_is_not_planned(tmp_path: Path, index: Path) -> None:
    """Capabilities that call tools (or none: a hosted API) keep the tool-calling manager."""
    assert planner_reason(None, "detect") is None
    assert planner_reason(NO_TOOLS.model_copy(update={"tool_choices": ("auto",)}), "detect") is None
    assert planner_reason(None, "off") is not None


# -- the parts --------------------------------------------------------------------------------


def test_the_draft_becomes_a_valid_decision() -> None:
    draft = {"template": "What is its capital?", "entity_column": " country ", "entities": ["Norway", " norway", "",
             "Sweden", 7], "columns": [{"name": "capital", "description": "city"}, {"name": "Country", "description": ""},
                                      {"name": "capital", "description": "again"}]}
    raw = draft_decision(draft, max_batches=50)
    decision = Decision.parse(raw)
    assert decision.task_matrix == [["Norway"], ["Sweden"], ["7"]]
    assert decision.template == "For the country __0__: What is its capital?"
    assert list(decision.columns) == ["country", "capital"] and list(decision.resolved_key_columns) == ["country"]
    assert decision.batch_strategy.type == "per_atom" and raw["batch_size"] is None
    wide = draft_decision({**draft, "entities": [f"E{i}" for i in range(120)]}, max_batches=50)
    assert len(wide["task_matrix"]) == 100 and wide["batch_size"] == 2  # capped, and batched under max_batches
    for bad, problem in (({**draft, "entities": []}, "entities"), ({**draft, "template": " "}, "template"),
                         ({**draft, "entity_column": None}, "entity_column"), ([], "one JSON object")):
        with pytest.raises(DecisionError, match=problem):
            draft_decision(bad, max_batches=50)


def test_the_excerpts_fit_the_window_and_keep_the_matching_passages() -> None:
    assert 2_000 <= excerpt_budget(2048, 1_500, 512) <= 3_000  # llama-cpp-python's default window
    assert excerpt_budget(None, 1_500, 1024) > excerpt_budget(2048, 1_500, 512)
    assert excerpt_budget(128_000, 1_500, 1024) == 16_000
    page = "\n\n".join([FILLER] * 10 + ["## Nordic countries", "- Denmark\n- Finland\n- Iceland"] + [FILLER] * 10)
    text = relevant_passages(QUESTION, [("Page: nordic", page)], 800)
    assert len(text) <= 800 and "- Denmark" in text and "Nordic countries" in text
    assert text.startswith("Page: nordic\n")


def test_a_run_without_web_search_plans_from_the_question_alone() -> None:
    seen: list[str] = []

    def reply(messages: list[Any], info: ModelInfo) -> str:
        seen.append("\n".join(message_text(m) for m in messages))
        return json.dumps({"template": "Capital of __0__?", "entity_column": "country", "columns": [],
                           "entities": ["France"]})

    planner = Planner(FunctionModel(reply), web_tools=[], max_batches=50, trace=NullTrace())
    scouted = planner.scout("Capital of France?")
    assert scouted.excerpts == "" and scouted.notes == ("the run has no web search tool",)
    drafted = planner.write("Capital of France?", scouted)
    assert drafted.decision is not None and drafted.calls == 1
    assert "(none: nothing was found for the question)" in seen[0]


def test_the_failure_message_names_both_ways_on() -> None:
    message = CANNOT_PLAN.format(why="x")
    assert "`amapreduce mapreduce run DECISION.json`" in message and "docs/guides/decisions.md" in message
    assert "`amapreduce enrich LIST.csv --columns ...`" in message
