"""Records ε = (q, Θ, τ, u): what one scored run leaves behind (paper §3.3).

Θ and τ are stored as compact summaries, not the raw matrix and trace: retrieval shows the
manager *how* a similar task was decomposed (shape, template, columns, batching), which is what
transfers between tasks (App. D.6); the full matrix would only bloat the prior.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from amapreduce.decision.strategy import ByAttr, OpenStrategy

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision

__all__ = ["DecisionSummary", "Record", "TraceSummary", "new_id", "normalise_query"]


def new_id(prefix: str) -> str:
    """A short random id (`r-1a2b3c4d5e6f`): unique across concurrent writers without coordination."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def normalise_query(query: str) -> str:
    """The key two question strings are matched on (whitespace-insensitive, case-insensitive)."""
    return " ".join(query.split()).casefold()


class DecisionSummary(BaseModel):
    """Θ = (M, P, B) reduced to what transfers between tasks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int = Field(default=0, ge=0)
    cols: int = Field(default=0, ge=0)
    template: str = ""
    columns: tuple[str, ...] = ()
    strategy: str = ""
    batch_size: int | None = None
    """Rows per batch the strategy asks for (per_atom `batch_size`, by_attr `max_group_size`,
    open `chunk_size`); None when the strategy sets no size."""
    batches: int | None = None
    pattern: str = ""
    """A one-line natural-language summary, shown in Δ_q and to the distillation model."""

    @classmethod
    def of(cls, decision: Decision | DecisionSummary, *, batches: int | None = None) -> DecisionSummary:
        """Summarise a validated decision Θ: the one place a decision becomes a summary.

        `batches` is the size of the batch plan that ran, when known. A summary given instead of
        a decision (a caller that kept only the summary) is kept as it is. Either way the result
        has a `pattern` sentence, since Δ_q and the distillation prompts show it. (Summaries read
        back from the store or an export are validated as they are, without this step, so a
        round trip is lossless.)
        """
        if isinstance(decision, DecisionSummary):
            return decision.with_pattern()
        strategy = decision.batch_strategy
        # Rows per batch as the batch planner reads them: by_attr caps its groups with
        # `max_group_size` (it ignores `batch_size`), open chunks the rows in no group by
        # `chunk_size` (falling back to `batch_size`), per_atom chunks by `batch_size`.
        size: int | None
        if isinstance(strategy, ByAttr):
            size = strategy.max_group_size
        elif isinstance(strategy, OpenStrategy):
            size = strategy.chunk_size or decision.batch_size
        else:
            size = decision.batch_size
        spec, matrix = decision.discover, decision.task_matrix
        summary = cls(
            rows=len(matrix), cols=len(matrix[0]) if matrix else len(spec.resolved_key_columns) if spec else 0,
            template=decision.template[:500], columns=decision.columns, strategy=strategy.type, batch_size=size,
            batches=batches,
        )
        if spec is not None:  # the matrix is found at run time: say how, not "0x2 task matrix"
            shape = f"{summary.rows}x{summary.cols} task matrix"
            found = (f"task matrix discovered from {len(spec.sources)} sources ({spec.merge} merge, key "
                     f"{', '.join(spec.resolved_key_columns)})")
            return summary.model_copy(update={"pattern": summary.describe().replace(shape, found, 1)})
        return summary.with_pattern()

    def with_pattern(self) -> DecisionSummary:
        """This summary with its `pattern` sentence filled in when it has none."""
        return self if self.pattern else self.model_copy(update={"pattern": self.describe()})

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
    tokens: int | None = None
    """Model tokens the run used (prompt + completion), for the advice's tokens per row."""
    advice: dict[str, Any] | None = None
    """Which structured advice the run applied: `{"by": "manager"|"plan_stage", "strategy",
    "batch_size"}` (None: none was applied)."""
    followed_hints: tuple[str, ...] = ()
    """Hints of the run's prior whose typed advice the executed decision followed (set at commit)."""
    worse: str | None = None
    """Why the run, though it passed, did worse than the family's records its prior measured
    (`memory.advice.worse_than_records`, set at commit); None: it did not, or nothing to compare."""

    @classmethod
    def of(cls, completeness: Mapping[str, Any], *, cost_usd: float | None, delay_s: float | None,
           tokens: int | None = None, advice: Mapping[str, Any] | None = None) -> TraceSummary:
        """τ of a run from its `result.json` `completeness` block (batches, retries, patch rounds),
        its cost and its wall time: the one place a run becomes a trace summary. Counts that are not
        non-negative integers (a hand-edited or foreign file) are left unknown, never guessed."""

        def count(key: str) -> int | None:
            value = completeness.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

        return cls(batches=count("batches"), retries=count("retries"), patch_rounds=count("patch_rounds"),
                   cost_usd=cost_usd, delay_s=delay_s, tokens=tokens, advice=dict(advice) if advice else None)


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
