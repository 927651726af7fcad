"""`RunRecord`: the schema of a run folder's `result.json`, one typed record per run.

Every run writes one (`ActiveRun.finish` when it finished or stopped, `ActiveRun.record_failure`
when it raised), and everything that reads a run reads it through `RunRecord.read`. The JSON Schema
users validate against, `docs/reference/result.schema.json`, is generated from this model
(`python -m amapreduce.session.record > docs/reference/result.schema.json`; a test keeps it current).

Version 1 is the first versioned record; a folder written before it has no `version` and reads as
version 0, with the same fields (`RunRecord.read` accepts it). Parts whose structure has its own
model elsewhere (a decision, the memory's advice) are kept as JSON objects here and described by
their own documentation; every other part is typed here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from amapreduce.errors import UserError
from amapreduce.table.table import Table

__all__ = ["RECORD_VERSION", "CellRecord", "CompletenessRecord", "DiscoveryRecord", "EstimateRecord",
           "ExecutorRecord", "PriorRecord", "Range", "RoleUsage", "RowRecord", "RunRecord", "TableRecord", "Timings",
           "UsageRecord", "WebRecord"]

RECORD_VERSION = 1
"""The `version` a run writes today."""

Kind = Literal["ask", "mapreduce_run", "demo", "eval", "enrich"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompletenessRecord(_Part):
    """How much of the asked-for table the run holds, and the effort summed over its executions."""

    rows: int = Field(ge=0)
    expected_rows: int | None = Field(default=None, ge=0)
    """Rows the decisions ask for (null: no decision ran)."""
    missing_cells: int = Field(ge=0)
    incomplete_tasks: int = Field(ge=0)
    complete: bool
    mapreduce_calls: int | None = Field(default=None, ge=0)
    """The manager's `mapreduce` tool calls (null: a run without a manager)."""
    executions: int = Field(ge=0)
    batches: int = Field(ge=0)
    patch_rounds: int = Field(ge=0)
    attempts: int = Field(ge=0)
    retries: int = Field(ge=0)
    timeouts: int = Field(ge=0)
    failures: int = Field(ge=0)
    backups: int = Field(ge=0)


class RoleUsage(_Part):
    """One role's (or the run's) model usage."""

    requests: int = Field(ge=0)
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None
    """null: a model of the role has no known price."""
    abandoned: int = Field(default=0, ge=0)
    """Of the requests, those given up on the wire, charged their prompt's estimate (`llm.usage.Usage.abandoned`)."""


class UsageRecord(_Part):
    """Usage by role and in total, and the models without a known price."""

    by_role: dict[str, RoleUsage]
    total: RoleUsage
    unpriced_models: list[str] = []


class CellRecord(_Part):
    """One cell: its value and where it came from."""

    value: str
    status: Literal["found", "missing", "conflict", "marker"]
    source: str | None = None
    quote: str | None = None
    evidence: Literal["verified", "unverified", "no_evidence"]
    confidence: float = Field(ge=0.0, le=1.0)
    alternatives: list[str] = []
    agreements: int = Field(default=0, ge=0)


class RowRecord(_Part):
    """One row: the task-matrix row that produced it, its cells by column, and for a row a nested
    decision found, the path of child runs (`origin`)."""

    task_index: int
    cells: dict[str, CellRecord]
    origin: str | None = None


class TableRecord(_Part):
    """The reduced table (`amapreduce.table.Table.to_json`, read back by `Table.from_json`)."""

    columns: list[str]
    key_columns: list[str]
    rows: list[RowRecord]

    def to_table(self) -> Table:
        """The `Table` recorded: its cells' values, statuses, sources, quotes, evidence and conflicts."""
        return Table.from_json(self.model_dump(mode="json"))


class Range(_Part):
    """An estimate's low and high figure."""

    low: float
    high: float


class EstimateRecord(_Part):
    """What the decision's batch plan was expected to cost (an estimate-only `ask`, `--estimate`)."""

    batches: int = Field(ge=0)
    rows: int = Field(ge=0)
    workers: int = Field(ge=1)
    """Sub-agents in flight (under an adapted `--workers auto`, the most: the wall time's low end)."""
    workers_start: int | None = Field(default=None, ge=1)
    """Under `--workers auto` with no slots reported, where the adapted number starts (the wall time's
    high end); null or absent: `workers` throughout."""
    model: str | None
    calls: Range
    prompt_tokens: Range
    completion_tokens: Range
    cached_tokens: Range | None = None
    """Of the prompt tokens, those expected from the provider's prefix cache (priced at its cached
    rate; absent in records written before it was estimated)."""
    cost_usd: Range | None
    """null: the sub-agent model has no known price."""
    wall_s: Range
    source: str
    """Which past runs (or defaults) the figures come from."""


class PriorRecord(_Part):
    """The experiential prior the plan stage handed the manager (`mapreduce.prior.Prior.to_json`)."""

    text: str
    hint_ids: list[str] = []
    kept_hint_ids: list[str] = []
    record_ids: list[str] = []
    advice: dict[str, Any] | None = None
    """The memory's typed advice (docs/guides/memory.md), as the plan stage gave it."""
    advice_used: dict[str, Any] | None = None
    """What of the advice the manager's decision followed."""


class DiscoveryRecord(_Part):
    """What a discovery did (`mapreduce.result.DiscoverySummary`)."""

    sources: int = Field(ge=0)
    candidates: int = Field(ge=0)
    entities: int = Field(ge=0)
    merge_calls: int = Field(ge=0)
    levels: int = Field(ge=0)
    nodes: list[str] = []
    peak_prompt_tokens: int = Field(ge=0)
    token_budget: int | None = None
    warnings: list[str] = []


class WebRecord(_Part):
    """The run's web tools: searches, crawls and the page cache (all 0: no web tools)."""

    searches: int = Field(default=0, ge=0)
    crawls: int = Field(default=0, ge=0)
    cache_hits: int = Field(default=0, ge=0)
    cache_misses: int = Field(default=0, ge=0)
    shared: int = Field(default=0, ge=0)
    """Searches and crawls served by an identical one in flight (no request of their own)."""


class ExecutorRecord(_Part):
    """Where a wide `mapreduce run` ran in chunks (`--executor`) and how many of them finished."""

    kind: str
    chunks: int = Field(ge=0)
    finished: int = Field(ge=0)


class Timings(_Part):
    """How long the run took."""

    wall_s: float = Field(ge=0.0)
    """The run's (or this resume's) wall time."""
    executions: list[dict[str, float]] = []
    """Each engine execution's `map_s`, `patch_s`, `wall_s`, in order."""


class RunRecord(BaseModel):
    """A run's `result.json`: what it was, how it ended, its table, usage and timings, and the parts
    only some kinds of run have (the rest null or absent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(default=RECORD_VERSION, ge=0)
    """0: a folder written before the record was versioned."""
    kind: Kind
    query: str
    status: str
    """`complete`, `incomplete`, `no_table`, `failed`, or `stopped: <reason>` (`stopped: interrupted`)."""
    error: str | None = None
    """Why a `failed` run failed."""
    error_type: str | None = None
    """The exception's type, for a run that raised."""
    completeness: CompletenessRecord
    table: TableRecord | None = None
    """null: a run that failed before it had a table."""
    usage: UsageRecord
    timings: Timings
    # -- ask, demo, eval ----------------------------------------------------------------------
    task_id: str | None = None
    manager_answer: str | None = None
    decisions: list[dict[str, Any]] | None = None
    """Every decision the manager executed, in order (its JSON form: docs/guides/decisions.md)."""
    discoveries: list[DiscoveryRecord] | None = None
    """One per executed decision that discovered its task matrix."""
    estimate: EstimateRecord | None = None
    # -- mapreduce_run, enrich ------------------------------------------------------------------
    decision: dict[str, Any] | None = None
    discovery: DiscoveryRecord | None = None
    executor: ExecutorRecord | None = None
    # -- every kind with a plan stage or search -------------------------------------------------
    prior: PriorRecord | None = None
    web: WebRecord | None = None

    @property
    def executed(self) -> list[dict[str, Any]]:
        """The decisions the run executed: an `ask`'s `decisions`, or the one `decision` of a
        `mapreduce run` or an `enrich` (empty: none ran)."""
        if self.decisions is not None:
            return list(self.decisions)
        return [self.decision] if self.decision is not None else []

    @classmethod
    def read(cls, path: Path) -> RunRecord:
        """The record in `path` (a run folder or its `result.json`).

        Raises:
            UserError: no such file, not JSON, or not a run record (the message says which field).
        """
        file = path / "result.json" if path.is_dir() else path
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{file} does not exist: the run has not finished (or the folder is no run).") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{str(file)!r} is not valid JSON ({exc.msg}); the run may have been interrupted.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{str(file)!r} cannot be read: {exc}") from exc
        if isinstance(data, dict):
            data.setdefault("version", 0)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UserError(f"{file} is not a run record: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RunRecord:
        """The record of a finishing run, from the fields its writer gathered (`ActiveRun.finish`).

        Raises:
            pydantic.ValidationError: a field the schema does not know, or of the wrong type: a
                writer's bug, caught before a file that readers cannot read is written.
        """
        return cls.model_validate({"version": RECORD_VERSION, **data})

    def to_json(self) -> dict[str, Any]:
        """The JSON object `result.json` holds: the fields the run's writer set (a kind of run
        leaves out the parts it lacks), nothing else."""
        return self.model_dump(mode="json", exclude_unset=True)


def schema() -> dict[str, Any]:
    """The JSON Schema of `result.json` (`docs/reference/result.schema.json`)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **RunRecord.model_json_schema(),
            "title": "amapreduce result.json"}


if __name__ == "__main__":
    print(json.dumps(schema(), indent=2, ensure_ascii=False))
