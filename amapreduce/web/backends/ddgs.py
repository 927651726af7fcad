"""`ddgs` backend: the free default (DuckDuckGo and friends through the `ddgs` library, no key)."""

from __future__ import annotations

from typing import Any

from amapreduce.web.backends.base import BackendError, RemoteBackend
from amapreduce.web.models import SearchResult

__all__ = ["DdgsBackend"]


class DdgsBackend(RemoteBackend):
    """Search through `ddgs.DDGS().text(...)`.

    Args:
        region: ddgs region code, e.g. `us-en`, `wt-wt` (no region).
        **kwargs: rate-limit and retry options of `RemoteBackend`.
    """

    name = "ddgs"

    def __init__(self, *, region: str = "us-en", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.region = region

    def _search_once(self, query: str, n: int) -> list[SearchResult]:
        from ddgs import DDGS
        from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

        try:
            raw = DDGS(timeout=int(max(1, self.timeout_s))).text(query, max_results=n, region=self.region)
        except RatelimitException as exc:
            raise BackendError(f"`ddgs` is rate-limited: {exc}. Wait a minute or choose another backend.",
                               backend=self.name, transient=True) from exc
        except TimeoutException as exc:
            raise BackendError(f"`ddgs` timed out: {exc}. Try again later.",
                               backend=self.name, transient=True, outage=True) from exc
        except DDGSException as exc:
            if _is_no_results(exc):
                return []
            # Every engine failed (offline, DNS): an outage for the breaker. A rate limit is not one.
            raise BackendError(
                f"`ddgs` search failed: {exc}. Check the network, or use `--search corpus:INDEX` offline.",
                backend=self.name, transient=True, outage=True,
            ) from exc
        results: list[SearchResult] = []
        for item in raw or []:
            url = str(item.get("href") or item.get("url") or "")
            if not url:
                continue
            results.append(SearchResult(
                rank=len(results) + 1, title=str(item.get("title") or url), url=url,
                snippet=str(item.get("body") or ""), date=item.get("date") or None, source=self.name,
            ))
            if len(results) >= n:
                break
        return results


def _is_no_results(exc: Exception) -> bool:
    """Whether ddgs reports a plain empty result rather than a failure.

    Why this is exact: ddgs 9.x ends a search with `raise DDGSException(err or "No results found.")`,
    where `err` is the last engine's exception. Only when no engine failed is the argument that
    literal string; with a failure (DNS, network) the argument is the exception itself, which is
    a real error and stays transient. An empty result must not be retried or reported as an outage.
    """
    from ddgs.exceptions import DDGSException

    return type(exc) is DDGSException and exc.args == ("No results found.",)
