"""The simulated model's reader of the sandbox atlas: search results, pages, infoboxes and lists,
read out of the tools' outputs.

The atlas itself (its data, page paths and URLs) is `sandbox.atlas`; this module only reads it
back the way a model would. Why a module of its own: the simulated model (manager, sub-agents,
single-agent baseline) and the sandbox solvability test read the same pages the same way, so the
parsing lives here once. Everything works on the *text* the `web_search`/`crawl_page` tools
return (which is also what a real model would see), never on the HTML files behind the corpus.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "ListEntry",
    "Observations",
    "clean_cell",
    "infobox",
    "list_entries",
    "plain_number",
    "title_name",
]

LINK = re.compile(r"\[([^\]]+)\]\((corpus://[^)\s]+)\)")
_INFOBOX_ROW = re.compile(r"^\|\s*(.+?)\s*\|\s*(.+?)\s*\|\s*$")
_RESULT = re.compile(r"^\s*\d+\. \[(?P<title>[^\]]+)\]\((?P<url>[^)\s]+)\)", re.MULTILINE)
_PAGE_HEAD = re.compile(r"^(?:Title: (?P<title>[^\n]*)\n)?URL: (?P<url>\S+)\n", re.MULTILINE)
_SEARCH_CALL = re.compile(
    r"""['"]name['"]:\s*['"]web_search['"],\s*['"]arguments['"]:\s*\{\s*['"]query['"]:\s*"""
    r"""(?P<q>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
)
_TITLE_SUFFIX = " — Sandbox Atlas"


@dataclass(frozen=True, kw_only=True)
class ListEntry:
    """One linked row of a list page's table: `| [name](url) | other | cells |`."""

    name: str
    url: str
    cells: tuple[str, ...]


def title_name(title: str) -> str:
    """`Argentina — Sandbox Atlas` → `Argentina` (other titles are returned unchanged)."""
    return title.removesuffix(_TITLE_SUFFIX).strip()


def clean_cell(text: str) -> str:
    """A table cell as plain text: markdown links become their label."""
    return LINK.sub(lambda m: m.group(1), text).strip()


def plain_number(text: str) -> str:
    """`44,494,502` → `44494502`; anything that is not a grouped number is returned unchanged."""
    stripped = text.strip()
    return stripped.replace(",", "") if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?|[+-]?\d+(\.\d+)?", stripped) else stripped


def list_entries(page_text: str) -> list[ListEntry]:
    """Every linked row of the tables on a list page, in page order."""
    rows = []
    for line in page_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = LINK.fullmatch(cells[0]) if cells and line.lstrip().startswith("|") else None
        if found:
            rows.append(ListEntry(name=found.group(1), url=found.group(2), cells=tuple(cells[1:])))
    return rows


def infobox(page_text: str) -> dict[str, str]:
    """The `| Attribute | Value |` rows of an entity page (first occurrence of each attribute wins)."""
    facts: dict[str, str] = {}
    for line in page_text.splitlines():
        found = _INFOBOX_ROW.match(line.strip())
        if found and not set(found.group(1)) <= {"-"}:
            facts.setdefault(found.group(1), found.group(2))
    return facts


@dataclass
class Observations:
    """What an agent has seen so far, parsed from its conversation (it keeps no other state).

    Why parse the conversation instead of keeping state in the model object: the simulated model
    must behave the same in-process and behind the loopback HTTP server, where the conversation
    is all a model ever receives.
    """

    searched: set[str] = field(default_factory=set)
    """Queries already sent to `web_search`."""
    results: dict[str, str] = field(default_factory=dict)
    """Search-result title (without the atlas suffix) → URL, first seen wins."""
    pages: dict[str, str] = field(default_factory=dict)
    """Crawled URL → page text."""

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Observations:
        """Read search calls, search results and crawled pages out of message texts."""
        obs = cls()
        for text in texts:
            for call in _SEARCH_CALL.finditer(text):
                try:
                    obs.searched.add(str(ast.literal_eval(call.group("q"))))
                except (ValueError, SyntaxError):
                    continue  # a query we cannot read back is simply searched again
            for hit in _RESULT.finditer(text):
                obs.results.setdefault(title_name(hit.group("title")), hit.group("url"))
            heads = list(_PAGE_HEAD.finditer(text))
            for k, head in enumerate(heads):
                end = heads[k + 1].start() if k + 1 < len(heads) else len(text)
                obs.pages.setdefault(head.group("url"), text[head.end() : end])
        return obs
