"""Output columns of a decision, read from a JSON schema or a plain list of names.

Accepted shapes (the reference silently produced empty rows for anything but the first):

* `{"type": "object", "properties": {"name": {"type": "string", "description": "..."}, ...}}`
* `["name", "capital", ...]` (a plain list of column names)
* `{"name": {"type": "string"}, "capital": {...}}` (a bare properties map)

A column's `type` is one of the closed set of `decision.column_types` (`text`, `integer`, `date` ...),
read here, at the edge: the JSON-schema spellings decisions were written with (`"string"`,
`"number"`, `"integer"`, `"boolean"`, `["string", "null"]`, `"format": "date"`) keep meaning what
they meant, and an unknown type is refused naming the allowed ones instead of reaching sub-agents as
a word nobody acts on.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amapreduce.decision.column_types import ColumnType, column_type, type_names
from amapreduce.errors import DecisionError
from amapreduce.table.keys import is_blank

__all__ = ["ColumnSpec", "ColumnType", "columns_from_schema", "normalize_key_name"]

_SCHEMA_KEYWORDS = {"type", "properties", "required", "title", "description", "$schema", "items"}
_KEY_NAME_JUNK = re.compile(r"[\s_\-]+")


@dataclass(frozen=True, kw_only=True)
class ColumnSpec:
    """One output column as a decision specifies it: its name as the table shows it, plus an optional
    type (None: not given, read as text) and description (shown to sub-agents). Tables and work
    items carry only the names."""

    name: str
    type: ColumnType | None = None
    description: str | None = None

    @property
    def kind(self) -> ColumnType:
        """The column's type, `text` when the decision gave none."""
        return self.type or ColumnType.TEXT

    def to_json(self) -> dict[str, Any]:
        """The column as a property entry of a decision's `json_schema`."""
        out: dict[str, Any] = {}
        if self.type:
            out["type"] = self.type.value
        if self.description:
            out["description"] = self.description
        return out


def normalize_key_name(name: str) -> str:
    """Fold a column/key name for case- and space-insensitive matching (`Net Worth` ~ `net_worth`)."""
    return _KEY_NAME_JUNK.sub("", unicodedata.normalize("NFKC", name)).casefold()


def _column(name: Any, spec: Any, where: str) -> ColumnSpec:
    if not isinstance(name, str) or is_blank(name):
        raise DecisionError(
            f"json_schema {where}: a column name must be a string with a visible character, got {name!r}."
        )
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise DecisionError(
            f"json_schema {where}: column {name!r} must map to an object like "
            f'{{"type": "string", "description": "..."}}, got {spec!r}.'
        )
    description = spec.get("description")
    return ColumnSpec(
        name=name.strip(),
        type=_column_type(name.strip(), spec.get("type"), spec.get("format"), where),
        description=str(description) if description is not None else None,
    )


def _column_type(name: str, given: Any, fmt: Any, where: str) -> ColumnType | None:
    """The `ColumnType` a column's `type` (and JSON-schema `format`) names; None when it has none.
    A list (`["integer", "null"]`, or `"integer|null"` as stored before) names the one type of its
    members other than `"null"`."""
    if given is None:  # a bare `format` (`{"format": "date"}`) types the column as a `"string"` with it would
        kind = column_type("string", fmt) if isinstance(fmt, str) else None
        return None if kind is ColumnType.TEXT else kind
    if isinstance(given, str) and "|" in given:  # how decisions stored before types wrote a list: "string|null"
        given = given.split("|")
    spellings = given if isinstance(given, list) else [given]
    kinds = {
        column_type(s, fmt if isinstance(fmt, str) else None) if isinstance(s, str) else None
        for s in spellings
        if s != "null"
    }
    if len(kinds) == 1 and None not in kinds:
        return kinds.pop()
    problem = "names no column type" if None in kinds or not kinds else "names more than one column type"
    raise DecisionError(
        f"json_schema {where}: column {name!r} has type {given!r}, which {problem}; "
        f"use one of {type_names()} (the JSON-schema spellings \"string\", \"number\", \"integer\" "
        "and \"boolean\" work too), or leave `type` out for text."
    )


def columns_from_schema(schema: Mapping[str, Any] | Sequence[Any]) -> tuple[ColumnSpec, ...]:
    """Read the ordered output columns from `schema`.

    Raises:
        DecisionError: the schema has no columns, an unreadable shape, or repeated names.
    """
    columns: list[ColumnSpec]
    if isinstance(schema, Mapping):
        props = schema.get("properties")
        if props is not None:
            if not isinstance(props, Mapping):
                raise DecisionError(f"json_schema.properties must be an object, got {type(props).__name__}.")
            columns = [_column(n, s, "properties") for n, s in props.items()]
        elif schema and all(isinstance(v, Mapping) for v in schema.values()) and not (
            set(schema) & _SCHEMA_KEYWORDS
        ):
            columns = [_column(n, s, "map") for n, s in schema.items()]
        else:
            raise DecisionError(
                "json_schema has no `properties`; give "
                '{"type": "object", "properties": {"column": {"type": "string"}, ...}} '
                "or a plain list of column names."
            )
    elif isinstance(schema, Sequence) and not isinstance(schema, str):
        columns = [_column(n, None, f"list item {i}") for i, n in enumerate(schema)]
    else:
        raise DecisionError(
            f"json_schema must be an object with `properties` or a list of column names, got {schema!r}."
        )
    if not columns:
        raise DecisionError("json_schema defines no columns; list at least one output column.")
    seen: dict[str, str] = {}
    for col in columns:
        folded = normalize_key_name(col.name)
        if folded in seen:
            raise DecisionError(
                f"json_schema columns {seen[folded]!r} and {col.name!r} are the same name "
                "after ignoring case and spaces; give each column a distinct name."
            )
        seen[folded] = col.name
    return tuple(columns)
