"""Text from outside (models, tools, users, files) made safe to store and print.

A Python `str` can hold code points that no UTF-8 writer accepts: lone surrogates
(`"\\ud83d"`, what a model emits when it splits an emoji in two, or what `json.loads` makes of
`"\\ud800"`). One such character used to end a run when the trace writer, a table file or the
console tried to encode it. Every boundary where outside text enters (a sub-agent's reply, a
decision file, a memory import, an answer file) passes it through `scrub`/`scrub_data` once, so
the layers above only ever hold encodable text.

Kept here rather than in a library: the standard codecs already do the work (UTF-16 with
`surrogatepass` re-pairs a split pair, `replace` turns a lone half into U+FFFD); this module
only names that recipe once and walks JSON-shaped data.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_CELL_CHARS", "REPLACEMENT", "cap_text", "is_clean", "one_line", "scrub", "scrub_data"]

MAX_CELL_CHARS = 4_000
"""Longest table cell, in a decision's `task_matrix` and in a sub-agent's reply: a longer one is cut
with a marker (`cap_text`). A cell is an entity's name or one attribute's value; a 50 MB cell used to
be sent to the model as it was, in every prompt that named its task."""

REPLACEMENT = "\ufffd"
"""What an unencodable code point becomes (the Unicode replacement character)."""
_LINE_BREAKS = re.compile(r"[ ]*[\t\n\v\f\r\x1c-\x1e\x85\u2028\u2029]+[ ]*")
"""A run of what a one-line cell cannot hold: tab and every character `str.splitlines` breaks
at (newline, carriage return, the other line and paragraph separators), with the ASCII spaces
around it."""


def is_clean(text: str) -> bool:
    """True when `text` encodes as UTF-8 as it is (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def scrub(text: str) -> str:
    """`text` with surrogate pairs joined and every lone surrogate replaced by U+FFFD.

    Clean text is returned unchanged (the same object), so calling this on every value costs one
    encode attempt.
    """
    if is_clean(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def scrub_data(value: Any) -> Any:
    """A copy of JSON-shaped `value` (dicts, lists, tuples, strings) with every string scrubbed.

    Dict keys are scrubbed too; other values (numbers, None, objects) pass through unchanged.
    """
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(k) if isinstance(k, str) else k: scrub_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_data(v) for v in value]
    return value


def one_line(text: str) -> str:
    """`text` as one table cell: each run of tabs and line breaks (with the ASCII spaces around it)
    becomes one space, and ASCII spaces at either end go. Every other character stays as written:
    an ideographic space (U+3000), an en space (U+2002) or a no-break space (U+00A0) is part of
    the value (the official scorer removes only ASCII spaces, so rewriting one changes a key)."""
    return _LINE_BREAKS.sub(" ", text).strip(" ")


def cap_text(text: str, limit: int, *, what: str = "characters") -> str:
    """`text` cut to its first `limit` characters plus a marker saying how much was cut
    (`… [cut: N more characters]`); `text` itself when it is not longer than `limit`."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text) - limit} more {what}]"
