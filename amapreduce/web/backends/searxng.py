"""`searxng:URL` backend: a SearXNG instance's JSON API (`/search?format=json`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from amapreduce.web.backends.base import BackendError, RemoteBackend, http_json
from amapreduce.web.models import SearchResult

if TYPE_CHECKING:
    import httpx

__all__ = ["SearxngBackend"]


class SearxngBackend(RemoteBackend):
    """Query a SearXNG instance; its settings must enable the `json` output format.

    Args:
        base_url: the instance, e.g. `http://127.0.0.1:8888`.
        transport: httpx transport (tests).
    """

    name = "searxng"

    def __init__(self, base_url: str, *, transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url.rstrip("/")
        # Per instance, like `corpus:NAME`: two instances must not share cache keys or a limiter.
        # Any `user:password@` is left out, since the name appears in messages and the cache.
        parts = urlsplit(self.base_url)
        self.name = "searxng:" + urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        self._transport = transport

    def _search_once(self, query: str, n: int) -> list[SearchResult]:
        data = http_json(self.name, "GET", f"{self.base_url}/search", timeout_s=self.timeout_s,
                         params={"q": query, "format": "json"}, transport=self._transport)
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise BackendError("`searxng` reply has no `results` list. Is `json` enabled in its "
                               "settings.yml `search.formats`?", backend=self.name, transient=False)
        results: list[SearchResult] = []
        for item in items:
            if not isinstance(item, dict) or not item.get("url"):
                continue
            results.append(SearchResult(
                rank=len(results) + 1, title=str(item.get("title") or item["url"]), url=str(item["url"]),
                snippet=str(item.get("content") or ""), date=item.get("publishedDate") or None, source=self.name,
            ))
            if len(results) >= n:
                break
        return results
