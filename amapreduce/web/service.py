"""`WebService`: search and crawl with cache, policy and usage counts, shared by tools and CLI.

Why a service object: the `web_search`/`crawl_page` tools of every sub-agent in a run share one
backend (one rate limiter), one cache and one usage counter, so the run can report totals.

Crawl outages: one circuit breaker per crawled host (`amapreduce.breaker`), not one for the
crawler. A site that is down, slow or gone is ordinary on the web and must cost a run neither its
other sources nor its end: after `crawl_breaker_failures` crawls of one host in a row that it did
not answer (DNS or connection error, timeout, 5xx), that host's pages fail at once with a
`FetchFailed` telling the model to try another source, for `crawl_breaker_cooldown_s`; then one
probe crawl goes out. A crawler-wide breaker would let a handful of dead links end or stall a
whole run. An outage of the network itself is caught by the search backend's breaker
(`web.backends.base`), which stops the run: every run searches before it crawls. The host
breakers belong to the service (one run), never wait (`max_wait_s` 0) and never stop a run.

Private mode (`local_only`): a user who points a local model at a local corpus expects nothing to
leave the machine, yet a model may write any http(s) URL (`http://www.google.com/search?q=...`)
and the URL policy alone would resolve its host through the system resolver. So with a corpus
search backend, unless `Settings.allow_web_crawl` says otherwise, a URL that is not `corpus://`
is refused first: before the policy, its DNS lookup, the cache and any fetch. Corpus documents
keep no original URL, so nothing else can be served in its place.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from amapreduce.breaker import BreakerPolicy, CircuitBreaker, Outage
from amapreduce.errors import ConfigError, RunError
from amapreduce.web.backends.base import SearchBackend
from amapreduce.web.backends.registry import make_backend
from amapreduce.web.cache import WebCache, normalize_url
from amapreduce.web.corpus import CORPUS_SCHEME, CorpusIndex, split_corpus_url
from amapreduce.web.fetch import FetchFailed, FetchLimits, fetch
from amapreduce.web.flight import SingleFlight
from amapreduce.web.main_text import clip_page_text, extract_main_text
from amapreduce.web.models import Page, SearchResult
from amapreduce.web.policy import CheckedUrl, Resolver, UrlPolicy, UrlRefused

if TYPE_CHECKING:
    import httpx

    from amapreduce.settings import Settings

__all__ = ["MAX_RESULTS", "WebService", "WebUsage", "crawl_breaker_policy"]

MAX_RESULTS = 50


class WebUsage(BaseModel):
    """Counts reported in a run's usage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    searches: int = 0
    crawls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    shared: int = 0
    """Searches and crawls served by an identical one already in flight (`web.flight`): no request of their own."""


class _CachedPage(BaseModel):
    """A cache entry for a crawl: the full page plus every URL fetched to get it.

    Why the hops are kept: a page fetched under a permissive policy (say, redirected to a
    loopback address with `allow_private_urls`) must not be served later to a run whose policy
    would refuse that chain, so each hop is checked again on every cache hit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    page: Page
    hops: tuple[CheckedUrl, ...]


def crawl_breaker_policy(settings: Settings) -> BreakerPolicy:
    """A crawled host's circuit breaker policy, from the `crawl_breaker_*` settings; it never waits."""
    return BreakerPolicy(
        failures=settings.crawl_breaker_failures, cooldown_s=settings.crawl_breaker_cooldown_s, max_wait_s=0.0
    )


def _host_unavailable(outage: Outage) -> FetchFailed:
    """The error of a host's open breaker: this page failed, the run goes on."""
    return FetchFailed(
        f"`{outage.key}` did not answer the last {outage.failures} requests (last: {outage.last_error}), so its "
        "pages are not fetched for now. Try another source.",
        host=outage.key,
        failures=outage.failures,
    )


def _is_crawl_outage(exc: RunError) -> bool:
    """Whether a failed crawl shows its host did not answer (`outage` field: DNS, connection, timeout, 5xx)."""
    return getattr(exc, "outage", False) is True


def _host_of(url: str) -> str | None:
    """The breaker key of an http(s) URL: its lower-case host, with the port when the URL names one
    (two servers of one machine are two sites); None without a host (the URL policy refuses it)."""
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").rstrip("."), parts.port
    except ValueError:
        return None
    if not host:
        return None
    return f"{host}:{port}" if port is not None else host


def _fixed_resolver(addresses: tuple[str, ...]) -> Resolver:
    """A resolver answering with the addresses a cached hop was actually fetched from."""

    def resolve(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolve


class WebService:
    """Search and crawl for one run.

    Args:
        backend: the search backend.
        cache: the on-disk cache (None: no caching).
        policy: URL policy for crawls.
        limits: fetch limits.
        corpora: extra corpus indexes readable through `corpus://NAME/...` (a corpus backend's own
            index is added automatically).
        crawl_breaker: the policy of each crawled host's circuit breaker (None: none;
            `from_settings` gives the `crawl_breaker_*` settings' one).
        local_only: private mode: crawl only `corpus://` URLs and refuse any other before it is
            checked, resolved, looked up in the cache or fetched (`from_settings`: a corpus
            backend without `allow_web_crawl`).
        resolver, transport: injected by tests.
    """

    def __init__(
        self,
        backend: SearchBackend,
        *,
        cache: WebCache | None = None,
        policy: UrlPolicy | None = None,
        limits: FetchLimits | None = None,
        corpora: Mapping[str, CorpusIndex] | None = None,
        crawl_breaker: BreakerPolicy | None = None,
        local_only: bool = False,
        resolver: Resolver | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.backend = backend
        self.local_only = local_only
        self.cache = cache
        self.policy = policy or UrlPolicy()
        self.limits = limits or FetchLimits()
        self.corpora: dict[str, CorpusIndex] = dict(corpora or {})
        own = getattr(backend, "index", None)
        if isinstance(own, CorpusIndex):
            self.corpora.setdefault(own.name, own)
        self._resolver = resolver
        self._transport = transport
        self._lock = threading.Lock()
        self._searches = 0
        self._crawls = 0
        self.crawl_breaker = crawl_breaker
        self._host_breakers: dict[str, CircuitBreaker] = {}
        self._pages: SingleFlight[tuple[Page, bool]] = SingleFlight()
        """One fetch per page in flight: concurrent crawls of one URL share it (`web.flight`)."""
        self._queries: SingleFlight[list[SearchResult]] = SingleFlight()
        """One backend search per query in flight."""

    @classmethod
    def from_settings(
        cls, settings: Settings, *, backend: str | None = None, corpora: Mapping[str, Path] | None = None,
        search: SearchBackend | None = None,
    ) -> WebService:
        """Build the service a run's settings describe (backend spec, cache, URL policy, private
        mode); `search`: a backend already built (a run's pre-flight built it), else built from
        `backend` or the settings. A corpus backend crawls only its corpus unless `allow_web_crawl`."""
        built = search if search is not None else make_backend(backend or settings.search_backend, settings)
        return cls(
            built,
            cache=WebCache.in_dir(settings.cache_dir, settings.cache_ttl_s),
            policy=UrlPolicy(
                allow_private_urls=settings.allow_private_urls,
                allowed_domains=settings.allowed_domains,
                denied_domains=settings.denied_domains,
            ),
            corpora={name: CorpusIndex.open(path) for name, path in (corpora or {}).items()},
            crawl_breaker=crawl_breaker_policy(settings),
            local_only=built.name.startswith("corpus:") and not settings.allow_web_crawl,
        )

    def usage(self) -> WebUsage:
        """Searches, crawls and cache hits/misses so far."""
        hits, misses = self.cache.counts() if self.cache is not None else (0, 0)
        with self._lock:
            return WebUsage(searches=self._searches, crawls=self._crawls, cache_hits=hits, cache_misses=misses,
                            shared=self._pages.shared + self._queries.shared)

    def search(self, query: str, n: int = 5) -> list[SearchResult]:
        """Up to `n` results for `query`, from the cache when fresh; an identical search in flight
        (another sub-agent's) is waited for and shared, not sent again.

        Raises:
            ConfigError: empty query or `n` out of range.
            BackendError: the backend failed.
        """
        query = " ".join(query.split())
        if not query:
            raise ConfigError("the search query is empty. Give a few descriptive words.")
        if not 1 <= n <= MAX_RESULTS:
            raise ConfigError(f"`n` must be between 1 and {MAX_RESULTS}, got {n}. Use a small positive number.")
        with self._lock:
            self._searches += 1
        use_cache = self.cache is not None and not self.backend.name.startswith("corpus:")
        key = f"{self.backend.name}\x00{n}\x00{query}"

        def search() -> list[SearchResult]:
            if use_cache and self.cache is not None:
                stored = self.cache.get("search", key)
                if stored is not None:
                    return [SearchResult.model_validate(item) for item in json.loads(stored)]
            found = self.backend.search(query, n)
            if use_cache and self.cache is not None:
                self.cache.put("search", key, json.dumps([r.model_dump() for r in found]))
            return found

        results, _ = self._queries.do(key, search)
        return list(results)  # each caller its own list

    def crawl(self, url: str, max_chars: int) -> Page:
        """The main text of `url`, truncated to `max_chars` characters.

        `corpus://` URLs are read from the local indexes; in private mode (`local_only`) any
        other URL is refused there and then; else http(s) URLs pass the URL policy (on every
        redirect hop), then the cache, then a real fetch, shared by every crawl of the same
        (normalised) URL that comes while it is in flight (`web.flight`).

        Raises:
            UrlRefused: private mode and not a `corpus://` URL, the policy refuses the URL or a
                redirect hop, or the URL names an unknown corpus.
            FetchFailed: the page could not be fetched or is not text, the corpus has no such
                page, or the host's circuit breaker is open (nothing was sent).
            RunError: the host does not resolve.
            ConfigError: `max_chars` out of range or a malformed corpus URL.
        """
        if max_chars < 100:
            raise ConfigError(f"`max_chars` must be >= 100, got {max_chars}. Use a larger character budget.")
        url = url.strip()
        with self._lock:
            self._crawls += 1
        if url.startswith(CORPUS_SCHEME):
            return self._crawl_corpus(url, max_chars)
        if self.local_only:
            raise self._private_refusal(url)
        breaker = self._host_breaker(url)
        if breaker is None:
            return self._crawl_web(url, max_chars)[0]
        probe = breaker.admit()
        try:
            page, fetched = self._crawl_web(url, max_chars)
        except UrlRefused:
            breaker.release(probe)  # nothing was asked of the host
            raise
        except RunError as exc:
            breaker.record(probe, str(exc) if _is_crawl_outage(exc) else None)
            raise
        except BaseException:
            breaker.release(probe)
            raise
        if fetched:
            breaker.record(probe, None)
        else:
            breaker.release(probe)  # a cached page says nothing about the host now
        return page

    def _private_refusal(self, url: str) -> UrlRefused:
        """Why private mode refuses `url`, as the model reads it: which corpus to read instead."""
        names = ", ".join(repr(name) for name in sorted(self.corpora)) or "(none loaded)"
        which = "corpus" if len(self.corpora) == 1 else "corpora"
        return UrlRefused(
            f"refused URL {url!r}: this run reads only the local {which} {names}: use a corpus:// URL "
            "returned by web_search. (Private mode: only the user can turn web crawling on, with "
            "--allow-web-crawl.)",
            url=url,
        )

    def _host_breaker(self, url: str) -> CircuitBreaker | None:
        """The circuit breaker of `url`'s host (and port), created on its first crawl (None: no crawl breaker)."""
        host = _host_of(url)
        if self.crawl_breaker is None or host is None:
            return None
        with self._lock:
            breaker = self._host_breakers.get(host)
            if breaker is None:
                breaker = self._host_breakers[host] = CircuitBreaker(
                    host, self.crawl_breaker, unavailable=_host_unavailable
                )
            return breaker

    def _crawl_web(self, url: str, max_chars: int) -> tuple[Page, bool]:
        """An http(s) page (the URL policy, then the cache, then a real fetch), and whether it was fetched."""
        self.policy.check(url, self._resolver)
        key = normalize_url(url)
        (full, fetched), shared = self._pages.do(key, lambda: self._load_page(url, key))
        text, cut = clip_page_text(full.text, max_chars)
        # a crawl served by another's fetch asked nothing of the host itself: not its breaker's probe
        return full.model_copy(update={"text": text, "truncated": cut}), fetched and not shared

    def _load_page(self, url: str, key: str) -> tuple[Page, bool]:
        """The whole page of `url` from the cache, else fetched (and cached), and whether it was fetched."""
        full = self._cached_page(key)
        if full is not None:
            return full, False
        raw = fetch(url, self.policy, self.limits, resolver=self._resolver, transport=self._transport)
        title, text = extract_main_text(raw.body, raw.content_type, url=raw.final_url, encoding=raw.encoding)
        full = Page(url=url, final_url=raw.final_url, title=title, text=text, content_type=raw.content_type)
        if self.cache is not None:
            self.cache.put("page", key, _CachedPage(page=full, hops=raw.hops).model_dump_json())
        return full, True

    def _cached_page(self, key: str) -> Page | None:
        """The cached page for `key` after re-checking its redirect chain, or None to fetch again.

        Each hop is checked by the current policy against the addresses it was fetched from, so
        the page is refused exactly as a fresh fetch from those addresses would be (offline, too).
        An entry without hops (older format or damaged) is fetched again rather than trusted.

        Raises:
            UrlRefused: the current policy refuses one of the cached page's hops.
        """
        stored = self.cache.get("page", key) if self.cache is not None else None
        if stored is None:
            return None
        try:
            entry = _CachedPage.model_validate_json(stored)
        except ValidationError:
            return None
        if not entry.hops:
            return None
        for hop in entry.hops:
            self.policy.check(hop.url, _fixed_resolver(hop.addresses))
        return entry.page

    def _crawl_corpus(self, url: str, max_chars: int) -> Page:
        name, _ = split_corpus_url(url)
        index = self.corpora.get(name)
        if index is None:
            known = ", ".join(sorted(self.corpora)) or "none"
            raise UrlRefused(f"unknown corpus {name!r} in {url!r} (loaded: {known}). "
                             "Use a URL returned by web_search.")
        doc = index.get(url)
        if doc is None:
            raise FetchFailed(f"no document {url!r} in corpus {name!r}. Use a URL returned by web_search.", url=url)
        text, cut = clip_page_text(doc.text, max_chars)
        return Page(url=url, final_url=url, title=doc.title, text=text, content_type="text/markdown", truncated=cut)
