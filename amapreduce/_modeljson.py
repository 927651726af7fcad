"""JSON out of a model's reply, read leniently: the one parser of model JSON.

A model asked for JSON answers with JSON, with JSON in a fenced block, with JSON inside prose, or
with almost-JSON (single quotes, trailing commas, bare keys). Every reader of such replies (the
sub-agents' rows in `mapreduce.replies`, discovery's merge groups in `mapreduce.merge`, the
scorer's judges in `evaluation.judges`) reads them through here, so "lenient" means one thing:

1. strict `json.loads` of the whole text, then of each fenced code block (`whole_and_fenced`);
2. strict `json.loads` of the slice from the first `[` to the last `]`, then of the slice from
   the first `{` to the last `}` (`slices`): prose around the JSON;
3. `json_repair` (`repair`), the last resort, which turns almost any text into some value.

`read_json` runs the three steps and returns the first value its caller accepts. A reader with
rules of its own composes the steps itself: `mapreduce.replies` reads a reply that was cut short
between steps 1 and 2 and hands json_repair only text whose values are all closed. The scorers'
"last ```` ```json ```` object" readings, which published numbers depend on, are
`last_json_object`.

`json_repair` is imported only when a reply needs it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

__all__ = ["FENCE", "last_json_object", "loads", "read_json", "repair", "slices", "whole_and_fenced"]

FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
"""A fenced code block, any language tag; group 1 is its content."""
_JSON_OBJECT_FENCE = re.compile(r"```json\s*(\{.*?\})\s*```", re.DOTALL)
"""The official WideSearch scorer's `parse_markdown_json` pattern: a ```` ```json ```` block holding `{...}`."""


def loads(text: str) -> Any | None:
    """`json.loads(text)`, or None when `text` is not JSON (or holds a number beyond `int`'s
    digit limit).

    Raises:
        RecursionError: `text` is nested deeper than the interpreter allows. Propagated so that a
            reader can tell "too deep" from "not JSON"; `read_json` and `last_json_object` take it
            as "not JSON".
    """
    try:
        return json.loads(text)
    except ValueError:
        return None


def _loads_quietly(text: str) -> Any | None:
    try:
        return loads(text)
    except RecursionError:
        return None


def whole_and_fenced(text: str) -> list[tuple[str, str]]:
    """Step 1's candidates: `("json", text)`, then `("fence", content)` for each fenced block."""
    return [("json", text)] + [("fence", block.strip()) for block in FENCE.findall(text)]


def slices(text: str) -> list[tuple[str, str]]:
    """Step 2's candidates: `("array_slice", ...)` from the first `[` to the last `]`, then
    `("object_slice", ...)` from the first `{` to the last `}` (each only where both are there)."""
    found: list[tuple[str, str]] = []
    if "[" in text and "]" in text:
        found.append(("array_slice", text[text.index("[") : text.rindex("]") + 1]))
    if "{" in text and "}" in text:
        found.append(("object_slice", text[text.index("{") : text.rindex("}") + 1]))
    return found


def repair(text: str) -> Any | None:
    """`json_repair`'s reading of almost-JSON `text`; None when it finds nothing (it makes an empty
    string of text with no JSON in it) or gives up."""
    import json_repair

    try:
        value = json_repair.loads(text)
    except (ValueError, RecursionError):
        return None
    return None if value == "" else value


def _anything(_: Any) -> bool:
    return True


def read_json(text: str, *, accept: Callable[[Any], bool] = _anything) -> Any | None:
    """The JSON value in a model's reply: the first value of steps 1, 2 and 3 (see the module
    doc) that is not None and that `accept` takes; None when there is none. Never raises."""
    text = text.strip()
    for _, candidate in whole_and_fenced(text) + slices(text):
        value = _loads_quietly(candidate)
        if value is not None and accept(value):
            return value
    value = repair(text)
    return value if value is not None and accept(value) else None


def last_json_object(text: str, *, lenient: bool = False) -> dict[str, Any] | None:
    """The object of the last ```` ```json {...} ```` block of a reply (the official WideSearch
    scorer's `parse_markdown_json`); None when there is none or it is not an object.

    Args:
        text: the reply.
        lenient: read as the AMapReduce DeepWideSearch copy does: each such block from the last
            back, then each raw `{...}` of the text from the last `{` back; the first that decodes
            to an object wins.
    """
    blocks = _JSON_OBJECT_FENCE.findall(text)
    for block in reversed(blocks) if lenient else blocks[-1:]:
        value = _loads_quietly(block)
        if isinstance(value, dict):
            return value
    if not lenient:
        return None
    decoder = json.JSONDecoder()
    start = text.rfind("{")
    while start != -1:
        try:
            found, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            found = None
        if isinstance(found, dict):
            return found
        start = text.rfind("{", 0, start)
    return None
