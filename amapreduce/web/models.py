"""The data shapes every search backend and the crawler return.

Why one shape: sub-agents, the CLI's `--json` output and the cache all see the same fields, so a
backend can be swapped without anything downstream noticing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Page", "SearchResult"]


class SearchResult(BaseModel):
    """One hit of a `web_search`, best first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=1)
    """1 for the best hit."""
    title: str
    url: str
    snippet: str = ""
    date: str | None = None
    """Publication date when the backend knows it (free text, as the backend gives it)."""
    source: str | None = None
    """The backend that produced the hit, e.g. `ddgs` or `corpus:sandbox`."""


class Page(BaseModel):
    """The main text of one crawled page."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    """The URL that was asked for."""
    final_url: str
    """The URL after redirects (equal to `url` when none)."""
    title: str = ""
    text: str
    """Main text as markdown (tables kept), truncated to the character budget."""
    content_type: str = ""
    truncated: bool = False
    """True when `text` was cut to the budget."""
