"""Rows out of a sub-agent's final answer: parse JSON robustly, project onto the columns.

Parsing tries, in order: the value itself (smolagents may hand back a list/dict), a direct
`json.loads`, each fenced code block, the slice from the first `[` to the last `]`, the slice
from the first `{` to the last `}`, and finally `json_repair`. Projection matches keys case-
and space-insensitively (`Net Worth` fills `net_worth`) and turns every value into a string.
Nothing is ever invented: a key that is absent stays empty (the reference copied matrix cells
positionally into unrelated columns).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from amapreduce.decision.columns import normalize_key_name

__all__ = [
    "ParsedReply",
    "ProjectedRow",
    "cell_text",
    "parse_reply",
    "project_row",
]

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_LIST_WRAPPERS = ("rows", "results", "data", "items", "answer", "records", "table")
_TASK_KEYS = {normalize_key_name(k) for k in ("task", "task_id", "task_index", "task_number", "#")}
_SOURCE_KEYS = [normalize_key_name(k) for k in ("source", "source_url", "url", "sources", "reference", "evidence_url")]
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True, kw_only=True)
class ParsedReply:
    """The JSON payload found in a reply, and how it was found."""

    rows: list[Mapping[str, Any]]
    """Objects found (a top-level list of objects, one object, or a list under `rows`/`results`)."""
    method: str
    """`object`, `json`, `fence`, `array_slice`, `object_slice`, `json_repair`, or `none`."""
    error: str | None = None
    """Why nothing usable was found (None when rows were found)."""


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


def cell_text(value: Any) -> str:
    """Turn one JSON value into a table cell (single line, no surrounding space)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        text = value
    elif isinstance(value, Sequence):
        text = ", ".join(cell_text(v) for v in value if v is not None)
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return _SPACES.sub(" ", text).strip()


def _rows_of(payload: Any) -> list[Mapping[str, Any]] | None:
    if isinstance(payload, Mapping):
        for key in _LIST_WRAPPERS:
            inner = payload.get(key)
            if isinstance(inner, list) and all(isinstance(x, Mapping) for x in inner):
                return list(inner)
        return [payload]
    if isinstance(payload, list):
        objs = [x for x in payload if isinstance(x, Mapping)]
        if objs or not payload:
            return objs
    return None


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None


def parse_reply(reply: Any) -> ParsedReply:
    """Find the JSON rows in a sub-agent's final answer."""
    if isinstance(reply, Mapping | list):
        rows = _rows_of(reply)
        if rows is not None:
            return ParsedReply(rows=rows, method="object")
    text = reply if isinstance(reply, str) else str(reply)
    text = text.strip()
    if not text:
        return ParsedReply(rows=[], method="none", error="the reply was empty")
    candidates: list[tuple[str, str]] = [("json", text)]
    candidates += [("fence", block.strip()) for block in _FENCE.findall(text)]
    if "[" in text and "]" in text:
        candidates.append(("array_slice", text[text.index("[") : text.rindex("]") + 1]))
    if "{" in text and "}" in text:
        candidates.append(("object_slice", text[text.index("{") : text.rindex("}") + 1]))
    for method, candidate in candidates:
        rows = _rows_of(_loads(candidate))
        if rows is not None:
            return ParsedReply(rows=rows, method=method)
    import json_repair

    repaired = json_repair.loads(text)
    rows = _rows_of(repaired) if repaired not in ("", None) else None
    if rows:
        return ParsedReply(rows=rows, method="json_repair")
    return ParsedReply(rows=[], method="none", error=f"no JSON array of objects found in the reply ({text[:80]!r}…)")


def _task_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        digits = value.strip().lstrip("#").strip()
        if digits.isdigit():
            return int(digits)
    return None


def project_row(obj: Mapping[str, Any], columns: Sequence[str]) -> ProjectedRow:
    """Project one reply object onto `columns` (case/space-insensitive key match)."""
    wanted = {normalize_key_name(c): c for c in columns}
    values = dict.fromkeys(columns, "")
    task: int | None = None
    sources: dict[str, Any] = {}
    extra: dict[str, Any] = {}
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
        else:
            extra[str(key)] = value
    source = None
    for key in _SOURCE_KEYS:
        if key in sources:
            raw = sources[key]
            first = raw[0] if isinstance(raw, list) and raw else raw
            source = cell_text(first) or None
            break
    return ProjectedRow(values=values, task=task, source=source, extra=extra)
