"""Private mode: with a local corpus as the search backend, crawling stays inside the corpus.

A user who points a local model at a local corpus expects nothing to leave the machine, yet a
model may write any URL (`http://www.google.com/search?q=...`) and the URL policy resolves its host
through the system resolver. So a corpus backend crawls only `corpus://` URLs and refuses any other
before the policy, its DNS lookup, the cache or a fetch, unless the user allows web crawling
(`--allow-web-crawl`, `AMAPREDUCE_ALLOW_WEB_CRAWL`). Everything here is real: a corpus index built in
`tmp_path`, the service, the tools, and the command line with a simulated model behind the loopback
OpenAI-compatible server; what is counted is what the service asked of the resolver, the cache and
a loopback web server.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from smolagents import ToolCallingAgent
from smolagents.models import ChatMessage
from test_web_fetch import ARTICLE, LocalServer, send

from amapreduce.cli.app import main
from amapreduce.errors import ToolCallRefused
from amapreduce.llm.guard import allow_model_requests
from amapreduce.llm.messages import message_text
from amapreduce.settings import Settings, load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply, final_answer, tool_call
from amapreduce.web.backends.corpus import CorpusBackend
from amapreduce.web.cache import WebCache
from amapreduce.web.corpus import build_corpus_index
from amapreduce.web.policy import UrlPolicy, UrlRefused
from amapreduce.web.service import WebService
from amapreduce.web.tools import build_web_tools

GOOGLE = "http://www.google.com/search?q=capital+of+Japan"


class Resolver:
    """A resolver that records every (host, port) it is asked for and answers with `addresses`."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return list(self.addresses)


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A two-document corpus index named `atlas`."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "jp.md").write_text("# Japan\n\n| Capital | Tokyo |\n|---|---|\n\nJapan is an island country.\n")
    (docs / "fr.md").write_text("# France\n\n| Capital | Paris |\n|---|---|\n\nFrance is in Europe.\n")
    build_corpus_index([docs], tmp_path / "idx", name="atlas")
    return tmp_path / "idx"


def private_service(index: Path, resolver: Resolver, **kwargs: Any) -> WebService:
    return WebService(CorpusBackend(index), local_only=True, resolver=resolver, **kwargs)


@pytest.mark.parametrize("url", [
    "http://example.com/x", GOOGLE, "https://93.184.216.34/", "HTTP://example.com/", "ftp://example.com/f",
    "CORPUS://atlas/jp.md", "example.com",
])
def test_private_mode_refuses_any_other_url_before_any_dns_lookup_or_cache_lookup(
    index: Path, tmp_path: Path, url: str
) -> None:
    resolver = Resolver(["93.184.216.34"])  # a public address: the policy alone would let it through
    cache = WebCache(tmp_path / "c.sqlite3", ttl_s=60)
    service = private_service(index, resolver, cache=cache)
    with pytest.raises(UrlRefused, match=r"this run reads only the local corpus 'atlas': use a corpus:// URL "
                                         r"returned by web_search") as refused:
        service.crawl(url, 1_000)
    assert resolver.calls == []  # no DNS lookup
    assert cache.counts() == (0, 0)  # no cache lookup
    assert refused.value.fields["url"] == url


def test_corpus_urls_still_work_in_private_mode(index: Path) -> None:
    resolver = Resolver(["93.184.216.34"])
    service = private_service(index, resolver)
    page = service.crawl("corpus://atlas/jp.md", 1_000)
    assert page.title == "Japan" and "Tokyo" in page.text
    assert service.search("capital of France", 1)[0].url == "corpus://atlas/fr.md"
    assert resolver.calls == []


def test_private_mode_serves_no_cached_page_and_sends_nothing(index: Path, tmp_path: Path) -> None:
    """A page another run fetched and cached (here from a loopback server) is refused too, and its
    server sees no request: private mode decides before the cache."""
    cache_file = tmp_path / "c.sqlite3"
    with LocalServer({"/page": send(body=ARTICLE)}) as srv:
        url = srv.url + "/page"
        web = WebService(CorpusBackend(index), cache=WebCache(cache_file, ttl_s=60),
                         policy=UrlPolicy(allow_private_urls=True))
        assert "Probe City" in web.crawl(url, 10_000).text  # cached now
        private = WebService(CorpusBackend(index), cache=WebCache(cache_file, ttl_s=60),
                             policy=UrlPolicy(allow_private_urls=True), local_only=True)
        with pytest.raises(UrlRefused, match="reads only the local corpus 'atlas'"):
            private.crawl(url, 10_000)
    assert len(srv.requests) == 1  # the first service's fetch only
    assert private.cache is not None and private.cache.counts() == (0, 0)


def test_with_web_crawling_allowed_the_url_goes_to_the_policy_and_its_resolver(index: Path) -> None:
    resolver = Resolver(["127.0.0.1"])  # a loopback answer, which the policy refuses
    service = WebService(CorpusBackend(index), local_only=False, resolver=resolver)
    with pytest.raises(UrlRefused, match=r"host `example.com` is a loopback address \(127.0.0.1\)"):
        service.crawl("http://example.com/x", 1_000)
    assert resolver.calls == [("example.com", 80)]


def test_the_model_reads_the_refusal_through_crawl_page_and_it_names_the_corpus(index: Path) -> None:
    resolver = Resolver(["93.184.216.34"])
    search, crawl = build_web_tools(service=private_service(index, resolver))
    with pytest.raises(ToolCallRefused, match="reads only the local corpus 'atlas'") as refused:
        crawl(url=GOOGLE)
    assert "use a corpus:// URL returned by web_search" in str(refused.value)
    assert "corpus://atlas/jp.md" in search(query="capital of Japan")
    assert "| Capital | Tokyo |" in crawl(url="corpus://atlas/jp.md")
    assert resolver.calls == []


def test_an_agent_that_tries_the_web_is_told_to_read_the_corpus_and_does(index: Path) -> None:
    resolver = Resolver(["93.184.216.34"])
    tools = build_web_tools(service=private_service(index, resolver))
    seen: list[str] = []

    def play(messages: list[ChatMessage], info: ModelInfo) -> Reply:
        seen.append(message_text(messages[-1]) if messages else "")
        if info.call_index == 0:
            return tool_call("crawl_page", url=GOOGLE)
        if info.call_index == 1:
            return tool_call("crawl_page", url="corpus://atlas/jp.md")
        capital = re.search(r"\| Capital \| ([^|]+?) \|", seen[-1])
        return final_answer(capital.group(1) if capital else "unknown")

    agent = ToolCallingAgent(tools=tools, model=FunctionModel(play), max_steps=4)
    assert str(agent.run("What is the capital of Japan?")) == "Tokyo"
    assert "UrlRefused" in seen[1] and "reads only the local corpus 'atlas'" in seen[1]
    assert resolver.calls == []


def test_a_corpus_backend_from_the_settings_is_private_unless_web_crawling_is_allowed(
    index: Path, tmp_path: Path
) -> None:
    corpus = f"corpus:{index}"
    assert WebService.from_settings(Settings(search_backend=corpus, cache_dir=tmp_path / "c")).local_only is True
    allowed = Settings(search_backend=corpus, cache_dir=tmp_path / "c", allow_web_crawl=True)
    assert WebService.from_settings(allowed).local_only is False
    # a corpus named by `backend=` (as `amapreduce crawl` does) decides as the setting does
    assert WebService.from_settings(Settings(cache_dir=tmp_path / "c"), backend=corpus).local_only is True
    from_env = load_settings({"AMAPREDUCE_SEARCH_BACKEND": corpus, "AMAPREDUCE_ALLOW_WEB_CRAWL": "1",
                              "AMAPREDUCE_CACHE_DIR": str(tmp_path / "c")})
    assert from_env.allow_web_crawl is True and WebService.from_settings(from_env).local_only is False
    assert load_settings({}).allow_web_crawl is False


def test_a_web_backend_is_not_private(index: Path, tmp_path: Path) -> None:
    from amapreduce.web.backends.base import SearchBackend
    from amapreduce.web.models import SearchResult

    class Web(SearchBackend):
        name = "web"

        def search(self, query: str, n: int) -> list[SearchResult]:
            return []

    assert WebService.from_settings(Settings(cache_dir=tmp_path / "c"), search=Web()).local_only is False


# -- the command line: `mapreduce run DECISION --search corpus:INDEX` --------------------------------


@pytest.fixture
def looked_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every host name the process resolves; any but loopback fails as an offline machine's would."""
    real = socket.getaddrinfo
    hosts: list[str] = []

    def recording(host: Any, *args: Any, **kwargs: Any) -> Any:
        hosts.append(str(host))
        if str(host) not in ("127.0.0.1", "localhost", "::1"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    yield hosts


class WebFirst:
    """A sub-agent that first tries a search engine's page, then answers; keeps what it was told."""

    def __init__(self) -> None:
        self.observations: list[str] = []

    def __call__(self, messages: list[Any], info: ModelInfo) -> Reply:
        text = "\n".join(message_text(m) for m in messages)
        if GOOGLE not in text:
            return tool_call("crawl_page", url=GOOGLE)
        self.observations.append(message_text(messages[-1]))
        asked = dict.fromkeys(re.findall(r"capital of (\w+)\?", text))
        return final_answer(json.dumps([{"country": c, "capital": "?"} for c in asked]))


@pytest.mark.parametrize("allowed", [False, True], ids=["private", "allow-web-crawl"])
def test_mapreduce_run_on_a_corpus_never_looks_up_a_web_host_unless_allowed(
    allowed: bool, index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, looked_up: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    decision = tmp_path / "capitals.json"
    decision.write_text(json.dumps({
        "task_matrix": [["Japan"]], "template": "What is the capital of __0__?",
        "json_schema": {"type": "object", "properties": {"country": {}, "capital": {"description": "its capital"}}},
        "batch_strategy": {"type": "per_atom", "rationale": "one look-up"},
    }), encoding="utf-8")
    world = WebFirst()
    with OpenAICompatibleServer(FunctionModel(world, model_id="sim-model")) as server, allow_model_requests():
        code = main(["mapreduce", "run", str(decision), "--model", "sim-model", "--api-base", server.base_url,
                     "--search", f"corpus:{index}", "--workers", "1", "--json",
                     *(["--allow-web-crawl"] if allowed else [])])
    assert code in (0, 3), capsys.readouterr().err
    assert world.observations, "the sub-agent never saw its crawl's observation"
    told = world.observations[0]
    if allowed:
        assert "www.google.com" in looked_up and "cannot resolve host `www.google.com`" in told
    else:
        assert "www.google.com" not in looked_up
        assert "reads only the local corpus 'atlas'" in told and "use a corpus:// URL returned by web_search" in told


@pytest.mark.parametrize("path", [["ask"], ["mapreduce", "run"], ["enrich"], ["mcp", "serve"], ["eval", "run"]])
def test_every_command_that_takes_search_takes_allow_web_crawl(
    path: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    assert main([*path, "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--search" in shown and "--allow-web-crawl" in shown and "private mode" in shown
