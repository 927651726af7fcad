"""Evidence of a cell: is its quote on the page its sub-agent read, and is its value in the quote?

Why: wide-search answers fail mostly by plausible wrong values, and a sub-agent's claimed source
URL proves nothing by itself. So each cell carries a short verbatim quote, and code (never a
model) checks it against the text the web tools really fetched for that URL during the attempt
that produced the cell. A cell's evidence is

* `verified`: the quote occurs in that text and the cell's value (or its number) in the quote;
* `unverified`: a quote was given, but it is not in the text fetched for its URL in that attempt
  (made up, or from a page not read), or the value is not in it;
* `no_evidence`: no quote (an old reply format, a forced task-matrix cell, checking turned off).

Matching is on normalised text (Unicode NFKC, casefold, typographic quotes and dashes made plain,
whitespace runs collapsed) with numbers compared as numbers (`1,234.50` = `1234.5`), and a quote
that starts or ends with a digit must not be part of a longer number (`12` is not in `123`).

Why here, in the table layer: both the web tools (which record what they fetched) and the engine
(which checks the quotes) sit above it and may not import each other. The record is a context
variable holding a `FetchedPages`, set around one attempt (`recording`); the engine runs each
attempt in a copy of the submitting context and smolagents runs parallel tool calls in copies of
the agent's, so every tool call of an attempt, and only those, reaches that attempt's record.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import StrEnum

__all__ = [
    "Evidence",
    "FetchedPages",
    "check_evidence",
    "normalize_quote",
    "quote_in_text",
    "record_fetched",
    "recording",
    "url_key",
    "value_in_quote",
]

class Evidence(StrEnum):
    """What the check of a cell's quote found."""

    VERIFIED = "verified"
    UNVERIFIED = "unverified"
    NO_EVIDENCE = "no_evidence"


_PLAIN = str.maketrans({"‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"', "–": "-", "—": "-",
                        "−": "-", "‐": "-", "‑": "-"})
_SPACES = re.compile(r"\s+")
_NUMBER = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d])|(?<![\d.,])\d+(?:\.\d+)?(?![\d])")
_VALUE_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_NUMBER_DECOR = re.compile(r"[\s$€£¥%+]|\b(?:usd|eur|gbp)\b")


def _canonical_number(match: re.Match[str]) -> str:
    """`1,234.50` → `1234.5`, `7.0` → `7`: one spelling per number."""
    whole, _, fraction = match.group(0).replace(",", "").partition(".")
    fraction = fraction.rstrip("0")
    return (whole.lstrip("0") or "0") + (f".{fraction}" if fraction else "")


def normalize_quote(text: str) -> str:
    """`text` as quotes are compared: NFKC, casefold, plain quotes and dashes, one space for any
    whitespace run, numbers in one spelling."""
    folded = unicodedata.normalize("NFKC", text).casefold().translate(_PLAIN)
    return _NUMBER.sub(_canonical_number, _SPACES.sub(" ", folded).strip())


def _contains(haystack: str, needle: str) -> bool:
    """`needle` in `haystack` (both normalised), not as a part of a longer number."""
    if not needle:
        return False
    before = r"(?<![\d.])" if needle[0].isdigit() else ""
    after = r"(?![\d]|\.\d)" if needle[-1].isdigit() else ""
    return re.search(before + re.escape(needle) + after, haystack) is not None


def quote_in_text(quote: str, text: str) -> bool:
    """Whether `quote` occurs in `text`, after normalisation (see the module docstring)."""
    return _contains(normalize_quote(text), normalize_quote(quote))


def value_in_quote(value: str, quote: str) -> bool:
    """Whether the cell's `value` is stated by `quote`: as text, or, when the value is a number
    (currency signs, percent and spaces aside), as that number."""
    said = normalize_quote(quote)
    if _contains(said, normalize_quote(value)):
        return True
    bare = _NUMBER_DECOR.sub("", unicodedata.normalize("NFKC", value).casefold())
    if not _VALUE_NUMBER.fullmatch(bare):
        return False
    return _contains(said, normalize_quote(bare.lstrip("+-")))


def url_key(url: str) -> str:
    """A URL as fetched pages are looked up: no fragment, no trailing slash, case-folded host."""
    base = url.strip().split("#", 1)[0].rstrip("/")
    scheme, sep, rest = base.partition("://")
    if not sep:
        return base
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}://{host.lower()}{slash}{path}"


class FetchedPages:
    """The text the web tools fetched during one attempt, by URL (thread-safe: an agent may run
    its tool calls in parallel). Normalised once per text, when first checked against."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._texts: dict[str, list[str]] = {}
        self._normalised: dict[str, list[str]] = {}

    def add(self, url: str, text: str) -> None:
        """Record that `text` was fetched for `url`."""
        if not url or not text:
            return
        with self._lock:
            self._texts.setdefault(url_key(url), []).append(text)
            self._normalised.pop(url_key(url), None)

    def urls(self) -> list[str]:
        """The URLs recorded, in first-fetch order (normalised by `url_key`)."""
        with self._lock:
            return list(self._texts)

    def _texts_of(self, url: str | None) -> list[str]:
        with self._lock:
            keys = [url_key(url)] if url else list(self._texts)
            out: list[str] = []
            for key in keys:
                if key not in self._normalised and key in self._texts:
                    self._normalised[key] = [normalize_quote(t) for t in self._texts[key]]
                out += self._normalised.get(key, [])
            return out

    def contains(self, quote: str, url: str | None) -> bool:
        """Whether `quote` occurs in a text fetched for `url` (None: for any URL of the attempt)."""
        needle = normalize_quote(quote)
        return any(_contains(text, needle) for text in self._texts_of(url))


def check_evidence(value: str, quote: str | None, url: str | None, pages: FetchedPages) -> Evidence:
    """The evidence of a cell holding `value`, quoted as `quote` from `url` (None: any page the
    attempt fetched), against the attempt's `pages`."""
    if not quote or not quote.strip():
        return Evidence.NO_EVIDENCE
    if value_in_quote(value, quote) and pages.contains(quote, url):
        return Evidence.VERIFIED
    return Evidence.UNVERIFIED


_RECORD: ContextVar[FetchedPages | None] = ContextVar("amapreduce_fetched_pages", default=None)


@contextmanager
def recording(pages: FetchedPages) -> Iterator[FetchedPages]:
    """Record into `pages` what the web tools fetch in this block (and in contexts copied from it)."""
    token = _RECORD.set(pages)
    try:
        yield pages
    finally:
        _RECORD.reset(token)


def record_fetched(text: str, *urls: str | None) -> None:
    """Record `text` as fetched for each of `urls` (a redirect's request and final URL) into the
    open `recording`, if any (outside an attempt, a tool call is simply not recorded)."""
    pages = _RECORD.get()
    if pages is not None:
        for url in dict.fromkeys(u for u in urls if u):
            pages.add(url, text)
