"""The sub-agents' smolagents tools, `web_search` and `crawl_page`, and their factory.

Why errors become a `ToolError`: smolagents shows a tool's exception to the model as the
observation (`ToolCallRefused: ...` or `ToolCallFailed: ...`), so every failure reaches the model
as one line saying what went wrong and what to try instead, and the agent keeps going. A call the
tool turns away (an empty query, a refused URL) is a `ToolCallRefused`; a valid call whose work
fails (network down, missing page, backend error) is a `ToolCallFailed`.

Why a run-stopping error is not: once the search backend's circuit breaker gives up
(`SearchUnavailable`), or the budget is spent, or a provider is down, no later call can succeed,
and a model told "try again" would spend every remaining step on the same error (an `ask` against
an unreachable backend once spent 31 manager steps on one DNS error). These errors (`RUN_STOPPING`)
leave the tool as they are, so the agent that called it stops (`agents.manager` ends its run) and
the run ends with that one-line reason.

Why the arguments and the output are scrubbed (`amapreduce._text.scrub`): both are outside text.
A model's arguments may carry a lone surrogate (`"\\ud83d"` in its tool call), and a search
backend's JSON answer may too; either would fail the request body or a writer later.

Why the tools record what they fetched (`table.evidence.record_fetched`): a cell's quote is
checked against the text its URL really gave in the attempt that wrote it (a page's main text,
whole even when the model read a focused extract of it; a search result's title and snippet), never
against what the model says it read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from smolagents import Tool

from amapreduce._text import scrub
from amapreduce.errors import (
    AmapreduceError,
    BudgetExceeded,
    ProviderUnavailable,
    ToolCallFailed,
    ToolCallRefused,
    ToolError,
    UserError,
)
from amapreduce.table.evidence import record_fetched
from amapreduce.web.models import SearchResult
from amapreduce.web.service import MAX_RESULTS, WebService
from amapreduce.web.summarize import focused_extract

if TYPE_CHECKING:
    from smolagents import Model

    from amapreduce.settings import Settings

__all__ = ["RUN_STOPPING", "CrawlPageTool", "WebSearchTool", "build_web_tools", "format_results"]

RUN_STOPPING: tuple[type[AmapreduceError], ...] = (BudgetExceeded, ProviderUnavailable)
"""Errors the tools raise as they are, never as a `ToolError` (`ProviderUnavailable` covers
`SearchUnavailable`): the errors that stop a run (`mapreduce.result.RUN_STOPPING_ERRORS`)."""


def format_results(query: str, results: list[SearchResult]) -> str:
    """Results as the model reads them: `N. [title](url)`, an optional date line, the snippet."""
    if not results:
        return f"No results found for {query!r}. Try a more general query."
    blocks = []
    for r in results:
        lines = [f"{r.rank}. [{r.title}]({r.url})"]
        if r.date:
            lines.append(f"   Date published: {r.date}")
        if r.snippet:
            lines.append(f"   {r.snippet}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _as_tool_error(exc: AmapreduceError) -> ToolError:
    """`exc` as the model should read it: bad arguments are refused, anything else failed."""
    if isinstance(exc, ToolError):
        return exc
    kind = ToolCallRefused if isinstance(exc, UserError) else ToolCallFailed
    return kind(str(exc), cause=type(exc).__name__)


class WebSearchTool(Tool):  # type: ignore[misc,unused-ignore]  # smolagents may be untyped
    """`web_search(query, n)`: ranked results from the run's search backend."""

    name = "web_search"
    description = (
        "Search the web. Returns a numbered list of results, best first, each as [title](url) with a "
        "snippet. Use 3-10 descriptive words; then read promising pages with crawl_page."
    )
    inputs = {
        "query": {"type": "string", "description": "What to search for, in natural words."},
        "n": {"type": "integer", "description": f"How many results (1-{MAX_RESULTS}, default 5).", "nullable": True},
    }
    output_type = "string"

    def __init__(self, service: WebService, default_n: int = 5) -> None:
        super().__init__()
        self.service = service
        self.default_n = default_n

    def forward(self, query: str, n: int | None = None) -> str:
        query = scrub(query) if isinstance(query, str) else query
        try:
            results = self.service.search(query, int(n) if n else self.default_n)
        except RUN_STOPPING:
            raise
        except AmapreduceError as exc:
            raise _as_tool_error(exc) from exc
        for r in results:
            record_fetched(f"{r.title}\n{r.snippet or ''}", r.url)
        return scrub(format_results(query, results))


class CrawlPageTool(Tool):  # type: ignore[misc,unused-ignore]  # smolagents may be untyped
    """`crawl_page(url, query)`: the main text of a page, optionally focused on a query by a model."""

    name = "crawl_page"
    description = (
        "Read a web page (an http(s) URL or a corpus:// URL from web_search) and return its main text as "
        "markdown, tables kept. Give `query` to get only the parts relevant to it."
    )
    inputs = {
        "url": {"type": "string", "description": "The page URL, as returned by web_search."},
        "query": {"type": "string", "description": "What you look for on the page (optional).", "nullable": True},
    }
    output_type = "string"

    def __init__(
        self,
        service: WebService,
        *,
        max_chars: int = 20_000,
        model: Model | None = None,
        focused: bool = True,
        max_words: int = 500,
    ) -> None:
        super().__init__()
        self.service = service
        self.max_chars = max_chars
        self.model = model
        self.focused = focused
        self.max_words = max_words

    def forward(self, url: str, query: str | None = None) -> str:
        url = scrub(url) if isinstance(url, str) else url
        query = scrub(query) if isinstance(query, str) else query
        try:
            page = self.service.crawl(url, self.max_chars)
        except RUN_STOPPING:
            raise
        except AmapreduceError as exc:
            raise _as_tool_error(exc) from exc
        record_fetched(f"{page.title or ''}\n{page.text}", url, page.final_url)
        if self.model is not None and self.focused and query and query.strip():
            return scrub(
                focused_extract(self.model, query.strip(), page.final_url, page.text, max_words=self.max_words)
            )
        title = f"Title: {page.title}\n" if page.title else ""
        return scrub(f"{title}URL: {page.final_url}\n\n{page.text}")


def build_web_tools(
    settings: Settings | None = None,
    *,
    service: WebService | None = None,
    backend: str | None = None,
    model: Model | None = None,
    focused_extraction: bool = True,
    **service_kwargs: Any,
) -> list[Tool]:
    """The `[web_search, crawl_page]` tools a search sub-agent gets.

    Share one `service` between all sub-agents of a run so they share the rate limiter, the cache
    and the usage counts (`service.usage()`).

    Args:
        settings: run settings (default backend, cache, URL policy, crawl budget); defaults when None.
        service: an existing service; built from `settings` when None.
        backend: backend spec overriding `settings.search_backend`.
        model: model for query-focused page extraction; None turns it off.
        focused_extraction: False turns focused extraction off even with a model.
        **service_kwargs: forwarded to `WebService.from_settings` (e.g. `corpora`).
    """
    from amapreduce.settings import Settings as _Settings

    cfg = settings or _Settings()
    svc = service or WebService.from_settings(cfg, backend=backend, **service_kwargs)
    return [
        WebSearchTool(svc),
        CrawlPageTool(svc, max_chars=cfg.crawl_max_chars, model=model, focused=focused_extraction),
    ]
