"""The read solver: code searches and reads a real corpus, a simulated model fills the rows in one call.

The simulated model is honest: it answers only from the prompt text it is given (the sub-questions
and the excerpts), as a real model behind the same interface would, and it refuses a prompt longer
than its context window the way llama-cpp-python's server does.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from smolagents.models import ChatMessage

from amapreduce.decision import Decision
from amapreduce.decision.columns import ColumnSpec
from amapreduce.errors import BatchTimeout, BudgetExceeded, ConfigError, SearchUnavailable, SolverError
from amapreduce.llm.endpoint import EndpointCapabilities
from amapreduce.llm.messages import message_text
from amapreduce.llm.meter import UsageMeter
from amapreduce.llm.models import ManagedModel
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.read_solver import (
    CHARS_PER_TOKEN,
    ReadSolver,
    looks_small,
    rows_per_task,
)
from amapreduce.mapreduce.replies import parse_reply, project_row
from amapreduce.mapreduce.solver import BatchRequest, SmolagentsSolver, reply_tokens
from amapreduce.prompts import render_prompt
from amapreduce.settings import load_settings
from amapreduce.table.evidence import Evidence, FetchedPages, recording
from amapreduce.testing.scripted import FunctionModel, ModelInfo
from amapreduce.trace import NullTrace, TraceWriter, read_trace
from amapreduce.web.backends.corpus import CorpusBackend
from amapreduce.web.corpus import build_corpus_index
from amapreduce.web.fetch import FetchFailed
from amapreduce.web.service import WebService
from amapreduce.web.tools import build_web_tools

COLUMNS = (ColumnSpec(name="country"), ColumnSpec(name="capital", description="the capital city"),
           ColumnSpec(name="population"))
TEMPLATE = "What are the capital and population of __0__?"
FILLER = ("Travellers crossing the high passes in spring describe meadows, stone bridges and the slow "
          "river barges that carry salt and timber down to the lowland markets every season. ")


def _filler(topic: str, paragraphs: int) -> str:
    return "\n\n".join(f"The {topic} chronicle, part {k}: " + FILLER * 3 for k in range(1, paragraphs + 1))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus index of made-up countries: Freedonia's own page (long: its facts buried in
    history), Sylvania's (its capital, no population), and an atlas table holding both."""
    root = tmp_path_factory.mktemp("docs")
    (root / "freedonia.md").write_text(
        "# Freedonia\n\n## Early history\n\n" + _filler("Freedonia valley", 12)
        + "\n\n## Government\n\nThe capital of Freedonia is Fredville.\n\n"
        "## People\n\nThe population of Freedonia is 1,234,567.\n\n## Later history\n\n"
        + _filler("Freedonia mountain", 12)
    )
    (root / "sylvania.md").write_text(
        "# Sylvania\n\nSylvania is a kingdom east of Freedonia. The capital of Sylvania is Sylvan City. "
        "Sylvania publishes no figures on its population.\n\n" + _filler("Sylvania forest", 2)
    )
    (root / "atlas.md").write_text(
        "# Atlas of the Marx mountains\n\nThe countries of the range.\n\n"
        "| Country | Capital | Population |\n|---|---|---|\n| Freedonia | Fredville | 1,234,567 |\n"
        "| Sylvania | Sylvan City | 2,000,000 |\n"
    )
    (root / "cheese.md").write_text("# Cheese of the mountains\n\nFreedonia and Sylvania trade cheese.\n")
    out = tmp_path_factory.mktemp("index") / "atlas"
    build_corpus_index([root], out, name="atlas")
    return out


@pytest.fixture
def service(corpus: Path) -> WebService:
    return WebService(CorpusBackend(corpus), local_only=True)


# -- the simulated model ---------------------------------------------------------------------------

class ContextTooLong(Exception):
    """What llama-cpp-python's server answers (HTTP 400) to a prompt over its context window."""

    status_code = 400
    code = "context_length_exceeded"


class ServerModel(FunctionModel):
    """A simulated model server: answers with `function`, keeps every request's arguments, and
    refuses a prompt whose tokens (3 characters each) and `max_tokens` exceed `window`."""

    def __init__(self, function: Callable[[list[ChatMessage], ModelInfo], Any], *, window: int | None = None,
                 model_id: str = "simulated/reader") -> None:
        super().__init__(function, model_id=model_id)
        self.window = window
        self.requests: list[dict[str, Any]] = []
        self._requests_lock = threading.Lock()

    def generate(self, messages: list[ChatMessage], stop_sequences: list[str] | None = None,
                 response_format: dict[str, Any] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        prompt = "\n".join(message_text(m) for m in messages)
        with self._requests_lock:
            self.requests.append({"prompt": prompt, "response_format": response_format, **kwargs})
        asked = len(prompt) // 3 + int(kwargs.get("max_tokens") or 0)
        if self.window is not None and asked > self.window:
            raise ContextTooLong(f"This model's maximum context length is {self.window} tokens. However, you "
                                 f"requested {asked} tokens. Please reduce the length of the messages.")
        return super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)


_EXCERPT = re.compile(r"^\[(\d+)\] (\S+)$")
_SENTENCES = re.compile(r"[^.\n]*\.")


def _sub_questions(prompt: str) -> list[str]:
    """The sub-questions, read as the prompt lists them after the excerpts, right before "Answer:"."""
    if "\nSub-question: " in prompt:
        return [prompt.rsplit("\nSub-question: ", 1)[1].split("\n", 1)[0]]
    block = prompt.rsplit("Sub-questions (write", 1)[1].split("\n", 1)[1].split("\nAnswer:", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\d+\. (.+)$", block, re.MULTILINE)]


def _excerpts(prompt: str, task: int, tasks: int) -> list[tuple[str, str]]:
    """(url, text) of the excerpts the prompt gives for sub-question `task`."""
    if tasks > 1:
        part = prompt.split(f"Excerpts for sub-question {task}:\n", 1)[1].split("\nExcerpts for sub-question", 1)[0]
        part = part.split("\nSub-questions (write", 1)[0]
    else:
        part = prompt.split("Excerpts:\n", 1)[1].split("\nSub-question: ", 1)[0]
    found: list[tuple[str, list[str]]] = []
    for line in part.splitlines():
        head = _EXCERPT.match(line)
        if head:
            found.append((head.group(2), []))
        elif found:
            found[-1][1].append(line)
    return [(url, "\n".join(lines)) for url, lines in found]


def _facts(entity: str, text: str) -> dict[str, tuple[str, str]]:
    """column → (value, verbatim quote) that `text` states about `entity`."""
    facts: dict[str, tuple[str, str]] = {}
    for sentence in _SENTENCES.findall(text):
        sentence = sentence.strip()
        capital = re.search(rf"capital of {entity} is ([A-Z]\w*(?: [A-Z]\w*)*)", sentence)
        population = re.search(rf"population of {entity} is ([\d,]+\d)", sentence)
        if capital:
            facts.setdefault("capital", (capital.group(1), sentence))
        if population:
            facts.setdefault("population", (population.group(1), sentence))
    lines = text.splitlines()
    header = next((line for line in lines if line.startswith("| Country")), None)
    if header is not None:
        names = [c.strip().lower() for c in header.strip("|").split("|")]
        for line in lines:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if line.startswith("|") and cells and cells[0] == entity:
                for name, cell in zip(names, cells, strict=False):
                    if name in ("capital", "population"):
                        facts.setdefault(name, (cell, line))
    return facts


def reader_model(messages: list[ChatMessage], info: ModelInfo) -> str:
    """Fill each sub-question's row from the excerpt that states the most about its entity."""
    prompt = message_text(messages[-1])
    questions = _sub_questions(prompt)
    rows = []
    for k, question in enumerate(questions, 1):
        entity = re.search(r"of ([A-Z]\w*(?: [A-Z]\w*)*)\?", question)
        name = entity.group(1) if entity else ""
        best = max(((url, _facts(name, text)) for url, text in _excerpts(prompt, k, len(questions))),
                   key=lambda found: len(found[1]), default=("", {}))
        url, facts = best
        rows.append({
            "task": k, "country": name,
            **{c: facts.get(c, ("", ""))[0] for c in ("capital", "population")},
            "source": url if facts else "",
            "quotes": {"country": "", **{c: facts.get(c, ("", ""))[1] for c in ("capital", "population")}},
        })
    return json.dumps({"rows": rows})


def managed(function: Callable[[list[ChatMessage], ModelInfo], Any] = reader_model, *, window: int | None = 2048,
            server_window: int | None = None, model_id: str = "simulated/reader",
            tool_choices: tuple[str, ...] = ()) -> tuple[ManagedModel, ServerModel]:
    """A managed sub-agent model over a `ServerModel`, its endpoint saying `window` and `tool_choices`."""
    server = ServerModel(function, window=server_window if server_window is not None else window, model_id=model_id)
    caps = EndpointCapabilities(base_url="http://127.0.0.1:8000/v1", model_id=model_id, context_window=window,
                                tool_choices=tool_choices, structured="json_object_schema")  # type: ignore[arg-type]
    return ManagedModel(server, role="subagent", meter=UsageMeter(), capabilities=caps), server


def request(*entities: str, attempt: int = 1, prompt: str = "Each sub-question yields exactly one row.",
            tasks: Sequence[str] | None = None, **extra: Any) -> BatchRequest:
    texts = tuple(tasks) if tasks is not None else tuple(TEMPLATE.replace("__0__", e) for e in entities)
    extra.setdefault("expected_rows", len(texts))  # one row per sub-question, as the engine says of one-row decisions
    return BatchRequest(batch_id="batch-001", attempt=attempt, prompt=prompt, tasks=texts, column_specs=COLUMNS,
                        **extra)


# -- one attempt -----------------------------------------------------------------------------------

def test_one_structured_call_reads_the_right_page_within_a_small_window(service: WebService) -> None:
    model, server = managed(window=2048)
    solver = ReadSolver(model=model, reader=service, small=False)
    with recording(FetchedPages()) as pages:
        reply = solver.solve(request("Freedonia"))
    assert server.calls == 1 and reply.steps == 1
    sent = server.requests[0]
    schema = sent["response_format"]["json_schema"]["schema"]
    assert sent["response_format"]["type"] == "json_schema" and sent["response_format"]["json_schema"]["strict"]
    row = schema["properties"]["rows"]["items"]
    # one sub-question, one page: code knows `task` and `source`; quotes come before the values
    assert list(row["properties"]) == ["quotes", "country", "capital", "population"]
    assert row["required"] == list(row["properties"])
    assert (schema["properties"]["rows"]["minItems"], schema["properties"]["rows"]["maxItems"]) == (1, 1)
    assert list(row["properties"]["quotes"]["properties"]) == ["country", "capital", "population"]
    assert sent["max_tokens"] == reply_tokens(request("Freedonia")) == 256 + 1 * (3 + 1) * 40
    # the page's facts are in the prompt though they sit deep in a long page; the prompt fits the window
    prompt = sent["prompt"]
    assert "[1] corpus://atlas/freedonia.md" in prompt
    assert "The capital of Freedonia is Fredville." in prompt and "The population of Freedonia is 1,234,567." in prompt
    excerpts = prompt.split("Excerpts:\n", 1)[1].split("\nSub-question: ", 1)[0]
    assert len(excerpts) <= 3000
    assert len(prompt) / CHARS_PER_TOKEN + sent["max_tokens"] <= 2048
    # shared first, varying last: the system prompt, the columns, then the excerpts and the sub-question
    assert prompt.startswith(render_prompt("read_solver", "system"))
    assert prompt.index("Columns:") < prompt.index("Excerpts:") < prompt.index("Sub-question: ") < prompt.index("Answer:")
    # the rows parse as the engine parses them, and the page was recorded as read
    rows = [project_row(r, ["country", "capital", "population"]) for r in parse_reply(reply.output).rows]
    assert [(r.task, r.values, r.source) for r in rows] == [
        (1, {"country": "Freedonia", "capital": "Fredville", "population": "1,234,567"}, "corpus://atlas/freedonia.md")
    ]
    assert "corpus://atlas/freedonia.md" in pages.urls()
    assert pages.contains(rows[0].quotes["capital"], "corpus://atlas/freedonia.md")
    assert reply.trace["state"] == "success" and reply.trace["reads"] == ["corpus://atlas/freedonia.md"]


def test_a_batch_of_sub_questions_is_still_one_call(service: WebService) -> None:
    model, server = managed(window=8192)
    reply = ReadSolver(model=model, reader=service, pages_per_task=1, small=False).solve(request("Freedonia", "Sylvania"))
    assert server.calls == 1 and "Excerpts for sub-question 2:" in server.requests[0]["prompt"]
    assert server.requests[0]["max_tokens"] == reply_tokens(request("Freedonia", "Sylvania")) == 256 + 2 * (3 + 1) * 40
    rows = {r["task"]: r for r in parse_reply(reply.output).rows}
    assert rows[1]["capital"] == "Fredville" and rows[2]["capital"] == "Sylvan City"


def test_the_next_attempt_reads_the_next_hit(service: WebService) -> None:
    model, _ = managed(window=2048)
    solver = ReadSolver(model=model, reader=service, small=False)
    ranked = [h.url for h in service.search(TEMPLATE.replace("__0__", "Sylvania"), 5)]
    first = solver.solve(request("Sylvania"))
    second = solver.solve(request("Sylvania", attempt=2))
    assert first.trace["reads"] == ranked[:1] and second.trace["reads"] == ranked[1:2]
    for _ in ranked[2:]:
        solver.solve(request("Sylvania", attempt=3))
    assert solver.solve(request("Sylvania", attempt=4)).trace["reads"] == ranked[:1]  # nothing new: from the top


def test_a_patch_round_sub_question_goes_on_from_the_hits_already_read(service: WebService) -> None:
    model, _ = managed(window=2048)
    solver = ReadSolver(model=model, reader=service, small=False)
    original = TEMPLATE.replace("__0__", "Sylvania")
    ranked = [h.url for h in service.search(original, 5)]
    solver.solve(request(tasks=[original]))
    patch = render_prompt("mapreduce", "patch_template").replace("__0__", original).replace(
        "__1__", "country = Sylvania; find its population")
    reply = solver.solve(request(tasks=[patch]))
    assert reply.trace["searches"] == [original] and reply.trace["reads"] == ranked[1:2]


def test_a_page_that_cannot_be_read_is_skipped(service: WebService) -> None:
    class Flaky:
        def search(self, query: str, n: int = 5) -> Any:
            return service.search(query, n)

        def crawl(self, url: str, max_chars: int) -> Any:
            if url.endswith("freedonia.md"):
                raise FetchFailed("the host did not answer", url=url)
            return service.crawl(url, max_chars)

    model, _ = managed(window=2048)
    reply = ReadSolver(model=model, reader=Flaky(), small=False).solve(request("Freedonia"))
    assert reply.trace["reads"] and "freedonia.md" not in reply.trace["reads"][0]
    assert "FetchFailed" in reply.trace["errors"][0]


def test_run_stopping_errors_propagate(service: WebService) -> None:
    class Down:
        def __init__(self, error: Exception, where: str) -> None:
            self.error, self.where = error, where

        def search(self, query: str, n: int = 5) -> Any:
            if self.where == "search":
                raise self.error
            return service.search(query, n)

        def crawl(self, url: str, max_chars: int) -> Any:
            raise self.error

    model, server = managed()
    with pytest.raises(SearchUnavailable):
        ReadSolver(model=model, reader=Down(SearchUnavailable("the backend is down"), "search"), small=False).solve(request("Freedonia"))
    with pytest.raises(BudgetExceeded):
        ReadSolver(model=model, reader=Down(BudgetExceeded("spent"), "crawl"), small=False).solve(request("Freedonia"))
    assert server.calls == 0


def test_a_prompt_over_the_context_is_cut_in_half_and_asked_again(service: WebService) -> None:
    # the solver believes 8,192 tokens; the server holds 2,048: the first prompt overflows
    model, server = managed(window=8192, server_window=2048)
    solver = ReadSolver(model=model, reader=service, pages_per_task=1, small=False)
    reply = solver.solve(request("Freedonia"))
    assert reply.trace["calls"] == 2 and server.calls == 1  # the refused request never reached the model
    sizes = [len(r["prompt"]) for r in server.requests]
    assert sizes[1] < sizes[0] and parse_reply(reply.output).rows[0]["capital"] == "Fredville"
    again = solver.solve(request("Freedonia", attempt=2))  # later attempts start from the smaller share
    assert again.trace["calls"] == 1


def test_a_prompt_that_never_fits_fails_the_attempt(service: WebService) -> None:
    model, server = managed(window=8192, server_window=300)
    with pytest.raises(Exception, match="maximum context length"):
        ReadSolver(model=model, reader=service, pages_per_task=1, small=False).solve(request("Freedonia"))
    assert len(server.requests) == 3  # the first ask and two halvings


def test_a_reply_without_json_rows_is_a_solver_error(service: WebService) -> None:
    model, _ = managed(lambda messages, info: "I am sorry, I cannot help with that.")
    with pytest.raises(SolverError, match="no JSON rows"):
        ReadSolver(model=model, reader=service, small=False).solve(request("Freedonia"))


def test_a_given_up_attempt_stops_before_reading(service: WebService) -> None:
    model, server = managed()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(BatchTimeout):
        ReadSolver(model=model, reader=service, small=False).solve(request("Freedonia", cancel=cancel))
    assert server.calls == 0 and service.usage().searches == 0


def test_rows_per_task_comes_from_the_request() -> None:
    assert rows_per_task(request("Freedonia")) == 1
    assert rows_per_task(dataclasses.replace(request("Freedonia"), expected_rows=3)) == 3
    assert rows_per_task(dataclasses.replace(request("Freedonia"), expected_rows=0)) is None


# -- the engine with the read solver ---------------------------------------------------------------

def test_the_engine_fills_the_table_with_verified_quotes(service: WebService) -> None:
    model, server = managed(window=2048)
    decision = Decision.parse({"task_matrix": [["Freedonia"], ["Sylvania"]], "template": TEMPLATE,
                               "json_schema": ["country", "capital", "population"]})
    result = MapReduceEngine(ReadSolver(model=model, reader=service, small=False), config=EngineConfig(workers=2)).run(decision)
    assert result.table.records() == [
        {"country": "Freedonia", "capital": "Fredville", "population": "1,234,567"},
        {"country": "Sylvania", "capital": "Sylvan City", "population": "2,000,000"},
    ]
    for row in result.table.rows:
        for column in ("capital", "population"):
            assert row.cells[column].evidence is Evidence.VERIFIED, (row.cells[column], column)
    # Sylvania's own page gives no population: its retry read the next hit, the atlas
    assert result.table.rows[1].cells["population"].source == "corpus://atlas/atlas.md"
    assert result.summary.complete and server.calls == len(result.attempts)


# -- choosing the solver ---------------------------------------------------------------------------

@pytest.mark.parametrize(("model_id", "small"), [
    ("smollm2-135m", True), ("qwen2.5-0.5b", True), ("gemma-3-270m", True), ("Qwen/Qwen2.5-1.5B-Instruct", True),
    ("deepseek-r1:1.5b", True), ("llama-3.1-8b-instruct", False), ("qwen2.5-7b-instruct-1m", False),
    ("llama3.2:3b", False), ("openai/gpt-5-mini", False), ("mixtral-8x7b", False),
])
def test_looks_small(model_id: str, small: bool) -> None:
    assert looks_small(model_id) is small


def test_agent_loop_needs_required_or_auto() -> None:
    caps = EndpointCapabilities(base_url="http://x/v1", model_id="m")
    assert caps.tool_calling
    assert caps.model_copy(update={"tool_choices": ("auto",)}).tool_calling
    assert not caps.model_copy(update={"tool_choices": ("named",)}).tool_calling
    assert not caps.model_copy(update={"tool_choices": ()}).tool_calling


def _parts_solver(tmp_path: Path, service: WebService, *, solver: str = "auto", model_id: str = "simulated/reader",
                  tool_choices: tuple[str, ...] = (), tools: list[Any] | None = None,
                  window: int = 32768) -> tuple[Any, list[dict[str, Any]]]:
    from amapreduce.session.parts import build_parts

    settings = load_settings({"AMAPREDUCE_MODEL": model_id, "AMAPREDUCE_SOLVER": solver})
    model, _ = managed(model_id=model_id, tool_choices=tool_choices, window=window)
    trace = TraceWriter(tmp_path / "trace.jsonl")
    web_tools = build_web_tools(settings, service=service) if tools is None else tools
    with build_parts(settings, models={"subagent": model}, trace=trace, web_tools=web_tools) as parts:
        chosen = parts.engine.solver
    trace.close()
    return chosen, list(read_trace(tmp_path / "trace.jsonl", event="solver"))


def test_auto_picks_the_read_solver_without_reliable_tool_calling(tmp_path: Path, service: WebService) -> None:
    chosen, lines = _parts_solver(tmp_path, service, tool_choices=())
    assert isinstance(chosen, ReadSolver) and chosen.reader is service
    assert lines[0]["name"] == "read" and "no reliable tool calling" in lines[0]["why"]


def test_auto_keeps_the_agent_for_a_big_tool_calling_model(tmp_path: Path, service: WebService) -> None:
    chosen, lines = _parts_solver(tmp_path, service, model_id="openai/gpt-5-mini",
                                  tool_choices=("required", "auto", "named"))
    assert isinstance(chosen, SmolagentsSolver) and lines[0]["name"] == "agent"


def test_auto_picks_the_read_solver_for_a_small_window(tmp_path: Path, service: WebService) -> None:
    chosen, lines = _parts_solver(tmp_path, service, model_id="openai/gpt-5-mini", tool_choices=("auto", "named"),
                                  window=2048)
    assert isinstance(chosen, ReadSolver) and "context window (2048 tokens)" in lines[0]["why"]


def test_auto_picks_the_read_solver_for_a_small_model(tmp_path: Path, service: WebService) -> None:
    chosen, lines = _parts_solver(tmp_path, service, model_id="smollm2-135m", tool_choices=("required", "auto"))
    assert isinstance(chosen, ReadSolver) and "under 3B" in lines[0]["why"]


def test_without_a_web_service_auto_keeps_the_agent_and_read_is_refused(tmp_path: Path, service: WebService) -> None:
    chosen, lines = _parts_solver(tmp_path, service, tools=[])
    assert isinstance(chosen, SmolagentsSolver) and "no web service" in lines[0]["why"]
    with pytest.raises(ConfigError, match="--solver read"):
        _parts_solver(tmp_path, service, solver="read", tools=[])
    chosen, _ = _parts_solver(tmp_path, service, solver="agent", tool_choices=())
    assert isinstance(chosen, SmolagentsSolver)


def test_a_callers_solver_is_kept_and_traced(tmp_path: Path, service: WebService) -> None:
    from amapreduce.session.parts import build_parts

    settings = load_settings({"AMAPREDUCE_MODEL": "simulated/reader"})
    model, _ = managed()
    own = ReadSolver(model=model, reader=service, small=False)
    with build_parts(settings, models={"subagent": model}, trace=NullTrace(), web_tools=[], solver=own) as parts:
        assert parts.engine.solver is own


def test_a_batch_too_wide_for_a_small_window_is_asked_in_groups(service: WebService) -> None:
    """Four sub-questions in a 2,048-token window would get a couple of hundred characters each: the
    solver asks in groups that each get a readable excerpt, and numbers the rows as in the batch."""
    model, server = managed(window=2048)
    reply = ReadSolver(model=model, reader=service, small=False).solve(
        request("Freedonia", "Sylvania", "Freedonia", "Sylvania"))
    assert server.calls > 1 and reply.trace["groups"] == server.calls
    rows = parse_reply(reply.output).rows
    assert sorted(r["task"] for r in rows) == [1, 2, 3, 4]
    assert {r["task"]: r["capital"] for r in rows}[3] == "Fredville"
