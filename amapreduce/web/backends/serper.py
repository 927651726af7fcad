"""`serper` backend: Google results through serper.dev (needs `SERPER_API_KEY`)."""

from __future__ import annotations

from amapreduce.web.backends.base import BackendError, KeyedBackend, http_json
from amapreduce.web.models import SearchResult

__all__ = ["SERPER_URL", "SerperBackend"]

SERPER_URL = "https://google.serper.dev"


class SerperBackend(KeyedBackend):
    """POST `{base_url}/search` with `{"q", "num"}` and the `X-API-KEY` header."""

    name = "serper"
    default_url = SERPER_URL

    def _search_once(self, query: str, n: int) -> list[SearchResult]:
        data = http_json(self.name, "POST", f"{self.base_url}/search", timeout_s=self.timeout_s,
                         json_body={"q": query, "num": n},
                         headers={"X-API-KEY": self._api_key, "Content-Type": "application/json"},
                         transport=self._transport)
        if not isinstance(data, dict):
            raise BackendError("`serper` reply is not a JSON object.", backend=self.name, transient=False)
        results: list[SearchResult] = []
        for item in data.get("organic") or []:
            if not isinstance(item, dict) or not item.get("link"):
                continue
            results.append(SearchResult(
                rank=len(results) + 1, title=str(item.get("title") or item["link"]), url=str(item["link"]),
                snippet=str(item.get("snippet") or ""), date=item.get("date") or None, source=self.name,
            ))
            if len(results) >= n:
                break
        return results
