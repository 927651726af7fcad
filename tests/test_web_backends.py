"""Every backend's request/response handling: ddgs at its library boundary, the HTTP APIs against
local fakes on 127.0.0.1."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ddgs
import ddgs.exceptions
import pytest
from test_web_fetch import LocalServer, send, send_json

from amapreduce._retry import RetryPolicy
from amapreduce.errors import ConfigError, ProviderRejected
from amapreduce.settings import load_settings
from amapreduce.web.backends import BackendError, make_backend
from amapreduce.web.backends.base import SEARCH_RETRY, RemoteBackend
from amapreduce.web.backends.corpus import CorpusBackend
from amapreduce.web.backends.ddgs import DdgsBackend
from amapreduce.web.backends.searxng import SearxngBackend
from amapreduce.web.backends.serper import SerperBackend
from amapreduce.web.backends.tavily import TavilyBackend
from amapreduce.web.models import SearchResult

NO_WAIT: dict[str, Any] = {"min_interval_s": 0.0, "sleep": lambda s: None}
NO_JITTER = SEARCH_RETRY.model_copy(update={"jitter": 0.0})
"""The default search retry (three attempts, doubling backoff) without jitter, for exact sleeps."""


class FakeDDGS:
    """Stands in for `ddgs.DDGS`: records calls, replays a script of replies or exceptions."""

    script: list[Any] = []
    calls: list[dict[str, Any]] = []

    def __init__(self, timeout: int | None = 5, **kwargs: Any) -> None:
        self.timeout = timeout

    def text(self, query: str, **kwargs: Any) -> list[dict[str, Any]]:
        FakeDDGS.calls.append({"query": query, **kwargs})
        reply = FakeDDGS.script.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


@pytest.fixture
def fake_ddgs(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeDDGS]]:
    FakeDDGS.script, FakeDDGS.calls = [], []
    monkeypatch.setattr(ddgs, "DDGS", FakeDDGS)
    yield FakeDDGS


def test_ddgs_maps_results(fake_ddgs: type[FakeDDGS]) -> None:
    fake_ddgs.script = [[
        {"title": "Paris - Wiki", "href": "https://en.example.org/Paris", "body": "Capital of France."},
        {"title": "no link", "href": "", "body": "dropped"},
        {"title": "Paris tourism", "href": "https://paris.example/", "body": "Visit."},
        {"title": "third", "href": "https://third.example/", "body": "cut by n"},
    ]]
    results = DdgsBackend(**NO_WAIT).search("paris", 2)
    assert [(r.rank, r.url, r.snippet, r.source) for r in results] == [
        (1, "https://en.example.org/Paris", "Capital of France.", "ddgs"),
        (2, "https://paris.example/", "Visit.", "ddgs"),
    ]
    assert fake_ddgs.calls == [{"query": "paris", "max_results": 2, "region": "us-en"}]


def test_ddgs_retries_rate_limits_then_succeeds(fake_ddgs: type[FakeDDGS]) -> None:
    fake_ddgs.script = [ddgs.exceptions.RatelimitException("202 Ratelimit"), [{"title": "t", "href": "https://x.example/"}]]
    slept: list[float] = []
    retry = NO_JITTER.model_copy(update={"base_delay_s": 0.25})
    results = DdgsBackend(min_interval_s=0.0, sleep=slept.append, retry=retry).search("q", 5)
    assert [r.url for r in results] == ["https://x.example/"]
    assert slept == [0.25]


def test_ddgs_network_down_is_a_clear_error(fake_ddgs: type[FakeDDGS]) -> None:
    fake_ddgs.script = [ddgs.exceptions.DDGSException("No results found. [Errno -3] Temporary failure")] * 3
    with pytest.raises(BackendError, match=r"`ddgs` search failed.*corpus:INDEX.*after 3 attempts"):
        DdgsBackend(**NO_WAIT).search("q", 5)


def test_ddgs_no_results_is_an_empty_list_not_an_outage(fake_ddgs: type[FakeDDGS]) -> None:
    # ddgs 9.x raises exactly `DDGSException("No results found.")` when every engine returned nothing.
    fake_ddgs.script = [ddgs.exceptions.DDGSException("No results found.")]
    assert DdgsBackend(**NO_WAIT).search("zzqqxx nothing matches", 5) == []
    assert len(fake_ddgs.calls) == 1  # not retried


def test_ddgs_engine_error_is_still_an_error(fake_ddgs: type[FakeDDGS]) -> None:
    # With an engine failure ddgs raises `DDGSException(err)` with the engine's exception as argument.
    fake_ddgs.script = [ddgs.exceptions.DDGSException(OSError("[Errno -3] Temporary failure"))] * 3
    with pytest.raises(BackendError, match=r"`ddgs` search failed.*Temporary failure.*after 3 attempts"):
        DdgsBackend(**NO_WAIT).search("q", 5)
    assert len(fake_ddgs.calls) == 3


@pytest.fixture
def api() -> Iterator[LocalServer]:
    with LocalServer({}) as srv:
        yield srv


def test_searxng_request_and_parsing(api: LocalServer) -> None:
    api.routes["/search"] = send_json({"results": [
        {"url": "https://a.example/", "title": "A", "content": "alpha", "publishedDate": "2024-01-02"},
        {"title": "no url"},
        {"url": "https://b.example/", "title": "B", "content": "beta"},
    ]})
    results = SearxngBackend(api.url + "/", **NO_WAIT).search("two words", 5)
    assert [(r.rank, r.title, r.url, r.date) for r in results] == [
        (1, "A", "https://a.example/", "2024-01-02"), (2, "B", "https://b.example/", None)]
    method, path, _headers, _body = api.requests[0]
    assert method == "GET" and path == "/search?q=two+words&format=json"


def test_searxng_without_json_format_is_explained(api: LocalServer) -> None:
    api.routes["/search"] = send(403, "Forbidden", "text/html")
    with pytest.raises(BackendError, match="HTTP 403"):
        SearxngBackend(api.url, **NO_WAIT).search("q", 5)
    api.routes["/search"] = send_json({"answers": []})
    with pytest.raises(BackendError, match="json"):
        SearxngBackend(api.url, **NO_WAIT).search("q", 5)


def test_searxng_instances_have_their_own_cache_keys_and_limiters(tmp_path: Path) -> None:
    from amapreduce.web.cache import WebCache
    from amapreduce.web.service import WebService

    cache = WebCache(tmp_path / "c.sqlite3", ttl_s=3600)
    with LocalServer({"/search": send_json({"results": [{"url": "https://a.example/", "title": "A"}]})}) as a, \
            LocalServer({"/search": send_json({"results": [{"url": "https://b.example/", "title": "B"}]})}) as b:
        first, second = SearxngBackend(a.url, **NO_WAIT), SearxngBackend(b.url + "/", **NO_WAIT)
        assert (first.name, second.name) == (f"searxng:{a.url}", f"searxng:{b.url}")
        assert WebService(first, cache=cache).search("same query", 3)[0].url == "https://a.example/"
        assert WebService(second, cache=cache).search("same query", 3)[0].url == "https://b.example/"
        assert WebService(first, cache=cache).search("same query", 3)[0].url == "https://a.example/"
    assert (len(a.requests), len(b.requests)) == (1, 1)
    assert SearxngBackend("http://user:pw@s.example:8888/").name == "searxng:http://s.example:8888"


def test_serper_request_and_parsing(api: LocalServer) -> None:
    api.routes["/search"] = send_json({"organic": [
        {"title": "T1", "link": "https://one.example/", "snippet": "s1", "date": "Mar 3, 2024", "position": 1},
        {"title": "T2", "link": "https://two.example/", "snippet": "s2", "position": 2},
    ]})
    results = SerperBackend("sk-test", base_url=api.url, **NO_WAIT).search("q w", 3)
    assert [(r.rank, r.url, r.date) for r in results] == [(1, "https://one.example/", "Mar 3, 2024"),
                                                          (2, "https://two.example/", None)]
    method, path, headers, body = api.requests[0]
    assert (method, path) == ("POST", "/search")
    assert headers["X-API-KEY"] == "sk-test"
    assert json.loads(body) == {"q": "q w", "num": 3}
    assert "sk-test" not in repr(SerperBackend("sk-test", base_url=api.url))


def test_serper_bad_key_is_not_retried(api: LocalServer) -> None:
    """A refused key refuses every search: it stops the run (`ProviderRejected`), unretried."""
    api.routes["/search"] = send_json({"message": "Unauthorized."}, status=401)
    with pytest.raises(ProviderRejected, match="`serper` refused its API key.*SERPER_API_KEY"):
        SerperBackend("bad", base_url=api.url, **NO_WAIT).search("q", 3)
    assert len(api.requests) == 1


def test_serper_server_errors_are_retried(api: LocalServer) -> None:
    api.routes["/search"] = send_json({"error": "boom"}, status=503)
    slept: list[float] = []
    with pytest.raises(BackendError, match=r"HTTP 503.*after 3 attempts"):
        SerperBackend("k", base_url=api.url, min_interval_s=0.0, retry=NO_JITTER, sleep=slept.append).search("q", 3)
    assert len(api.requests) == 3 and slept == [1.0, 2.0]


def test_http_429_carries_retry_after_and_the_retry_honours_it(api: LocalServer) -> None:
    api.routes["/search"] = send(429, '{"error": "slow down"}', "application/json", {"Retry-After": "7"})
    slept: list[float] = []
    with pytest.raises(BackendError, match=r"HTTP 429.*after 3 attempts") as info:
        SerperBackend("k", base_url=api.url, min_interval_s=0.0, retry=NO_JITTER, sleep=slept.append).search("q", 3)
    assert (info.value.status, info.value.retry_after_s) == (429, 7.0)
    assert slept == [7.0, 7.0]  # Retry-After wins over the 1 s and 2 s backoffs


class ScriptedBackend(RemoteBackend):
    """A remote backend whose attempts replay a script of errors, then return no results."""

    name = "scripted"

    def __init__(self, errors: list[BackendError], **kwargs: Any) -> None:
        super().__init__(min_interval_s=0.0, **kwargs)
        self.errors = list(errors)
        self.calls = 0

    def _search_once(self, query: str, n: int) -> list[SearchResult]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return []


def test_transient_errors_are_retried_with_exponential_backoff() -> None:
    slept: list[float] = []
    busy = [BackendError("busy", transient=True)] * 2
    retry = RetryPolicy(max_retries=2, base_delay_s=0.5, jitter=0)
    assert ScriptedBackend(busy, retry=retry, sleep=slept.append).search("q", 3) == []
    assert slept == [0.5, 1.0]


def test_permanent_errors_are_not_retried() -> None:
    slept: list[float] = []
    backend = ScriptedBackend([BackendError("bad key", transient=False)], sleep=slept.append)
    with pytest.raises(BackendError, match="bad key"):
        backend.search("q", 3)
    assert slept == [] and backend.calls == 1


def test_attempts_run_out_with_a_count_in_the_message() -> None:
    slept: list[float] = []
    down = [BackendError("unreachable", transient=True)] * 3
    with pytest.raises(BackendError, match=r"unreachable \(after 3 attempts of `scripted` search\)"):
        ScriptedBackend(down, retry=NO_JITTER, sleep=slept.append).search("q", 3)
    assert slept == [1.0, 2.0]


def test_backoff_is_capped_but_retry_after_is_honoured_up_to_its_own_limit() -> None:
    slept: list[float] = []
    errors = [BackendError("busy", transient=True)] * 3 + [
        BackendError("slow down", transient=True, retry_after_s=30.0),
        BackendError("slow down", transient=True, retry_after_s=1000.0),
    ]
    retry = RetryPolicy(max_retries=5, base_delay_s=1, max_delay_s=3, max_retry_after_s=60, jitter=0)
    assert ScriptedBackend(errors, retry=retry, sleep=slept.append).search("q", 3) == []
    assert slept == [1.0, 2.0, 3.0, 30.0, 60.0]


class HighestJitter(random.Random):
    """Always draws the top of the jitter range."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_is_jittered_by_default() -> None:
    slept: list[float] = []
    down = [BackendError("unreachable", transient=True)] * 3
    with pytest.raises(BackendError):
        ScriptedBackend(down, sleep=slept.append, rng=HighestJitter()).search("q", 3)
    assert slept == [1.25, 2.5]  # SEARCH_RETRY: 1 s and 2 s, each + 25 % jitter

    seeded: list[float] = []
    with pytest.raises(BackendError):
        ScriptedBackend(down * 2, retry=RetryPolicy(max_retries=5), sleep=seeded.append, rng=random.Random(3)).search("q", 3)
    assert len(set(s / 2**i for i, s in enumerate(seeded))) == 5  # every backoff drew its own jitter
    for attempt, s in enumerate(seeded):
        assert 0.75 * 2**attempt <= s <= 1.25 * 2**attempt


def test_backends_of_one_name_must_agree_on_their_spacing(fake_ddgs: type[FakeDDGS]) -> None:
    fake_ddgs.script = [[], []]

    class Spaced(DdgsBackend):
        name = "test-web-backends-spaced"

    Spaced(min_interval_s=0.0).search("q", 1)
    Spaced(min_interval_s=0.0).search("q", 1)
    with pytest.raises(ConfigError, match="test-web-backends-spaced"):
        Spaced(min_interval_s=5.0).search("q", 1)
    assert len(fake_ddgs.calls) == 2


def test_tavily_request_and_parsing(api: LocalServer) -> None:
    api.routes["/search"] = send_json({"query": "q", "results": [
        {"title": "Tv", "url": "https://tv.example/", "content": "c", "score": 0.9, "published_date": "2025-05-05"}]})
    results = TavilyBackend("tv-key", base_url=api.url, **NO_WAIT).search("q", 4)
    assert [(r.title, r.url, r.snippet, r.date, r.source) for r in results] == [
        ("Tv", "https://tv.example/", "c", "2025-05-05", "tavily")]
    _method, _path, headers, body = api.requests[0]
    assert headers["Authorization"] == "Bearer tv-key"
    assert json.loads(body) == {"query": "q", "max_results": 4, "search_depth": "basic"}


def test_non_json_reply_is_a_permanent_error(api: LocalServer) -> None:
    api.routes["/search"] = send(200, "<html>oops</html>", "text/html")
    with pytest.raises(BackendError, match="non-JSON"):
        TavilyBackend("k", base_url=api.url, **NO_WAIT).search("q", 4)
    assert len(api.requests) == 1


def test_unreachable_api_is_a_clear_error() -> None:
    with LocalServer({}) as srv:
        url = srv.url
    with pytest.raises(BackendError, match=r"unreachable.*after 2 attempts"):
        SerperBackend("k", base_url=url, retry=RetryPolicy(max_retries=1), **NO_WAIT).search("q", 3)


def test_make_backend_specs_and_key_errors(tmp_path: Path) -> None:
    settings = load_settings({})
    assert isinstance(make_backend("ddgs", settings), DdgsBackend)
    assert make_backend("searxng:http://127.0.0.1:9/", settings).base_url == "http://127.0.0.1:9"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="needs a URL"):
        make_backend("searxng", settings)
    with pytest.raises(ConfigError, match="SERPER_API_KEY"):
        make_backend("serper", settings)
    with pytest.raises(ConfigError, match="TAVILY_API_KEY"):
        make_backend("tavily", settings)
    with pytest.raises(ConfigError, match="unknown search backend"):
        make_backend("google", settings)
    with pytest.raises(ConfigError, match="no corpus index"):
        make_backend(f"corpus:{tmp_path}", settings)
    keyed = load_settings({"SERPER_API_KEY": "from-alias", "TAVILY_API_KEY": "t", "AMAPREDUCE_SEARXNG_URL": "http://s"})
    assert isinstance(make_backend("serper", keyed), SerperBackend)
    assert isinstance(make_backend("tavily", keyed), TavilyBackend)
    assert make_backend("searxng", keyed).base_url == "http://s"  # type: ignore[attr-defined]


def test_settings_alias_and_secret_never_printed() -> None:
    s = load_settings({"SERPER_API_KEY": "alias-key", "AMAPREDUCE_TAVILY_API_KEY": "prefixed",
                       "TAVILY_API_KEY": "ignored"})
    assert s.serper_api_key is not None and s.serper_api_key.get_secret_value() == "alias-key"
    assert s.tavily_api_key is not None and s.tavily_api_key.get_secret_value() == "prefixed"
    assert "alias-key" not in repr(s) and "alias-key" not in str(s) and "alias-key" not in s.model_dump_json()


def test_corpus_backend_name(tmp_path: Path) -> None:
    from amapreduce.web.corpus import build_corpus_index

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello corpus world")
    build_corpus_index([tmp_path / "docs"], tmp_path / "idx", name="mine")
    backend = CorpusBackend(tmp_path / "idx")
    assert backend.name == "corpus:mine"
    assert [r.url for r in backend.search("hello", 3)] == ["corpus://mine/a.txt"]
