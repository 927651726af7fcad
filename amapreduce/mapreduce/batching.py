"""Batch planning: turn a validated decision into sub-agent batches with manifests.

Semantics follow the reference tool (docs/reference-audit.md §2.3–2.4) with its bugs fixed: an
invalid attribute is a validation error (it never collapses the whole matrix into one batch),
`by_attr` groups can be capped, open groups given by indices are honoured, and the number of
batches is capped (default 50, as the paper's prompt demands). Every row lands in exactly one
batch, in a deterministic order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from amapreduce.decision.model import Decision
from amapreduce.decision.strategy import ByAttr, OpenStrategy, PerAtom
from amapreduce.errors import DecisionError
from amapreduce.settings import default_setting

__all__ = ["Batch", "BatchPlan", "plan_batches"]


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One batch of atomic tasks and its manifest (what the sub-agent is told about it)."""

    batch_id: str
    """`batch-001`, `batch-002`, ... (1-based, zero-padded)."""
    indices: tuple[int, ...]
    """Source rows of the task matrix, in matrix order."""
    rationale: str
    """Why these tasks travel together; shown to the sub-agent."""
    shared_context: Mapping[str, Any] = field(default_factory=dict)
    """Context shared by the batch's tasks (attribute value, a group's note); shown to the sub-agent."""

    @property
    def size(self) -> int:
        """Number of tasks in the batch."""
        return len(self.indices)

    def manifest(self) -> dict[str, Any]:
        """The batch manifest as JSON (id, source rows, shared context, rationale)."""
        return {
            "batch_id": self.batch_id,
            "source_indices": list(self.indices),
            "size": self.size,
            "shared_context": dict(self.shared_context),
            "rationale": self.rationale,
        }


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """All batches of one decision."""

    strategy: str
    num_rows: int
    batches: tuple[Batch, ...]

    def to_json(self) -> dict[str, Any]:
        """The plan in the `amapreduce mapreduce plan --json` shape."""
        return {
            "num_rows": self.num_rows,
            "strategy": self.strategy,
            "batches": [
                {"batch_id": b.batch_id, "indices": list(b.indices), "size": b.size, "rationale": b.rationale}
                for b in self.batches
            ],
        }


def _chunks(indices: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(indices), size):
        yield list(indices[start : start + size])


def _per_atom(d: Decision, s: PerAtom) -> list[tuple[list[int], str, dict[str, Any]]]:
    size = d.batch_size or 1
    why = s.rationale or ("one atomic task per batch" if size == 1 else f"chunks of {size} atomic tasks")
    return [(chunk, why, {}) for chunk in _chunks(range(len(d.task_matrix)), size)]


def _by_attr(d: Decision, s: ByAttr) -> list[tuple[list[int], str, dict[str, Any]]]:
    col = d.attribute_column(s.attribute_index, s.attribute_name)
    name = d.resolved_matrix_columns[col] or f"column {col}"
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(d.task_matrix):
        groups.setdefault(row[col], []).append(i)
    out = []
    for value, rows in groups.items():
        why = s.group_rationales.get(value) or s.rationale or f"tasks sharing {name} = {value!r}"
        context = {"attribute_index": col, "attribute_name": name, "attribute_value": value}
        parts = list(_chunks(rows, s.max_group_size)) if s.max_group_size else [rows]
        for k, part in enumerate(parts):
            ctx = dict(context)
            if len(parts) > 1:
                ctx["part"] = f"{k + 1}/{len(parts)}"
            out.append((part, why, ctx))
    return out


def _open(d: Decision, s: OpenStrategy) -> list[tuple[list[int], str, dict[str, Any]]]:
    used: set[int] = set()
    out: list[tuple[list[int], str, dict[str, Any]]] = []
    for g, group in enumerate(s.groups):
        context: dict[str, Any] = {"group": g}
        if group.indices is not None:
            rows = sorted(group.indices)
        else:
            explicit = group.attribute_index is not None or group.attribute_name is not None
            col = d.attribute_column(
                group.attribute_index if explicit else s.attribute_index,
                group.attribute_name if explicit else s.attribute_name,
            )
            rows = [i for i, r in enumerate(d.task_matrix) if r[col] == group.attribute_value and i not in used]
            context.update(attribute_name=d.resolved_matrix_columns[col] or f"column {col}", attribute_value=group.attribute_value)
        if isinstance(group.shared_context, Mapping):
            context.update(group.shared_context)
        elif group.shared_context:
            context["note"] = group.shared_context
        used.update(rows)
        out.append((rows, group.rationale or s.rationale or f"manager-defined group {g}", context))
    leftover = [i for i in range(len(d.task_matrix)) if i not in used]
    size = s.chunk_size or d.batch_size or 1
    for chunk in _chunks(leftover, size):
        out.append((chunk, s.rationale or "rows in no group, chunked in matrix order", {"note": "leftover chunk"}))
    return out


def plan_batches(
    decision: Decision, *, max_batches: int | None = default_setting("max_batches"), id_prefix: str = ""
) -> BatchPlan:
    """Split `decision` into batches according to its strategy.

    Args:
        decision: a validated decision.
        max_batches: the largest plan accepted (None: no cap); a larger one is a
            `DecisionError` that tells the manager how to shrink it.
        id_prefix: prepended to batch ids (patch rounds use `patch1-`).

    Raises:
        DecisionError: the plan has more batches than `max_batches`.
    """
    s = decision.batch_strategy
    if isinstance(s, ByAttr):
        parts = _by_attr(decision, s)
    elif isinstance(s, OpenStrategy):
        parts = _open(decision, s)
    else:
        parts = _per_atom(decision, s)
    if max_batches is not None and len(parts) > max_batches:
        raise DecisionError(
            f"the batch plan has {len(parts)} batches, more than `max_batches`={max_batches}. "
            "Group tasks with by_attr or open, or set a larger batch_size."
        )
    batches = tuple(
        Batch(batch_id=f"{id_prefix}batch-{k + 1:03d}", indices=tuple(rows), rationale=why, shared_context=ctx)
        for k, (rows, why, ctx) in enumerate(parts)
    )
    return BatchPlan(strategy=s.type, num_rows=len(decision.task_matrix), batches=batches)
