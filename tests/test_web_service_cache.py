"""A cached page is served only if the current URL policy accepts every hop it was fetched through.

The cache file is shared by runs with different policies (one run may allow private URLs or have
no deny list), so a page cached by a permissive run must not leak to a stricter one.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from amapreduce.web.backends.base import SearchBackend
from amapreduce.web.cache import WebCache, normalize_url
from amapreduce.web.models import Page, SearchResult
from amapreduce.web.policy import UrlPolicy, UrlRefused
from amapreduce.web.service import WebService

BODY = "<html><title>S</title><body><p>internal admin panel data that must stay private</p></body></html>"
DNS = {"public.test": ["93.184.216.34"], "intranet.test": ["10.0.0.5"], "evil.test": ["93.184.216.35"]}


class NoSearch(SearchBackend):
    name = "none"

    def search(self, query: str, n: int) -> list[SearchResult]:
        raise AssertionError("no search expected")


class Site:
    """A fake web: `public.test/` redirects to `target`; every request is recorded."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.requests: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        if request.url.host == "public.test":
            return httpx.Response(302, headers={"location": self.target})
        return httpx.Response(200, headers={"content-type": "text/html"}, text=BODY)


def _service(cache_file: Path, site: Site, policy: UrlPolicy, dns: dict[str, list[str]] = DNS) -> WebService:
    return WebService(NoSearch(), cache=WebCache(cache_file, ttl_s=3600), policy=policy,
                      resolver=lambda host, port: dns[host], transport=httpx.MockTransport(site.handler))


@pytest.mark.parametrize("target", ["http://127.0.0.1/secret", "http://intranet.test/secret"])
def test_page_cached_by_a_permissive_policy_is_refused_by_a_strict_one(tmp_path: Path, target: str) -> None:
    site = Site(target)
    loose = _service(tmp_path / "c.sqlite3", site, UrlPolicy(allow_private_urls=True))
    assert loose.crawl("http://public.test/", 1000).final_url == target
    assert loose.crawl("http://public.test/", 1000).final_url == target  # a hit for the same policy
    assert len(site.requests) == 2
    strict = _service(tmp_path / "c.sqlite3", site, UrlPolicy())
    with pytest.raises(UrlRefused, match="private|loopback"):
        strict.crawl("http://public.test/", 1000)
    assert len(site.requests) == 2  # refused from the cache entry, nothing fetched
    assert strict.usage().cache_hits == 1


def test_cached_hops_are_checked_against_the_addresses_they_were_fetched_from(tmp_path: Path) -> None:
    site = Site("http://intranet.test/secret")
    _service(tmp_path / "c.sqlite3", site, UrlPolicy(allow_private_urls=True)).crawl("http://public.test/", 1000)
    # DNS now answers publicly for the hop's name, but the cached text came from 10.0.0.5.
    now_public = {**DNS, "intranet.test": ["93.184.216.36"]}
    strict = _service(tmp_path / "c.sqlite3", site, UrlPolicy(), dns=now_public)
    with pytest.raises(UrlRefused, match=r"private address \(10\.0\.0\.5\)"):
        strict.crawl("http://public.test/", 1000)


def test_a_newer_deny_list_refuses_a_cached_redirect_target(tmp_path: Path) -> None:
    site = Site("http://evil.test/page")
    assert "admin panel" in _service(tmp_path / "c.sqlite3", site, UrlPolicy()).crawl("http://public.test/", 1000).text
    denying = _service(tmp_path / "c.sqlite3", site, UrlPolicy(denied_domains=("evil.test",)))
    with pytest.raises(UrlRefused, match="deny list"):
        denying.crawl("http://public.test/", 1000)
    allowing = _service(tmp_path / "c.sqlite3", site, UrlPolicy(allowed_domains=("public.test",)))
    with pytest.raises(UrlRefused, match="allow list"):
        allowing.crawl("http://public.test/", 1000)
    assert len(site.requests) == 2


def test_an_entry_without_hops_is_fetched_again_not_trusted(tmp_path: Path) -> None:
    cache = WebCache(tmp_path / "c.sqlite3", ttl_s=3600)
    legacy = Page(url="http://public.test/", final_url="http://127.0.0.1/secret", title="S", text="leaked")
    cache.put("page", normalize_url("http://public.test/"), legacy.model_dump_json())
    site = Site("http://127.0.0.1/secret")
    with pytest.raises(UrlRefused, match="loopback"):  # refused by the live fetch's redirect check
        _service(tmp_path / "c.sqlite3", site, UrlPolicy()).crawl("http://public.test/", 1000)
    assert site.requests == ["http://public.test/"]
    page = _service(tmp_path / "c.sqlite3", site, UrlPolicy(allow_private_urls=True)).crawl("http://public.test/", 1000)
    assert "admin panel" in page.text  # re-fetched and stored in the new format
