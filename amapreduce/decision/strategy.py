"""Batching strategies B: how the N atomic tasks are grouped into sub-agent batches.

* `per_atom` — one task per batch, or chunks of `batch_size` tasks when it is given.
* `by_attr`  — tasks sharing the value of one matrix column go together (first-seen order);
  `max_group_size` splits oversize groups.
* `open`     — explicit groups (by `indices`, or by `attribute_index`/`attribute_name` plus
  `attribute_value`); rows left over are chunked by `chunk_size` in matrix order.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = [
    "MAX_BATCH_SIZE",
    "ByAttr",
    "Int",
    "OpenGroup",
    "OpenStrategy",
    "PerAtom",
    "Strategy",
    "StrategyName",
]

StrategyName = Literal["per_atom", "by_attr", "open"]

MAX_BATCH_SIZE = 1_000
"""Most tasks one batch may hold (`batch_size`, `chunk_size`, `max_group_size`). One sub-agent
answers a whole batch in one reply, so a batch of more than a thousand tasks cannot be answered;
a larger number is a mistake (`1e18`, a pasted 4,000-digit number), refused by name."""


def _reject_bool(value: Any) -> Any:
    # JSON `true` is a Python bool, which pydantic's lax mode would take as 1: a manager that wrote
    # `"batch_size": true` almost certainly meant something else, so say so instead of guessing.
    if isinstance(value, bool):
        raise ValueError(
            f"expected a whole number, got the boolean {str(value).lower()}; write a number such as 1"
        )
    return value


Int = Annotated[int, BeforeValidator(_reject_bool)]
"""An integer field that refuses JSON booleans (but still accepts `2` written as "2" or 2.0)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PerAtom(_Strict):
    """One atomic task per batch (or `batch_size` tasks per batch)."""

    type: Literal["per_atom"] = "per_atom"
    rationale: str | None = None
    """Why the manager chose this mode; passed to every sub-agent."""


class ByAttr(_Strict):
    """Group tasks by the value of one matrix column."""

    type: Literal["by_attr"] = "by_attr"
    attribute_index: Int | None = Field(default=None, ge=0)
    """0-based matrix column to group by."""
    attribute_name: str | None = None
    """Name of the output column the matrix column fills (see `Decision.matrix_columns`)."""
    max_group_size: Int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """Split a group larger than this into consecutive chunks."""
    group_rationales: dict[str, str] = Field(default_factory=dict)
    """Optional rationale per attribute value."""
    rationale: str | None = None

    @model_validator(mode="after")
    def _one_attribute(self) -> ByAttr:
        if (self.attribute_index is None) == (self.attribute_name is None):
            raise ValueError("by_attr needs exactly one of `attribute_index` or `attribute_name`")
        return self


class OpenGroup(_Strict):
    """One manager-defined group of tasks."""

    indices: list[Int] | None = None
    """0-based task-matrix rows of this group."""
    attribute_index: Int | None = Field(default=None, ge=0)
    attribute_name: str | None = None
    attribute_value: str | None = None
    """Take every row (not already grouped) whose attribute column equals this value."""
    rationale: str | None = None
    shared_context: dict[str, Any] | str | None = None
    """Context every task of the group shares (a source URL, a list page, a date range)."""

    @model_validator(mode="after")
    def _one_selector(self) -> OpenGroup:
        if (self.indices is None) == (self.attribute_value is None):
            raise ValueError("an open group needs exactly one of `indices` or `attribute_value`")
        if self.indices is not None and not self.indices:
            raise ValueError("an open group's `indices` must not be empty")
        return self


class OpenStrategy(_Strict):
    """Manager-specified groups; leftover rows are chunked by `chunk_size`."""

    type: Literal["open"] = "open"
    groups: list[OpenGroup] = Field(default_factory=list)
    chunk_size: Int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """Chunk size for rows in no group (falls back to the decision's `batch_size`, then 1)."""
    attribute_index: Int | None = Field(default=None, ge=0)
    """Default attribute column for groups given by `attribute_value`."""
    attribute_name: str | None = None
    rationale: str | None = None


Strategy = Annotated[PerAtom | ByAttr | OpenStrategy, Field(discriminator="type")]
