"""The `discover` part of a decision: the task matrix is found, not given.

Discovery is a MapReduce of its own (issue 12, point 2): each source (a list page's URL or a
search query) fills `__0__` of `template`, sub-agents list the candidate entities they find
with evidence, code dedups them by normalised key, and with `merge: "model"` a token-budget
tree reduce lets a model merge fuzzy duplicates ("St. Petersburg" ~ "Saint Petersburg"). The
entities' key values then become the fill stage's task matrix.

This module is layer 2 (decision/): it validates the spec and hands out plain values. The
reduce policy object itself lives in `mapreduce/tree_reduce.py` (layer 4) and is built by
`mapreduce/discover.py` from `chunk_size`, `token_budget_for(...)` and `max_levels`; importing
it here would turn the layers around.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from amapreduce._text import scrub_data
from amapreduce.decision.columns import ColumnSpec, columns_from_schema
from amapreduce.decision.strategy import MAX_BATCH_SIZE, Int
from amapreduce.decision.template import PLACEHOLDER, misspelt_placeholders, placeholders
from amapreduce.table.keys import is_blank, normalize_value

__all__ = ["MAX_DISCOVER_LEVELS", "MAX_DISCOVER_SOURCES", "DiscoverSpec"]

MAX_DISCOVER_SOURCES = 10_000
"""Most sources one discovery may map over. Each source is at least one sub-agent call; more
than ten thousand list pages or queries in one decision is a mistake, not a plan."""

MAX_DISCOVER_LEVELS = 20
"""Largest `max_levels`. With a chunk of 2 and 20 levels the tree already reduces a million
candidate lists; a larger number can only be a typo."""


class DiscoverSpec(BaseModel):
    """How to discover the task matrix: map over `sources`, dedup, optionally merge by model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[str] = Field(min_length=1, max_length=MAX_DISCOVER_SOURCES)
    """List pages (URLs) or search queries; each one fills `__0__` of `template`."""
    template: str
    """The discovery sub-query, with `__0__` where the source goes."""
    json_schema: dict[str, Any] | list[Any]
    """Candidate columns (as `Decision.json_schema`): the key columns and any attribute worth keeping."""
    key_columns: list[str] | None = None
    """Columns that identify an entity (default: the first column). They become the fill matrix."""
    batch_size: Int = Field(default=1, ge=1, le=MAX_BATCH_SIZE)
    """Sources per discovery sub-agent."""
    merge: Literal["code", "model"] = "code"
    """"code": normalised-key dedup only; "model": then a tree reduce merges fuzzy duplicates."""
    chunk_size: Int | None = Field(default=None, ge=2, le=MAX_BATCH_SIZE)
    """Static tree reduce: candidate lists per merge call (exclusive with `token_budget`)."""
    token_budget: Int | None = Field(default=None, ge=1)
    """Adaptive tree reduce: input tokens per merge call at most."""
    budget_ratio: float = 0.5
    """Without `chunk_size`/`token_budget`: the budget is the model's context window × this."""
    max_levels: Int = Field(default=4, ge=1, le=MAX_DISCOVER_LEVELS)
    """Intermediate reduce levels at most."""

    _columns: tuple[ColumnSpec, ...] = PrivateAttr(default=())
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="before")
    @classmethod
    def _scrub(cls, data: Any) -> Any:
        # Outside text, as in `Decision`: a spec validated on its own gets the same scrubbing.
        return scrub_data(data) if isinstance(data, Mapping) else data

    @field_validator("budget_ratio", mode="before")
    @classmethod
    def _ratio(cls, value: Any) -> Any:
        # (0, 1]: the share of the context window one merge call's prompt may fill; the rest is the reply's.
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ValueError(
                f"budget_ratio must be a number in (0, 1] (the share of the model's context window one merge "
                f"call may fill), got {value!r}; 0.5 is the default"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> DiscoverSpec:
        self._check_sources()
        self._check_template()
        self._columns = columns_from_schema(self.json_schema)
        self._keys = self._resolve_keys()
        if self.chunk_size is not None and self.token_budget is not None:
            raise ValueError(
                f"chunk_size ({self.chunk_size}) and token_budget ({self.token_budget}) are exclusive: "
                "chunk_size merges a fixed number of candidate lists per call, token_budget packs lists "
                "up to a token count; give one of them (or neither: the budget is the context window × budget_ratio)"
            )
        return self

    def _check_sources(self) -> None:
        seen: dict[str, int] = {}
        for i, source in enumerate(self.sources):
            if is_blank(source):
                raise ValueError(f"sources[{i}] is empty; give a list page URL or a search query")
            found = PLACEHOLDER.search(source)
            if found:
                raise ValueError(
                    f"sources[{i}] = {source[:60]!r} contains the placeholder {found.group(0)!r}; "
                    "a source is plain text that fills __0__ of the template"
                )
            norm = normalize_value(source)
            if norm in seen:
                raise ValueError(
                    f"sources {seen[norm]} and {i} are the same ({source[:60]!r}); list each source once"
                )
            seen[norm] = i

    def _check_template(self) -> None:
        if is_blank(self.template):
            raise ValueError("template is empty; write the discovery sub-query with __0__ for the source")
        misspelt = misspelt_placeholders(self.template)
        if misspelt:
            raise ValueError(
                f"template has {misspelt[0]!r}, a placeholder whose digits are not ASCII 0-9; write __0__"
            )
        used = placeholders(self.template)
        if 0 not in used:
            raise ValueError(
                "template has no __0__; put __0__ where each source (list page or query) goes"
            )
        if used != [0]:
            raise ValueError(
                f"template uses __{used[-1]}__, but each discovery task has one cell (the source): "
                "use only __0__"
            )

    def _resolve_keys(self) -> tuple[str, ...]:
        names = [c.name for c in self._columns]
        if self.key_columns is None:
            return (names[0],)
        if not self.key_columns:
            raise ValueError("key_columns is empty; name at least one column that identifies an entity")
        for k in self.key_columns:
            if k not in names:
                raise ValueError(f"key_columns names {k!r}, which is not a column; columns are {names}")
        if len(set(self.key_columns)) != len(self.key_columns):
            raise ValueError(f"key_columns repeats a column: {self.key_columns}")
        return tuple(self.key_columns)

    # -- derived views ------------------------------------------------------------------------

    @property
    def column_specs(self) -> tuple[ColumnSpec, ...]:
        """The candidate columns with their types and descriptions, in order."""
        return self._columns

    @property
    def columns(self) -> tuple[str, ...]:
        """Names of the candidate columns, in order."""
        return tuple(c.name for c in self._columns)

    @property
    def resolved_key_columns(self) -> tuple[str, ...]:
        """`key_columns` as given, or the first column; never None. The fill matrix has these cells."""
        return self._keys

    def token_budget_for(self, context_window: int) -> int | None:
        """Input tokens per merge call: `token_budget`, else the context window × `budget_ratio`.

        None when `chunk_size` is given (static mode has no token budget). Raises ValueError for
        a context window below 1, which only a broken setting can produce.
        """
        if self.chunk_size is not None:
            return None
        if self.token_budget is not None:
            return self.token_budget
        if context_window < 1:
            raise ValueError(f"context window must be >= 1 token, got {context_window}")
        return max(1, int(context_window * self.budget_ratio))
