"""Rows out of a sub-agent's final answer: parse JSON, keep only closed rows, project onto the columns.

A reply can end mid-way (a model's output limit, a cut stream, an oracle's `truncate` fault).
The rule: **a row counts only if its closing brace is in the text.** A cut string, number, key
or row is never completed into a value; the cells it would have filled stay missing, and the
engine asks for them again like any missing cell (`ParsedReply.truncated` lets it say why).

Parsing tries, in order (the steps of the one lenient reader of model JSON, `amapreduce._modeljson`,
with a cut reply read between its first two and json_repair given only closed values):

1. the value itself (smolagents hands back a list/dict when the model's tool call parsed);
2. strict `json.loads` of the text and of each fenced code block;
3. a **cut** JSON text (`partial`), i.e. one that is valid up to its end and ends inside a
   value: pydantic-core's `from_json(..., allow_partial="trailing-strings")` parses it from its
   first `[` or `{`. Every object off the path from the root to the cut is closed. On that
   path only the last element of the open rows list (the root list, or the list under the root
   object's last key) is in doubt: pydantic-core keeps even a just-opened object as an element,
   and JSON cannot tell a cut number `22` from a complete one. That element is kept only when
   appending nothing but the closers of the containers *above* it makes the text strictly valid
   JSON, which proves its own `}` is in the text; otherwise it is dropped with all it held. A
   root object that is itself the row is open, so it is dropped;
4. strict `json.loads` of the slice from the first `[` to the last `]`, then of the slice from
   the first `{` to the last `}` (prose around the JSON): a strictly valid slice ends at its own
   closing bracket, so every object in it is closed;
5. `json_repair`, for replies that are not JSON (single quotes, trailing commas, bare keys),
   only where its output is provably complete: on the reply's first bracket structure when it
   closes; otherwise on the text up to the last closed value after which only lists were open,
   with those lists closed. An open string, number, key or object never reaches json_repair,
   which would "complete" it (`'Krath'` for `'Krathbroville'`, `'22'` for `'221809361'`).

pydantic-core rather than hand-written heuristics: it is a real JSON parser (jiter) that knows
exactly where each string, number and container ends, decodes escapes and surrogates correctly
and keeps a cut structure position by position, so the one element the cut may have hit is
always the last one of its list. Regex slicing or brace counting would have to re-implement
JSON's lexing to tell a `}` in a string from a closer, or a cut number from a whole one. It
ships with pydantic, already a dependency.

When smolagents cannot parse a `final_answer` tool call's arguments (a cut call), it hands the
raw argument text over as the answer, e.g. `{"answer": [{"name": "Krath`; a list under a
wrapper key (`answer`, `rows`, ...) is found as in a whole reply, and a wrapper whose value is
a string holding a JSON text (cut or not) is parsed by the same rules.

Projection matches keys case- and space-insensitively (`Net Worth` fills `net_worth`) and turns
every value into a string. A row's `quotes` object gives each cell's evidence: column → a short
verbatim quote, or → `{"quote": ..., "source": URL}` when the cell comes from another page than
the row's `source`; a reply without it (the format before quotes) still parses, its cells simply
have no quote (`no_evidence`, see `mapreduce.evidence`). Nothing is ever invented: a key that is absent stays empty (the
reference copied matrix cells positionally into unrelated columns).

A reply is a model's text, so it is data, never trusted to be well formed: its rows are scrubbed
of unencodable code points (a lone surrogate escape such as `"\\ud83d"`, what a model writes when
it splits an emoji, decodes to a string no UTF-8 writer accepts) with `amapreduce._text`, and a
reply no parser can read (nesting deeper than the interpreter's recursion limit, a number beyond
`int`'s digit limit) is a parse error of that attempt, never an exception that ends the run.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_core import from_json

from amapreduce._modeljson import loads, repair, slices, whole_and_fenced
from amapreduce._text import MAX_CELL_CHARS, cap_text, one_line, scrub, scrub_data
from amapreduce.decision.columns import normalize_key_name
from amapreduce.table.evidence import Evidence

__all__ = [
    "ParsedReply",
    "ProjectedRow",
    "cell_text",
    "parse_reply",
    "project_row",
]

_LIST_WRAPPERS = ("rows", "results", "data", "items", "answer", "records", "table")
_TASK_KEYS = {normalize_key_name(k) for k in ("task", "task_id", "task_index", "task_number", "#")}
_SOURCE_KEYS = [normalize_key_name(k) for k in ("source", "source_url", "url", "sources", "reference", "evidence_url")]
_QUOTE_KEYS = {normalize_key_name(k) for k in ("quotes", "quote", "evidence")}
_OPENER = {"]": "[", "}": "{"}
_CUT_OFF = "the reply was cut off before its first complete row"
_TASK_DIGITS = 9
"""Longest task number read from a string (no batch holds a billion tasks)."""


@dataclass(frozen=True, kw_only=True)
class ParsedReply:
    """The JSON payload found in a reply, and how it was found."""

    rows: list[Mapping[str, Any]]
    """Objects found (a top-level list of objects, one object, or a list under `rows`/`results`)."""
    method: str
    """`object`, `json`, `fence`, `array_slice`, `object_slice`, `partial`, `json_repair`, or `none`."""
    error: str | None = None
    """Why nothing usable was found (None when rows were found)."""
    truncated: bool = False
    """The reply ended mid-way: `rows` are the objects closed before the cut, nothing after it."""


@dataclass(frozen=True, kw_only=True)
class ProjectedRow:
    """One reply object projected onto the output columns."""

    values: dict[str, str]
    """Column → string value ("" when absent)."""
    task: int | None = None
    """The sub-question number the row answers, when the sub-agent said so."""
    source: str | None = None
    """A source URL for the row, when given."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys that matched no column (kept in the trace)."""
    quotes: dict[str, str] = field(default_factory=dict)
    """Column → the verbatim quote the sub-agent gave for its value (absent: no quote)."""
    cell_sources: dict[str, str] = field(default_factory=dict)
    """Column → the URL of its quote, where it differs from the row's `source`."""
    evidence: dict[str, Evidence] = field(default_factory=dict)
    """Column → what checking its quote found (set by `mapreduce.evidence.with_evidence`)."""


def cell_text(value: Any) -> str:
    """Turn one JSON value into a table cell: one line (`amapreduce._text.one_line`: tabs and line
    breaks become a space, every other character, Unicode spaces included, stays as written).

    A value no cell can hold (nested deeper than the recursion limit, an integer beyond
    `str(int)`'s digit limit) is an empty cell: missing, and asked for again, never invented. A
    value longer than `MAX_CELL_CHARS` is cut with a marker (`_text.cap_text`).
    """
    try:
        return cap_text(scrub(_cell_text(value)), MAX_CELL_CHARS)
    except (RecursionError, ValueError):
        return ""


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        text = value
    elif isinstance(value, Sequence):
        text = ", ".join(_cell_text(v) for v in value if v is not None)
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return one_line(text)


def _nested_rows(payload: Mapping[str, Any], *, truncated: bool) -> ParsedReply | None:
    """Rows of a JSON text held as a string under a wrapper key (`{"answer": "[{...}]"}`)."""
    for key in _LIST_WRAPPERS:
        inner = payload.get(key)
        if isinstance(inner, str):
            nested = _parse_text(inner.strip())
            if nested.rows or nested.truncated:
                return replace(nested, truncated=truncated or nested.truncated)
    return None


def _rows_of(payload: Any, method: str, *, truncated: bool = False) -> ParsedReply | None:
    """The rows a parsed JSON value holds, or None when it holds none."""
    if isinstance(payload, Mapping):
        for key in _LIST_WRAPPERS:
            inner = payload.get(key)
            if isinstance(inner, list) and all(isinstance(x, Mapping) for x in inner):
                return ParsedReply(rows=list(inner), method=method, truncated=truncated)
        return _nested_rows(payload, truncated=truncated) or ParsedReply(
            rows=[payload], method=method, truncated=truncated
        )
    if isinstance(payload, list):
        objs = [x for x in payload if isinstance(x, Mapping)]
        if objs or not payload:
            return ParsedReply(rows=objs, method=method, truncated=truncated)
    return None


def _cut_rows(items: list[Any]) -> ParsedReply:
    """The reply's rows when it was cut: the objects among `items`, all closed in the text."""
    found = _rows_of(items, "partial", truncated=True)
    if found is None or not found.rows:
        return ParsedReply(rows=[], method="partial", error=_CUT_OFF, truncated=True)
    return found


def _closed_rows(cut: str, value: Any) -> ParsedReply:
    """The rows closed before the end of `cut`, a JSON text cut short that pydantic-core parsed
    (partially) to `value`.

    Everything off the path from the root to the cut is closed. On it, the rows list (the root
    list, or the list under the root object's last key) is open, and so may be its last element:
    that element is kept only when appending just the closers of the containers above it makes
    `cut` strictly valid JSON, which proves its own `}` is in the text."""
    completions: tuple[str, ...]
    key: str | None = None
    if isinstance(value, list):
        items, completions = value, ("]",)
    elif isinstance(value, Mapping):
        key = next((k for k in _LIST_WRAPPERS if isinstance(value.get(k), list)), None)
        if key is None:  # the root object is itself the open row, unless it wraps a JSON text
            return _nested_rows(value, truncated=True) or _cut_rows([])
        items = value[key]
        if list(value)[-1] != key:  # another key follows the list: the list was closed
            return _cut_rows(items)
        completions = ("}", "]}")
    else:
        return _cut_rows([])
    head = cut.rstrip().removesuffix(",")  # a comma after a value shows that the value ended
    for closers in completions:
        completed = loads(head + closers)
        if completed is not None:
            return _cut_rows(completed if key is None else completed[key])
    return _cut_rows(items[:-1])


def _partial(text: str) -> ParsedReply | None:
    """Rows of a JSON text that was cut short (from its first `[` or `{`), or None when the
    text holds no cut JSON."""
    for start in sorted(i for i in (text.find("["), text.find("{")) if i >= 0):
        cut = text[start:]
        if _ends_mid_json(cut):
            return _closed_rows(cut, from_json(cut, allow_partial="trailing-strings"))
    return None


def _ends_mid_json(text: str) -> bool:
    """True when `text` is valid JSON up to its end and ends inside a value. (In partial mode
    pydantic-core also accepts a complete value followed by anything, so the strict parse's
    error tells a cut from trailing text.)"""
    try:
        from_json(text)
    except ValueError as exc:
        return str(exc).startswith("EOF while parsing")
    return False


def _repairable(text: str) -> tuple[str, bool] | None:
    """The part of `text` json_repair may parse without finishing a cut value, and whether the
    text was cut; None when there is none.

    Scans from the first `[` or `{` (strings in either quote). A structure that closes is
    returned up to its end. Otherwise the text is taken up to the last closed value after which
    only lists were open, and those lists are closed: an open string, number, key or object
    never reaches json_repair."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        return None
    stack: list[str] = []
    quote, escaped = "", False
    closed: str | None = None
    for end in range(start, len(text)):
        char = text[end]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "[{":
            stack.append(char)
        elif char in "]}":
            if not stack or stack.pop() != _OPENER[char]:
                break
            if not stack:
                return text[start : end + 1], False
            if "{" not in stack:
                closed = text[start : end + 1] + "]" * len(stack)
    return None if closed is None else (closed, True)


def _repaired(text: str) -> ParsedReply | None:
    """Rows of a reply that is not JSON (single quotes, trailing commas, bare keys), by
    json_repair, where its output is provably complete (see `_repairable`)."""
    repairable = _repairable(text)
    if repairable is None:
        return None
    candidate, cut = repairable
    found = _rows_of(repair(candidate), "json_repair", truncated=cut)
    return found if found is not None and found.rows else None


def _strict(candidates: list[tuple[str, str]]) -> ParsedReply | None:
    """Rows of the first (method, text) candidate that is valid JSON holding rows."""
    for method, candidate in candidates:
        found = _rows_of(loads(candidate), method)
        if found is not None:
            return found
    return None


def _parse_text(text: str) -> ParsedReply:
    if not text:
        return ParsedReply(rows=[], method="none", error="the reply was empty")
    found = _strict(whole_and_fenced(text)) or _partial(text) or _strict(slices(text)) or _repaired(text)
    if found is not None:
        return found
    return ParsedReply(
        rows=[], method="none", error=f"no JSON array of objects found in the reply ({text[:80]!r}…)"
    )


def parse_reply(reply: Any) -> ParsedReply:
    """Find the JSON rows in a sub-agent's final answer; of a reply cut short, only its closed rows.

    Never raises: a reply that cannot be read is a `ParsedReply` with an `error` (the attempt
    failed; the engine asks again). Every string in the rows is scrubbed (`amapreduce._text`).
    """
    try:
        found = _parse(reply)
        return replace(found, rows=[scrub_data(dict(row)) for row in found.rows])
    except (RecursionError, ValueError) as exc:
        why = "it is nested too deeply" if isinstance(exc, RecursionError) else scrub(str(exc)).split(";")[0]
        return ParsedReply(rows=[], method="none", error=f"the reply cannot be read as JSON rows: {why}")


def _parse(reply: Any) -> ParsedReply:
    if isinstance(reply, Mapping | list):
        found = _rows_of(reply, "object")
        if found is not None:
            return found
    return _parse_text((reply if isinstance(reply, str) else str(reply)).strip())


def _task_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        digits = value.strip().lstrip("#").strip()
        # `"²".isdigit()` is True but `int("²")` raises (other scripts' decimal digits, `"٣"`, read
        # fine); and a task number is short, far from `int()`'s digit limit.
        if digits.isdigit() and len(digits) <= _TASK_DIGITS:
            with contextlib.suppress(ValueError):
                return int(digits)
    return None


def project_row(obj: Mapping[str, Any], columns: Sequence[str]) -> ProjectedRow:
    """Project one reply object onto `columns` (case/space-insensitive key match)."""
    wanted = {normalize_key_name(c): c for c in columns}
    values = dict.fromkeys(columns, "")
    task: int | None = None
    sources: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    quoted: Mapping[str, Any] = {}
    for key, value in obj.items():
        folded = normalize_key_name(str(key))
        if folded in wanted:
            column = wanted[folded]
            if not values[column]:
                values[column] = cell_text(value)
        elif folded in _TASK_KEYS:
            task = _task_number(value)
        elif folded in _SOURCE_KEYS:
            sources[folded] = value
        elif folded in _QUOTE_KEYS and isinstance(value, Mapping):
            quoted = value
        else:
            extra[str(key)] = value
    source = None
    for key in _SOURCE_KEYS:
        if key in sources:
            raw = sources[key]
            first = raw[0] if isinstance(raw, list) and raw else raw
            source = cell_text(first) or None
            break
    quotes, cell_sources = _quotes(quoted, wanted)
    return ProjectedRow(values=values, task=task, source=source, extra=extra, quotes=quotes, cell_sources=cell_sources)


def _quotes(quoted: Mapping[str, Any], wanted: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(column → quote, column → quote URL) of a row's `quotes` object; keys matching no column
    and empty quotes are ignored."""
    quotes: dict[str, str] = {}
    cell_sources: dict[str, str] = {}
    for key, value in quoted.items():
        column = wanted.get(normalize_key_name(str(key)))
        if column is None:
            continue
        url: Any = None
        if isinstance(value, Mapping):
            folded = {normalize_key_name(str(k)): v for k, v in value.items()}
            url = next((folded[k] for k in _SOURCE_KEYS if k in folded), None)
            value = folded.get("quote", folded.get("text"))
        text = cell_text(value)
        if text:
            quotes[column] = text
            if url is not None and cell_text(url):
                cell_sources[column] = cell_text(url)
    return quotes, cell_sources
