"""One fetch per page, one search per query, in flight (issue 37, part 3): sub-agents that crawl the
same page or search the same query at once share one request (`web.flight`), and the trace says
which tool calls were served by another's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from test_web_fetch import LocalServer, Route, send
from test_web_tools import CountingBackend

from amapreduce.agents.tool_calls import record_tool_calls, tool_trace
from amapreduce.decision import Decision
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.engine import EngineConfig, MapReduceEngine
from amapreduce.mapreduce.solver import BatchRequest, SolverReply
from amapreduce.trace import TraceWriter, read_trace
from amapreduce.web.backends.base import SearchBackend
from amapreduce.web.fetch import FetchFailed
from amapreduce.web.flight import SingleFlight
from amapreduce.web.models import SearchResult
from amapreduce.web.policy import UrlPolicy
from amapreduce.web.service import WebService
from amapreduce.web.tools import CrawlPageTool, WebSearchTool

AGENTS = 20
PAGE = "<html><title>Capitals</title><body><table>" + "".join(
    f"<tr><td>E{i:03d}</td><td>City{i}</td></tr>" for i in range(AGENTS)) + "</table></body></html>"


class SlowBackend(CountingBackend):
    """`test_web_tools`' counting backend, answering slowly: every identical search comes while one is in flight."""

    def search(self, query: str, n: int) -> list[SearchResult]:
        time.sleep(0.5)
        return super().search(query, n)


def slow(status: int = 200, delay_s: float = 1.0) -> Route:
    """A route answering `PAGE` after `delay_s`: every other crawl of it comes while one is in flight."""
    answer = send(status=status, body=PAGE)

    def route(handler: BaseHTTPRequestHandler) -> None:
        time.sleep(delay_s)
        answer(handler)

    return route


@pytest.fixture
def page() -> Iterator[LocalServer]:
    with LocalServer({"/capitals": slow()}) as server:
        yield server


def service(backend: SearchBackend | None = None) -> WebService:
    # no cache: the requests saved are single-flight's alone (a cache answers only after the first fetch ends)
    return WebService(backend or SlowBackend(), cache=None, policy=UrlPolicy(allow_private_urls=True))


class CrawlingSolver:
    """Deterministic code, not an LLM: each sub-agent crawls the one page (through the real
    `crawl_page` tool, recorded as a run records it), all at the same moment, and answers its
    entity's capital from the page text."""

    def __init__(self, tool: CrawlPageTool, url: str) -> None:
        self.tool, self.url = tool, url
        self.together = threading.Barrier(AGENTS, timeout=30)

    def solve(self, request: BatchRequest) -> SolverReply:
        self.together.wait()
        text = self.tool.forward(url=self.url)
        rows = []
        for n, task in enumerate(request.tasks, 1):
            entity = task.split("[[")[1].split("]]")[0]
            city = text.split(entity, 1)[1].split("City", 1)[1].split()[0].strip("|")
            rows.append({"task": n, "name": entity, "capital": f"City{city}"})
        return SolverReply(output=json.dumps(rows), usage=Usage(requests=1))


def test_twenty_sub_agents_crawling_one_page_make_one_request(page: LocalServer, tmp_path: Path) -> None:
    web = service()
    tool = record_tool_calls(CrawlPageTool(web, focused=False))
    decision = Decision.parse({
        "task_matrix": [[f"E{i:03d}"] for i in range(AGENTS)],
        "template": "The capital of [[__0__]].",
        "json_schema": {"type": "object", "properties": {"name": {}, "capital": {}}},
        "batch_strategy": {"type": "per_atom", "rationale": "one look-up each"}, "batch_size": 1,
    })
    engine = MapReduceEngine(CrawlingSolver(tool, f"{page.url}/capitals"),
                             config=EngineConfig(workers=AGENTS, patch_rounds=0, max_attempts=1, max_batches=None))
    trace = TraceWriter(tmp_path / "trace.jsonl")
    with tool_trace(trace):
        result = engine.run(decision)
    trace.close()
    assert len(page.requests) == 1  # one fetch, twenty crawls
    assert result.summary.completeness.complete
    assert [r.cells["capital"].value for r in result.table.rows] == [f"City{i}" for i in range(AGENTS)]
    crawls = [line for line in read_trace(tmp_path / "trace.jsonl", event="tool") if line["tool"] == "crawl_page"]
    assert len(crawls) == AGENTS and sum(1 for c in crawls if c.get("shared")) == AGENTS - 1
    assert web.usage().crawls == AGENTS and web.usage().shared == AGENTS - 1


def test_identical_searches_in_flight_share_one_backend_call() -> None:
    backend = SlowBackend()
    tool = WebSearchTool(service(backend))
    together = threading.Barrier(8, timeout=30)
    outputs: list[str] = []

    def search() -> None:
        together.wait()
        outputs.append(tool.forward(query="capital cities list"))

    threads = [threading.Thread(target=search) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert backend.calls == 1 and len(outputs) == 8 and len(set(outputs)) == 1


def test_a_failed_fetch_fails_every_crawl_that_shared_it_and_the_next_crawl_asks_again() -> None:
    with LocalServer({"/capitals": slow(status=503, delay_s=0.5)}) as down:
        url = f"{down.url}/capitals"
        web = service()
        together = threading.Barrier(5, timeout=30)
        errors: list[BaseException] = []

        def crawl() -> None:
            together.wait()
            try:
                web.crawl(url, 1000)
            except FetchFailed as exc:
                errors.append(exc)

        threads = [threading.Thread(target=crawl) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(errors) == 5 and len(down.requests) == 1
        with pytest.raises(FetchFailed):
            web.crawl(url, 1000)  # the key is free once the call ended: asked again
        assert len(down.requests) == 2


def test_single_flight_runs_again_once_the_call_is_done() -> None:
    flight: SingleFlight[int] = SingleFlight()
    assert flight.do("k", lambda: 1) == (1, False)
    assert flight.do("k", lambda: 2) == (2, False)  # nothing in flight: a new call
    assert flight.shared == 0
