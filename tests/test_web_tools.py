"""The smolagents tools and the service behind them: a simulated agent solves a lookup through the
real tools over the sandbox corpus; caching, usage counts, refusals and focused extraction."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from smolagents import ToolCallingAgent
from smolagents.models import ChatMessage
from test_web_fetch import ARTICLE, LocalServer, send

from amapreduce.errors import RunError, ToolCallFailed, ToolCallRefused
from amapreduce.llm.messages import message_text
from amapreduce.sandbox import sandbox_world
from amapreduce.settings import Settings
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call
from amapreduce.web.backends.base import SearchBackend
from amapreduce.web.cache import WebCache
from amapreduce.web.models import SearchResult
from amapreduce.web.policy import UrlPolicy
from amapreduce.web.service import WebService
from amapreduce.web.tools import CrawlPageTool, WebSearchTool, build_web_tools, format_results


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return sandbox_world(tmp_path_factory.mktemp("sbx"))


class CountingBackend(SearchBackend):
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def search(self, query: str, n: int) -> list[SearchResult]:
        self.calls += 1
        return [SearchResult(rank=i + 1, title=f"{query} {i}", url=f"https://r{i}.example/") for i in range(n)]


def _last_observation(messages: list[ChatMessage]) -> str:
    return message_text(messages[-1]) if messages else ""


def test_simulated_agent_finds_a_fact_through_the_real_tools(world: Any, tmp_path: Path) -> None:
    settings = Settings(search_backend=f"corpus:{world.index_dir}", cache_dir=tmp_path / "cache")
    tools = build_web_tools(settings)

    def play(messages: list[ChatMessage], info: ModelInfo) -> Reply:
        assert set(info.tools) >= {"web_search", "crawl_page", "final_answer"}
        seen = _last_observation(messages)
        if info.call_index == 0:
            return tool_call("web_search", query="Guinea population capital")
        if info.call_index == 1:
            url = re.search(r"\]\((corpus://[^)]+)\)", seen)
            assert url is not None, seen
            return tool_call("crawl_page", url=url.group(1))
        capital = re.search(r"\| Capital \| ([^|]+?) \|", seen)
        assert capital is not None, seen
        return final_answer(capital.group(1))

    agent = ToolCallingAgent(tools=tools, model=FunctionModel(play), max_steps=5)
    assert str(agent.run("What is the capital of Guinea?")) == "Conakry"
    service = tools[0].service  # type: ignore[attr-defined]
    assert service.usage().searches == 1 and service.usage().crawls == 1


def test_search_results_are_cached_and_counted(tmp_path: Path) -> None:
    backend = CountingBackend()
    service = WebService(backend, cache=WebCache(tmp_path / "c.sqlite3", ttl_s=60))
    first = service.search("  some   query ", 3)
    second = service.search("some query", 3)
    assert first == second and backend.calls == 1
    service.search("some query", 4)  # a different n is a different request
    assert backend.calls == 2
    usage = service.usage()
    assert (usage.searches, usage.cache_hits, usage.cache_misses) == (3, 1, 2)


def test_pages_are_cached_by_normalised_url(tmp_path: Path) -> None:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        service = WebService(CountingBackend(), cache=WebCache(tmp_path / "c.sqlite3", ttl_s=60),
                             policy=UrlPolicy(allow_private_urls=True))
        page = service.crawl(srv.url + "/page#top", 10_000)
        again = service.crawl(srv.url.replace("http://", "HTTP://") + "/page", 10_000)
        short = service.crawl(srv.url + "/page", 120)
    assert len(srv.requests) == 1
    assert page.title == "Local Test Page" and "Probe City" in page.text and not page.truncated
    assert again.text == page.text
    assert short.truncated and short.text.endswith("...(truncated)")
    assert service.usage().cache_hits == 2


def test_crawl_tool_refuses_private_urls_by_default(tmp_path: Path) -> None:
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        tool = CrawlPageTool(WebService(CountingBackend()))
        with pytest.raises(ToolCallRefused, match="loopback"):
            tool(url=srv.url + "/page")
    assert srv.requests == []


def test_crawl_tool_errors_reach_the_model_as_one_line(world: Any) -> None:
    service = WebService(CountingBackend(), corpora={})
    tool = CrawlPageTool(service)
    with pytest.raises(ToolCallRefused, match="unknown corpus 'sandbox'"):
        tool(url="corpus://sandbox/countries/fr.html")
    with LocalServer({}) as srv:
        private = CrawlPageTool(WebService(CountingBackend(), policy=UrlPolicy(allow_private_urls=True)))
        with pytest.raises(ToolCallFailed, match="HTTP 404"):  # a valid call whose page is missing: failed, not refused
            private(url=srv.url + "/missing")


def test_valid_calls_whose_work_fails_reach_the_model_as_failed_not_refused(world: Any) -> None:
    class DownBackend(CountingBackend):
        def search(self, query: str, n: int) -> list[SearchResult]:
            raise RunError("`down` timed out after 5 s. Try again later.")

    with pytest.raises(ToolCallFailed, match="timed out after 5 s") as failed:
        WebSearchTool(WebService(DownBackend()))(query="anything")
    assert failed.value.fields["cause"] == "RunError"
    corpus = WebService.from_settings(Settings(cache_dir=world.index_dir.parent / "c"), backend=f"corpus:{world.index_dir}")
    with pytest.raises(ToolCallFailed, match="no document .* Use a URL returned by web_search"):
        CrawlPageTool(corpus)(url="corpus://sandbox/countries/no-such-page.html")


@pytest.mark.parametrize("url", ["http://[::1/", "http://[v1.x]/"])
def test_crawl_tool_refuses_a_malformed_url_with_one_line(url: str) -> None:
    tool = CrawlPageTool(WebService(CountingBackend(), resolver=lambda host, port: ["93.184.216.34"]))
    with pytest.raises(ToolCallRefused, match="refused URL .*Check the URL"):
        tool(url=url)


def test_web_search_tool_output_and_empty_query(world: Any) -> None:
    tool = WebSearchTool(WebService.from_settings(Settings(cache_dir=world.index_dir.parent / "c"),
                                                  backend=f"corpus:{world.index_dir}"))
    out = tool(query="Japan population capital", n=2)
    assert out.startswith("1. [Japan — Sandbox Atlas](corpus://sandbox/countries/jp.html)")
    assert out.count("\n\n") == 1
    with pytest.raises(ToolCallRefused, match="empty"):
        tool(query="   ")
    assert format_results("zzz", []) == "No results found for 'zzz'. Try a more general query."


def test_focused_extraction_through_a_model(world: Any) -> None:
    prompts: list[str] = []

    def digest(messages: list[ChatMessage], info: ModelInfo) -> Reply:
        prompts.append(message_text(messages[0]))
        return "- Capital: Tokyo"

    service = WebService.from_settings(Settings(cache_dir=world.index_dir.parent / "c"),
                                       backend=f"corpus:{world.index_dir}")
    tool = CrawlPageTool(service, model=FunctionModel(digest))
    assert tool(url="corpus://sandbox/countries/jp.html", query="capital of Japan") == "- Capital: Tokyo"
    assert "Search query: capital of Japan" in prompts[0] and "| Capital | Tokyo |" in prompts[0]
    # no query, or focused extraction off: the page text itself
    assert "| Capital | Tokyo |" in tool(url="corpus://sandbox/countries/jp.html")
    off = CrawlPageTool(service, model=FunctionModel(digest), focused=False)
    assert "| Capital | Tokyo |" in off(url="corpus://sandbox/countries/jp.html", query="capital")
    assert len(prompts) == 1


def test_focused_extraction_failure_keeps_the_page(world: Any) -> None:
    def broken(messages: list[ChatMessage], info: ModelInfo) -> Reply:
        raise ValueError("provider exploded")

    service = WebService.from_settings(Settings(cache_dir=world.index_dir.parent / "c"),
                                       backend=f"corpus:{world.index_dir}")
    out = CrawlPageTool(service, model=FunctionModel(broken))(url="corpus://sandbox/countries/jp.html", query="x")
    assert out.startswith("(focused extraction failed: ValueError: provider exploded")
    assert "| Capital | Tokyo |" in out


def test_the_corpus_index_is_opened_when_the_tools_are_built_not_by_a_worker_s_first_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sub-agent of a run calls the shared tools from its own worker thread; the first wave
    of calls must find the index open, not open or parse it again, and a keyword-only index never
    touches the dense side (no embedding model, no vectors)."""
    from concurrent.futures import ThreadPoolExecutor

    from amapreduce.web import hybrid
    from amapreduce.web.corpus import CorpusIndex, build_corpus_index

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "jp.md").write_text("# Japan\n\nTokyo is the capital of Japan.\n")
    build_corpus_index([docs], tmp_path / "idx", name="atlas")
    opened: list[Path] = []
    open_index = CorpusIndex.__init__

    def counting_open(self: CorpusIndex, path: Path) -> None:
        opened.append(path)
        open_index(self, path)

    def no_dense_side(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a keyword-only index must not load vectors or an encoder")

    monkeypatch.setattr(CorpusIndex, "__init__", counting_open)
    monkeypatch.setattr(hybrid, "load_vectors", no_dense_side)
    monkeypatch.setattr(hybrid, "embed_documents", no_dense_side)
    search, crawl = build_web_tools(Settings(search_backend=f"corpus:{tmp_path / 'idx'}", cache_dir=tmp_path / "c"))
    assert opened == [(tmp_path / "idx").resolve()]

    def first_calls(worker: int) -> tuple[str, str]:
        return search(query="capital of Japan"), crawl(url="corpus://atlas/jp.md")

    with ThreadPoolExecutor(max_workers=4) as pool:
        outputs = list(pool.map(first_calls, range(8)))
    assert all(found.startswith("1. [Japan](corpus://atlas/jp.md)") and "Tokyo" in page for found, page in outputs)
    assert len(opened) == 1
