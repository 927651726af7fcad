"""The sub-agents' web: search backends, safe crawling, caching and local corpora.

Modules, by concern:

* `models`: `SearchResult` and `Page`, the one result shape of every backend and of crawls;
* `policy`: the URL policy (no loopback/private/metadata addresses, domain lists);
* `fetch`: httpx GET with timeouts, size cap, content-type check and a policy check per redirect hop;
* `main_text`: trafilatura main-text extraction to markdown, tables kept; titles; clipping to a budget;
* `cache`: the SQLite cache shared by threads and processes;
* `backends/`: `ddgs` (default), `searxng`, `serper`, `tavily`, `corpus`; remote ones rate-limited
  (`amapreduce.ratelimit`) and retried with backoff;
* `corpus`: local tantivy index of folders (`corpus://NAME/path` URLs);
* `service`: `WebService`, search + crawl with cache, policy and usage counts;
* `summarize`: optional query-focused extraction through a model;
* `tools`: the smolagents tools `web_search`, `crawl_page` and `build_web_tools(...)`.

`build_web_tools` and `WebService` are importable from here; they load lazily because the tools
module imports smolagents, which the CLI must not pay for at start-up.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WebService", "build_web_tools"]


def __getattr__(name: str) -> Any:
    if name == "build_web_tools":
        from amapreduce.web.tools import build_web_tools

        return build_web_tools
    if name == "WebService":
        from amapreduce.web.service import WebService

        return WebService
    raise AttributeError(f"module 'amapreduce.web' has no attribute {name!r}")
