"""`tavily` backend: the Tavily search API (needs `TAVILY_API_KEY`)."""

from __future__ import annotations

from amapreduce.web.backends.base import BackendError, KeyedBackend, http_json
from amapreduce.web.models import SearchResult

__all__ = ["TAVILY_URL", "TavilyBackend"]

TAVILY_URL = "https://api.tavily.com"


class TavilyBackend(KeyedBackend):
    """POST `{base_url}/search` with `{"query", "max_results"}` and a Bearer key."""

    name = "tavily"
    default_url = TAVILY_URL

    def _search_once(self, query: str, n: int) -> list[SearchResult]:
        data = http_json(self.name, "POST", f"{self.base_url}/search", timeout_s=self.timeout_s,
                         json_body={"query": query, "max_results": n, "search_depth": "basic"},
                         headers={"Authorization": f"Bearer {self._api_key}"}, transport=self._transport)
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise BackendError("`tavily` reply has no `results` list.", backend=self.name, transient=False)
        results: list[SearchResult] = []
        for item in items:
            if not isinstance(item, dict) or not item.get("url"):
                continue
            results.append(SearchResult(
                rank=len(results) + 1, title=str(item.get("title") or item["url"]), url=str(item["url"]),
                snippet=str(item.get("content") or ""), date=item.get("published_date") or None, source=self.name,
            ))
            if len(results) >= n:
                break
        return results
