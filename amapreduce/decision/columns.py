"""Output columns of a decision, read from a JSON schema or a plain list of names.

Accepted shapes (the reference silently produced empty rows for anything but the first):

* `{"type": "object", "properties": {"name": {"type": "string", "description": "..."}, ...}}`
* `["name", "capital", ...]` (a plain list of column names)
* `{"name": {"type": "string"}, "capital": {...}}` (a bare properties map)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amapreduce.errors import DecisionError
from amapreduce.table.keys import is_blank

__all__ = ["ColumnSpec", "columns_from_schema", "normalize_key_name"]

_SCHEMA_KEYWORDS = {"type", "properties", "required", "title", "description", "$schema", "items"}
_KEY_NAME_JUNK = re.compile(r"[\s_\-]+")


@dataclass(frozen=True, kw_only=True)
class ColumnSpec:
    """One output column as a decision specifies it: its name as the table shows it, plus an optional
    type and description (shown to sub-agents). Tables and work items carry only the names."""

    name: str
    type: str | None = None
    description: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The column as a JSON-schema property entry."""
        out: dict[str, Any] = {}
        if self.type:
            out["type"] = self.type
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
    col_type = spec.get("type")
    if isinstance(col_type, list):
        col_type = "|".join(str(t) for t in col_type)
    description = spec.get("description")
    return ColumnSpec(
        name=name.strip(),
        type=str(col_type) if col_type is not None else None,
        description=str(description) if description is not None else None,
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
