"""Search and crawl outages fail fast (issue 16, point 1).

`ask` against an unreachable search backend once ran 541 s and exited with `no_table`: each of
the manager's 31 steps was the same DNS error, shown to the model as one more failed call. Now a
search backend has the model providers' circuit breaker (K outage failures in a row open it; "no
results" and rate limits do not count), its open breaker raises `SearchUnavailable`, the web tools
let that through, and the manager's run ends at that step: `result.json` says `failed` with the
reason on one line. Crawled hosts get a breaker each, which fails their pages fast and never ends
a run. Nothing here sleeps: backoffs are recorded, and an open breaker with `max_wait_s=0` fails
at once (its cool-down of an hour is never reached).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import ddgs
import ddgs.exceptions
import pytest
from sessions import ask as run_ask
from test_web_backends import NO_JITTER, FakeDDGS
from test_web_fetch import PRIVATE, LocalServer, send, send_json

from amapreduce.breaker import BreakerPolicy, BreakerState
from amapreduce.errors import ProviderUnavailable, SearchUnavailable
from amapreduce.llm.guard import allow_model_requests
from amapreduce.mapreduce.result import RunEnding, RunStatus, stop_ending
from amapreduce.settings import load_settings
from amapreduce.testing.openai_server import OpenAICompatibleServer
from amapreduce.testing.scripted import FunctionModel, ModelInfo, tool_call
from amapreduce.web.backends.base import BackendError
from amapreduce.web.backends.ddgs import DdgsBackend
from amapreduce.web.backends.registry import make_backend
from amapreduce.web.backends.searxng import SearxngBackend
from amapreduce.web.fetch import FetchFailed
from amapreduce.web.service import WebService
from amapreduce.web.tools import build_web_tools

HOUR = 3600.0
"""A cool-down no test reaches: an open breaker stays open for the whole test."""
FAIL_AT_ONCE = {"cooldown_s": HOUR, "max_wait_s": 0.0}


def policy(failures: int) -> BreakerPolicy:
    return BreakerPolicy(failures=failures, **FAIL_AT_ONCE)


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so no one else gets it) but not listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.fixture
def down() -> Iterator[LocalServer]:
    """A loopback search API (SearXNG's `/search`) and web site (`/page`) that answer 503."""
    with LocalServer({"/search": send_json({"error": "down"}, status=503), "/page": send(503, "down")}) as srv:
        yield srv


def searches(server: LocalServer) -> int:
    return sum(1 for _method, path, _headers, _body in server.requests if path.startswith("/search"))


def scripted(replies: list[Any]) -> Any:
    """A route answering each request with the next of `replies` (a status, or a JSON body with 200)."""

    def route(h: BaseHTTPRequestHandler) -> None:
        reply = replies.pop(0)
        if isinstance(reply, int):
            send_json({"error": "x"}, status=reply)(h)
        else:
            send_json(reply)(h)

    return route


# --- the search backend's breaker ------------------------------------------------------------


def test_the_search_breaker_opens_after_k_failed_requests_then_fails_at_once(down: LocalServer) -> None:
    slept: list[float] = []
    backend = SearxngBackend(down.url, min_interval_s=0.0, retry=NO_JITTER, sleep=slept.append, breaker=policy(5))
    with pytest.raises(BackendError, match="HTTP 503"):
        backend.search("q", 3)  # three requests, backed off 1 s and 2 s: the breaker is still closed
    breaker = backend.circuit_breaker()
    assert breaker is not None and breaker.state is BreakerState.CLOSED and searches(down) == 3
    with pytest.raises(SearchUnavailable) as caught:
        backend.search("q", 3)  # two more requests open it; the third attempt is never sent nor backed off
    assert searches(down) == 5 and slept == [1.0, 2.0, 1.0]
    assert breaker.state is BreakerState.OPEN
    err = caught.value
    assert isinstance(err, ProviderUnavailable)  # stops a run wherever a provider outage does
    assert err.provider == down_name(down) and err.failures == 5 and "HTTP 503" in (err.last_error or "")
    assert "\n" not in str(err) and f"search backend {down_name(down)!r} is unavailable" in str(err)
    with pytest.raises(SearchUnavailable):
        backend.search("another query", 3)
    assert searches(down) == 5  # nothing is sent while the breaker is open
    assert stop_ending(err) == RunEnding(RunStatus.FAILED, str(err))


def down_name(server: LocalServer) -> str:
    return f"searxng:{server.url}"


def test_a_refused_connection_counts_and_every_backend_of_a_name_shares_the_breaker(refused_port: int) -> None:
    url = f"http://127.0.0.1:{refused_port}"
    first = SearxngBackend(url, min_interval_s=0.0, sleep=lambda s: None, breaker=policy(2))
    with pytest.raises(SearchUnavailable, match="ConnectError"):
        first.search("q", 3)  # attempt 1 and 2 refused: open; attempt 3 is turned away
    second = SearxngBackend(url, min_interval_s=0.0, sleep=lambda s: None, breaker=policy(2))
    with pytest.raises(SearchUnavailable):
        second.search("q", 3)


def test_an_outage_names_the_flag_that_searches_offline(refused_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The advice names `--search` (every run command's flag; `amapreduce search` takes it too), not `--backend`."""
    once = NO_JITTER.model_copy(update={"max_retries": 0})
    searxng = SearxngBackend(f"http://127.0.0.1:{refused_port}", min_interval_s=0.0, sleep=lambda s: None,
                             breaker=policy(5), retry=once)
    with pytest.raises(BackendError) as refused:
        searxng.search("q", 3)
    FakeDDGS.calls = []
    FakeDDGS.script = [ddgs.exceptions.DDGSException(ConnectionError("[Errno -3] Temporary failure in name resolution"))]
    monkeypatch.setattr(ddgs, "DDGS", FakeDDGS)
    with pytest.raises(BackendError) as offline:
        DdgsBackend(min_interval_s=0.0, sleep=lambda s: None, breaker=policy(5), retry=once).search("q", 3)
    for err in (refused.value, offline.value):
        assert "`--search corpus:INDEX`" in str(err) and "--backend" not in str(err)


def test_no_results_and_rate_limits_are_answers_that_reset_the_count() -> None:
    replies: list[Any] = [503, {"results": []}, 503, 429, 503, {"results": []}, 503, 503]
    with LocalServer({"/search": scripted(replies)}) as api:
        backend = SearxngBackend(api.url, min_interval_s=0.0, sleep=lambda s: None, breaker=policy(2),
                                 retry=NO_JITTER.model_copy(update={"max_retries": 0}))
        outcomes = []
        for _ in range(8):
            try:
                outcomes.append(len(backend.search("q", 3)))
            except SearchUnavailable:
                outcomes.append("unavailable")
            except BackendError as exc:
                outcomes.append(exc.status)
    # Two 503s in a row are needed; an empty result or a 429 between them resets the count.
    assert outcomes == [503, 0, 503, 429, 503, 0, 503, 503]
    assert len(api.requests) == 8
    breaker = backend.circuit_breaker()
    assert breaker is not None and breaker.state is BreakerState.OPEN
    with pytest.raises(SearchUnavailable):
        backend.search("q", 3)


def test_ddgs_no_results_do_not_count_but_failures_do(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeDDGS.calls = []
    FakeDDGS.script = [
        ddgs.exceptions.DDGSException("No results found."),
        ddgs.exceptions.DDGSException(ConnectionError("[Errno -3] Temporary failure in name resolution")),
        ddgs.exceptions.DDGSException("No results found."),
        ddgs.exceptions.DDGSException(ConnectionError("[Errno -3] Temporary failure in name resolution")),
        ddgs.exceptions.DDGSException(ConnectionError("[Errno -3] Temporary failure in name resolution")),
    ]
    monkeypatch.setattr(ddgs, "DDGS", FakeDDGS)
    backend = DdgsBackend(min_interval_s=0.0, sleep=lambda s: None, breaker=policy(2),
                          retry=NO_JITTER.model_copy(update={"max_retries": 0}))
    assert backend.search("q", 3) == []
    with pytest.raises(BackendError, match="name resolution"):
        backend.search("q", 3)
    assert backend.search("q", 3) == []  # an empty result: the backend answered
    with pytest.raises(BackendError):
        backend.search("q", 3)
    with pytest.raises(BackendError):
        backend.search("q", 3)  # the second in a row: open
    with pytest.raises(SearchUnavailable, match="name resolution"):
        backend.search("q", 3)
    assert len(FakeDDGS.calls) == 5


def test_backends_built_from_settings_have_the_search_breaker(tmp_path: Path, refused_port: int) -> None:
    settings = load_settings(
        {}, search_breaker_failures=1, search_breaker_cooldown_s=HOUR, search_breaker_max_wait_s=0,
        search_min_interval_s=0, cache_dir=tmp_path / "cache",
    )
    backend = make_backend(f"searxng:http://127.0.0.1:{refused_port}", settings)
    with pytest.raises(SearchUnavailable):
        backend.search("q", 3)  # one refused request opens it; no retry is backed off or sent
    assert load_settings({}).search_breaker_failures == 5  # the default, like the providers' breaker


def test_the_web_search_tool_lets_search_unavailable_through(down: LocalServer) -> None:
    backend = SearxngBackend(down.url, min_interval_s=0.0, sleep=lambda s: None, breaker=policy(1))
    search, _crawl = build_web_tools(service=WebService(backend))
    with pytest.raises(SearchUnavailable):  # not a ToolCallFailed: the model cannot fix an outage
        search(query="q")


# --- crawled hosts -------------------------------------------------------------------------------


def test_a_crawled_host_that_does_not_answer_fails_fast_and_others_still_work(down: LocalServer) -> None:
    with LocalServer({"/page": send(200, "<html><body><p>A page that works fine.</p></body></html>")}) as up:
        service = WebService(SearxngBackend(down.url), policy=PRIVATE, crawl_breaker=policy(2))
        for _ in range(2):
            with pytest.raises(FetchFailed, match="HTTP 503"):
                service.crawl(down.url + "/page", 1000)
        with pytest.raises(FetchFailed, match="did not answer the last 2 requests") as caught:
            service.crawl(down.url + "/page", 1000)
        assert not isinstance(caught.value, ProviderUnavailable)  # a page failed; the run goes on
        assert len(down.requests) == 2  # nothing was sent to the open host
        assert "works fine" in service.crawl(up.url + "/page", 1000).text  # another host (port) is unaffected


def test_missing_pages_are_answers_and_never_open_a_host_breaker() -> None:
    with LocalServer({}) as site:  # every path: 404
        service = WebService(SearxngBackend(site.url), policy=PRIVATE, crawl_breaker=policy(2))
        for _ in range(4):
            with pytest.raises(FetchFailed, match="HTTP 404"):
                service.crawl(site.url + "/missing", 1000)
    assert len(site.requests) == 4


# --- a manager run ends `failed` with the reason ----------------------------------------------


class Searcher:
    """A simulated manager that only ever searches: it never gives up on its own."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: list[Any], info: ModelInfo) -> Any:
        assert "web_search" in info.tools
        self.calls += 1
        return tool_call("web_search", query=f"capital cities, attempt {self.calls}")


@pytest.fixture
def manager() -> Iterator[tuple[OpenAICompatibleServer, Searcher]]:
    searcher = Searcher()
    with OpenAICompatibleServer(FunctionModel(searcher, model_id="sim-model")) as srv, allow_model_requests():
        yield srv, searcher


def read_result(run_dir: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    return result


def manager_steps(run_dir: Path) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text(encoding="utf-8").splitlines()]
    return [e for e in events if e.get("event") == "manager_step"]


def test_ask_with_an_unreachable_search_backend_fails_at_its_first_step(
    manager: tuple[OpenAICompatibleServer, Searcher], tmp_path: Path, refused_port: int
) -> None:
    server, searcher = manager
    settings = load_settings(
        {}, model="sim-model", api_base=server.base_url, api_key="k", runs_dir=tmp_path / "runs",
        cache_dir=tmp_path / "cache", search_backend=f"searxng:http://127.0.0.1:{refused_port}",
        search_min_interval_s=0, search_breaker_failures=1, search_breaker_cooldown_s=HOUR,
        search_breaker_max_wait_s=0,
    )
    outcome = run_ask("What are the capitals of Europe?", settings, show_progress=False)
    assert outcome.ending.status is RunStatus.FAILED and outcome.status == "failed"
    assert searcher.calls == 1  # one paid manager step, not 31
    saved = read_result(outcome.run_dir.path)
    assert saved["status"] == "failed"
    reason = saved["error"]
    assert "\n" not in reason and reason == outcome.ending.reason
    assert reason.startswith(f"search backend 'searxng:http://127.0.0.1:{refused_port}' is unavailable")
    assert "ConnectError" in reason


def test_a_manager_whose_searches_keep_failing_stops_within_a_bounded_number_of_steps(
    manager: tuple[OpenAICompatibleServer, Searcher], tmp_path: Path, down: LocalServer
) -> None:
    server, searcher = manager
    backend = SearxngBackend(down.url, min_interval_s=0.0, sleep=lambda s: None, breaker=policy(3))
    settings = load_settings(
        {}, model="sim-model", api_base=server.base_url, api_key="k", runs_dir=tmp_path / "runs", manager_max_steps=30
    )
    outcome = run_ask(
        "What are the capitals of Europe?", settings, web_tools=build_web_tools(service=WebService(backend)),
        show_progress=False,
    )
    # Step 1: three requests fail (503), the model reads the error. Step 2: the breaker is open,
    # nothing is sent, and the run ends with the breaker's reason.
    assert searcher.calls == 2 and searches(down) == 3
    steps = manager_steps(outcome.run_dir.path)
    assert len(steps) == 2
    assert "HTTP 503" in steps[0]["error"] and "SearchUnavailable" in steps[1]["error"]
    saved = read_result(outcome.run_dir.path)
    assert saved["status"] == "failed" and "\n" not in saved["error"]
    assert saved["error"].startswith(f"search backend {down_name(down)!r} is unavailable: 3 requests in a row failed")
