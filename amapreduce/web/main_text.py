"""A page's main text: HTML to markdown with tables kept (via trafilatura), its title, its clip.

Why trafilatura: it drops navigation, footers and boilerplate and keeps tables as markdown, so a
sub-agent reads facts instead of menus. Its thresholds are lowered here because infobox-style
pages are short and would otherwise fall back to a flat text dump that loses the table.
trafilatura is imported inside the functions (it costs ~0.2 s) to keep the CLI start fast.

A page is outside text: a server may declare any charset, `unicode_escape` included, which turns
`\\ud800` in its bytes into a lone surrogate. The title and text are scrubbed
(`amapreduce._text.scrub`) before they reach a cache, a prompt or a trace.
"""

from __future__ import annotations

import functools
import re
from configparser import ConfigParser
from pathlib import PurePosixPath
from typing import NamedTuple

from amapreduce._text import scrub

__all__ = ["EXTRACTOR_VERSION", "ClippedText", "Extracted", "clip_page_text", "extract_main_text", "title_of"]

EXTRACTOR_VERSION = "2"
"""Bumped whenever extraction output changes, so derived indexes (the sandbox's) are rebuilt."""

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TITLE_TAG = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_H1_TAG = re.compile(rb"<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<[^>]+>")
_MD_ESCAPES = re.compile(r"\\([_*])")
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/xml", "application/xml"})


class Extracted(NamedTuple):
    """Title and markdown main text of one document."""

    title: str
    text: str


class ClippedText(NamedTuple):
    """A page's text cut to a character budget, and whether anything was cut."""

    text: str
    truncated: bool


@functools.lru_cache(maxsize=1)
def _config() -> ConfigParser:
    from trafilatura.settings import use_config

    config = use_config()
    # Short infobox pages are real content; the defaults (250/1 chars) would discard them.
    config.set("DEFAULT", "MIN_EXTRACTED_SIZE", "20")
    config.set("DEFAULT", "MIN_OUTPUT_SIZE", "1")
    config.set("DEFAULT", "MIN_OUTPUT_COMM_SIZE", "1")
    config.set("DEFAULT", "EXTRACTION_TIMEOUT", "0")  # signal-based timeouts break in worker threads
    return config


def _decode(body: bytes | str, encoding: str | None) -> str:
    if isinstance(body, str):
        return body
    for enc in (encoding, "utf-8"):
        if enc:
            try:
                return body.decode(enc)
            except (LookupError, UnicodeDecodeError):
                continue
    return body.decode("utf-8", errors="replace")


def _html_title(raw: bytes, encoding: str | None) -> str:
    import html

    for pattern in (_TITLE_TAG, _H1_TAG):
        found = pattern.search(raw)
        if found:
            chunk = found.group(1)
            try:
                decoded = chunk.decode(encoding or "utf-8")
            except (LookupError, UnicodeDecodeError):
                decoded = chunk.decode("cp1252", errors="replace")  # the usual legacy web charset
            text = html.unescape(_TAGS.sub("", decoded))
            text = " ".join(text.split())
            if text:
                return text
    return ""


def title_of(text: str, fallback: str) -> str:
    """The first markdown heading of `text`, else `fallback` (the file name)."""
    heading = _HEADING.search(text)
    return heading.group(1).strip()[:200] if heading else fallback


def extract_main_text(
    body: bytes | str, content_type: str, *, url: str | None = None, encoding: str | None = None
) -> Extracted:
    """Extract (title, markdown main text) from a document.

    HTML goes through trafilatura (markdown, tables and links kept); plain text and markdown
    pass through unchanged. The title is the HTML `<title>`, else the first `<h1>`/heading,
    else the last path segment of `url` (the file name).
    """
    name = PurePosixPath(url or "").name if url else ""
    if content_type not in _HTML_TYPES:
        text = scrub(_decode(body, encoding).strip())
        return Extracted(scrub(title_of(text, name)), text)
    import trafilatura

    raw = body if isinstance(body, bytes) else body.encode("utf-8")
    # Without a declared charset, trafilatura gets the bytes and detects it (<meta charset> ...).
    html_text: bytes | str = _decode(body, encoding) if encoding or isinstance(body, str) else body
    extracted: str | None = trafilatura.extract(
        html_text,
        url=url,
        output_format="markdown",
        include_tables=True,
        include_links=True,
        include_comments=False,
        favor_recall=True,
        config=_config(),
    )
    text = (extracted or trafilatura.html2txt(html_text) or "").strip()
    # trafilatura's markdown escapes `_` and `*` (`America/Sao\_Paulo`); a model would copy the
    # backslash into its answer, so they are unescaped. `\|` stays: it keeps table cells intact.
    text = scrub(_MD_ESCAPES.sub(r"\1", text))
    title = _html_title(raw, encoding) or title_of(text, name)
    return Extracted(scrub(title), text)


def clip_page_text(text: str, max_chars: int) -> ClippedText:
    """`text` cut to `max_chars` at a line or word boundary when one is near, marked `...(truncated)`."""
    if len(text) <= max_chars:
        return ClippedText(text, truncated=False)
    cut = text[:max_chars]
    boundary = max(cut.rfind("\n"), cut.rfind(" "))
    if boundary > max_chars * 0.8:
        cut = cut[:boundary]
    return ClippedText(cut.rstrip() + "\n...(truncated)", truncated=True)
