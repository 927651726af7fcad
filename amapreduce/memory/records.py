"""Records ε = (q, Θ, τ, u): what one scored run leaves behind (paper §3.3).

Θ and τ are stored as compact summaries, not the raw matrix and trace: retrieval shows the
manager *how* a similar task was decomposed (shape, template, columns, batching), which is what
transfers between tasks (App. D.6); the full matrix would only bloat the prior.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DecisionSummary", "Record", "TraceSummary", "new_id", "normalise_query"]


def new_id(prefix: str) -> str:
    """A short random id (`r-1a2b3c4d5e6f`): unique across concurrent writers without coordination."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def normalise_query(query: str) -> str:
    """The key two question strings are matched on (whitespace-insensitive, case-insensitive)."""
    return " ".join(query.split()).casefold()


def _strategy_name(strategy: Any) -> str:
    if isinstance(strategy, Mapping):
        return str(strategy.get("type") or strategy.get("mode") or "")
    return str(strategy or "")


def _columns(schema: Any) -> tuple[str, ...]:
    if isinstance(schema, Mapping):
        props = schema.get("properties")
        if isinstance(props, Mapping):
            return tuple(str(k) for k in props)
        cols = schema.get("columns")
        if isinstance(cols, list):
            return tuple(str(c) for c in cols)
    if isinstance(schema, list):
        return tuple(str(c) for c in schema)
    return ()


class DecisionSummary(BaseModel):
    """Θ = (M, P, B) reduced to what transfers between tasks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int = Field(default=0, ge=0)
    cols: int = Field(default=0, ge=0)
    template: str = ""
    columns: tuple[str, ...] = ()
    strategy: str = ""
    batch_size: int | None = None
    batches: int | None = None
    pattern: str = ""
    """A one-line natural-language summary, shown in Δ_q and to the distillation model."""

    @classmethod
    def from_decision(cls, decision: Mapping[str, Any] | DecisionSummary, *,
                      batches: int | None = None) -> DecisionSummary:
        """Summarise a raw decision as the plan stage receives it (`task_matrix`, `template`, ...).

        A stored or exported summary (summary fields only, with `pattern` or `rows`) is kept
        exactly as it is, so an export/import round trip is lossless. Anything else is a decision
        being recorded now, and gets a `pattern` sentence when it has none, since Δ_q and the
        distillation prompts show it: that includes a raw decision made only of names a summary
        also has (`{"template": ..., "batch_size": 5}`), read as a summary to keep every field.
        """
        if isinstance(decision, DecisionSummary):
            summary = decision
        elif decision and set(decision) <= set(cls.model_fields):
            summary = cls.model_validate(dict(decision))
            if "pattern" in decision or "rows" in decision:
                return summary
            if summary.batches is None and batches is not None:
                summary = summary.model_copy(update={"batches": batches})
        else:
            summary = cls._from_raw(decision, batches=batches)
        return summary if summary.pattern else summary.model_copy(update={"pattern": summary.describe()})

    @classmethod
    def _from_raw(cls, decision: Mapping[str, Any], *, batches: int | None) -> DecisionSummary:
        matrix = decision.get("task_matrix") or []
        rows = len(matrix) if isinstance(matrix, list) else 0
        cols = max((len(r) for r in matrix if isinstance(r, list)), default=0) if rows else 0
        template = str(decision.get("template") or "")
        columns = _columns(decision.get("json_schema"))
        strategy_raw = decision.get("batch_strategy")
        strategy = _strategy_name(strategy_raw)
        size = decision.get("batch_size")
        if size is None and isinstance(strategy_raw, Mapping):
            size = strategy_raw.get("max_group_size") or strategy_raw.get("batch_size")
        batch_size = int(size) if isinstance(size, int | float) and not isinstance(size, bool) else None
        return cls(
            rows=rows, cols=cols, template=template[:500], columns=columns, strategy=strategy,
            batch_size=batch_size, batches=batches,
        )

    def describe(self) -> str:
        """Render the summary as one sentence (used when `pattern` is empty)."""
        if self.pattern:
            return self.pattern
        parts = [f"{self.rows}x{self.cols} task matrix"]
        if self.columns:
            shown = ", ".join(self.columns[:8]) + (", ..." if len(self.columns) > 8 else "")
            parts.append(f"{len(self.columns)} output columns ({shown})")
        if self.strategy:
            batching = f"batching {self.strategy}"
            if self.batch_size:
                batching += f" with up to {self.batch_size} rows per batch"
            if self.batches is not None:
                batching += f" ({self.batches} batches)"
            parts.append(batching)
        if self.template:
            tpl = self.template if len(self.template) <= 120 else self.template[:117] + "..."
            parts.append(f"template: {tpl!r}")
        return "; ".join(parts)


class TraceSummary(BaseModel):
    """τ: how the run went, kept for inspection and analysis (not part of the label)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batches: int | None = None
    retries: int | None = None
    patch_rounds: int | None = None
    cost_usd: float | None = None
    delay_s: float | None = None


class Record(BaseModel):
    """One stored record; `label` is ℓ(u) under the store's pass rule at write time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    query: str
    label: bool
    decision: DecisionSummary = DecisionSummary()
    trace: TraceSummary = TraceSummary()
    metrics: dict[str, Any] = Field(default_factory=dict)
    task_id: str | None = None
    cluster: int | None = None
    created_at: str = ""

    def to_row(self) -> dict[str, Any]:
        """Column values for the `records` table (JSON text for the nested parts)."""
        return {
            "id": self.id,
            "task_id": self.task_id,
            "query": self.query,
            "query_key": normalise_query(self.query),
            "label": int(self.label),
            "decision": self.decision.model_dump_json(),
            "trace": self.trace.model_dump_json(),
            "metrics": json.dumps(self.metrics, sort_keys=True, default=str),
            "cluster": self.cluster,
            "created_at": self.created_at,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Record:
        """Rebuild a record from a `records` row."""
        return cls(
            id=row["id"], query=row["query"], label=bool(row["label"]),
            decision=DecisionSummary.model_validate_json(row["decision"]),
            trace=TraceSummary.model_validate_json(row["trace"]),
            metrics=json.loads(row["metrics"]), task_id=row["task_id"], cluster=row["cluster"],
            created_at=row["created_at"],
        )
