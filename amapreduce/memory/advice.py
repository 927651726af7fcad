"""Structured advice: what the memory's records measured about batching choices, computed in code.

The prior Δ_q is prose for the manager (hints and exemplars). Beside it the plan stage hands over
typed advice, which needs no reading between the lines:

* **Measured choices.** The retrieved neighbourhood N(q) (positives and negatives) is filtered to
  the records whose decision had the draft's *shape* (the same task-matrix width and the same
  number of output columns) and grouped by batching *choice* (strategy and rows per batch). Per
  choice: n, successes, success rate, mean utility, sub-agents and tokens per row, wall time.
* **A proposal** Θ′ (strategy and size only, never the matrix), by one documented rule
  (`PROPOSAL_RULE`): a choice is *reliable* when at least `min_advice_records` similar records
  made it and every one of them passed; the cheapest reliable choice per row is proposed when the
  draft's own choice differs and was unseen, failed at least once, or costs more than
  `advice_margin` (a share) per row.
* **Typed hint payloads** (`HintAdvice`): a hint may carry a concrete choice and when it applies,
  e.g. `{"strategy": "per_atom", "batch_size": 3, "applies_when": {"cols": [3, 5]}}`. Memory-model
  replies and prompts write it after the hint's text as ` ADVICE: {json}` (`split_advice`,
  `render_hint`); the store keeps it beside the text.

`credit_rule: used` (`MemoryConfig`) credits a hint only when the executed decision followed its
payload (`HintAdvice.verdict` is "followed"), or, for a hint without one, when the projection
cited it for this draft. With `relative_credit` a run that followed a hint is also judged against
the similar records its prior measured (`worse_than_records`, `RELATIVE_RULE`): a run that passed
but cost more per row than a reliable choice of those records did worse, and its hints are debited.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from amapreduce.decision.strategy import ByAttr, OpenStrategy

if TYPE_CHECKING:
    from amapreduce.decision.model import Decision
    from amapreduce.memory.config import MemoryConfig
    from amapreduce.memory.records import DecisionSummary, TraceSummary

__all__ = [
    "PROPOSAL_RULE",
    "RELATIVE_RULE",
    "Advice",
    "AppliesWhen",
    "Choice",
    "ChoiceStats",
    "HintAdvice",
    "Outcome",
    "Proposal",
    "Shape",
    "apply_choice",
    "compute_advice",
    "render_hint",
    "split_advice",
    "worse_than_records",
]

Strategy = Literal["per_atom", "by_attr", "open"]
Verdict = Literal["followed", "contradicted", "not_applicable"]

PROPOSAL_RULE = (
    "Similar records: the neighbourhood's records whose decision had the draft's task-matrix width and number of "
    "output columns. A choice (strategy, rows per batch) is reliable when at least {min_records} similar records made "
    "it and all of them passed. The reliable choice with the fewest tokens per row (then sub-agents per row) is "
    "proposed when the draft's choice differs from it and was unseen, failed at least once, or costs over "
    "{margin:.0%} more per row."
)

RELATIVE_RULE = (
    "A run that followed a hint did worse than the family's records when it failed, or when the similar records its "
    "prior measured hold a reliable choice other than the run's (at least {min_records} records, all passed) and the "
    "run cost over {margin:.0%} more per row (tokens, else sub-agents) than the cheapest such choice."
)

_MARKER = re.compile(r"\s*\bADVICE\s*:\s*(?=\{)", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A decision's shape as the advice compares it."""

    rows: int
    """Task-matrix rows."""
    matrix_cols: int
    """Task-matrix columns."""
    cols: int
    """Output columns."""

    @classmethod
    def of(cls, decision: Decision | DecisionSummary) -> Shape:
        """The shape of a validated decision or a stored summary."""
        from amapreduce.decision.model import Decision

        if isinstance(decision, Decision):
            matrix = decision.task_matrix
            width = len(matrix[0]) if matrix else len(decision.discover.resolved_key_columns) if decision.discover else 0
            return cls(rows=len(matrix), matrix_cols=width, cols=len(decision.columns))
        return cls(rows=decision.rows, matrix_cols=decision.cols, cols=len(decision.columns))

    def to_json(self) -> dict[str, int]:
        """`{"rows", "matrix_cols", "cols"}`."""
        return {"rows": self.rows, "matrix_cols": self.matrix_cols, "cols": self.cols}


@dataclass(frozen=True, kw_only=True, order=True)
class Choice:
    """A batching choice: the strategy and its rows per batch (per_atom's `batch_size`, by_attr's
    `max_group_size`, open's `chunk_size`; None: the strategy's own default, whole groups)."""

    strategy: str
    batch_size: int | None

    @classmethod
    def make(cls, strategy: str, batch_size: int | None) -> Choice:
        """Normalised: per_atom without a size is one row per batch."""
        return cls(strategy=strategy, batch_size=batch_size if batch_size or strategy != "per_atom" else 1)

    @classmethod
    def of(cls, decision: Decision | DecisionSummary) -> Choice:
        """The choice a decision (or its stored summary) made."""
        from amapreduce.decision.model import Decision

        if not isinstance(decision, Decision):
            return cls.make(decision.strategy or "per_atom", decision.batch_size)
        strategy = decision.batch_strategy
        if isinstance(strategy, ByAttr):
            return cls.make("by_attr", strategy.max_group_size)
        if isinstance(strategy, OpenStrategy):
            return cls.make("open", strategy.chunk_size or decision.batch_size)
        return cls.make("per_atom", decision.batch_size)

    def to_json(self) -> dict[str, Any]:
        """`{"strategy", "batch_size"}`."""
        return {"strategy": self.strategy, "batch_size": self.batch_size}


def _range(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a range is a number or [low, high]")
    if isinstance(value, int):
        return (value, value)
    return value


class AppliesWhen(BaseModel):
    """When a hint's advice applies: inclusive ranges over the decision's shape (None: any)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cols: tuple[int, int] | None = None
    """Output columns, `[low, high]` (a single number means exactly that)."""
    matrix_cols: tuple[int, int] | None = None
    """Task-matrix columns."""
    rows: tuple[int, int] | None = None
    """Task-matrix rows."""

    @field_validator("cols", "matrix_cols", "rows", mode="before")
    @classmethod
    def _as_range(cls, value: Any) -> Any:
        return _range(value)

    @field_validator("cols", "matrix_cols", "rows")
    @classmethod
    def _ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 0 <= value[0] <= value[1]:
            raise ValueError(f"a range must be [low, high] with 0 <= low <= high, got {list(value)}")
        return value

    def matches(self, shape: Shape) -> bool:
        """Whether `shape` lies in every range given."""
        pairs = ((self.cols, shape.cols), (self.matrix_cols, shape.matrix_cols), (self.rows, shape.rows))
        return all(bounds is None or bounds[0] <= value <= bounds[1] for bounds, value in pairs)


class HintAdvice(BaseModel):
    """A hint's typed payload: a concrete batching choice and the shapes it applies to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: Strategy
    batch_size: int | None = Field(default=None, ge=1, le=100_000)
    """Rows per batch (per_atom `batch_size`, by_attr `max_group_size`, open `chunk_size`)."""
    applies_when: AppliesWhen = AppliesWhen()

    @property
    def choice(self) -> Choice:
        """The choice the hint advises."""
        return Choice.make(self.strategy, self.batch_size)

    def verdict(self, decision: Decision | DecisionSummary) -> Verdict:
        """How a decision stands to this advice: it followed it, contradicted it (the advice applies
        to its shape and it chose otherwise), or the advice is about other shapes."""
        if not self.applies_when.matches(Shape.of(decision)):
            return "not_applicable"
        return "followed" if Choice.of(decision) == self.choice else "contradicted"

    def to_json(self) -> dict[str, Any]:
        """The payload as stored and shown (ranges as lists, unset parts left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def split_advice(text: str) -> tuple[str, HintAdvice | None, str | None]:
    """A hint line as a model writes it: `(text, advice, problem)`. The payload is the JSON object
    after the last ` ADVICE:` marker; one that does not validate is dropped (the text stays) and
    `problem` says why."""
    found = list(_MARKER.finditer(text))
    if not found:
        return " ".join(text.split()), None, None
    head, raw = text[: found[-1].start()], text[found[-1].end():].strip().rstrip(".")
    head = " ".join(head.split())
    try:
        return head, HintAdvice.model_validate(json.loads(raw)), None
    except (ValueError, ValidationError) as exc:
        return head, None, f"advice payload not used ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"


def render_hint(text: str, advice: HintAdvice | Mapping[str, Any] | None) -> str:
    """A hint as prompts show it: its text, then ` ADVICE: {json}` when it has a payload."""
    if advice is None:
        return text
    payload = advice.to_json() if isinstance(advice, HintAdvice) else dict(advice)
    return f"{text} ADVICE: {json.dumps(payload, separators=(', ', ': '))}"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one retrieved record says about its choice."""

    record_id: str
    decision: DecisionSummary
    trace: TraceSummary
    metrics: Mapping[str, Any]
    label: bool


class ChoiceStats(BaseModel):
    """One batching choice as the similar records measured it."""

    model_config = ConfigDict(frozen=True)

    strategy: str
    batch_size: int | None
    n: int
    successes: int
    success_rate: float
    mean_utility: float | None
    subagents_per_row: float | None
    tokens_per_row: float | None
    mean_subagents: float | None
    mean_tokens: float | None
    mean_wall_s: float | None
    records: list[str]

    @property
    def choice(self) -> Choice:
        """The choice these figures are about."""
        return Choice.make(self.strategy, self.batch_size)


class Proposal(BaseModel):
    """Θ′: the draft with this strategy and size (its matrix, template and schema unchanged)."""

    model_config = ConfigDict(frozen=True)

    strategy: str
    batch_size: int | None
    why: str
    evidence: ChoiceStats
    draft: ChoiceStats | None
    """The draft's own choice as the similar records measured it (None: unseen)."""


class Advice(BaseModel):
    """The plan stage's typed advice for one draft (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    shape: dict[str, int]
    draft: dict[str, Any]
    similar_records: int
    choices: list[ChoiceStats]
    proposal: Proposal | None
    rule: str
    hints: list[dict[str, Any]] = Field(default_factory=list)
    """The prior's hints with a typed payload, `{"id", "advice", "applies"}` (applies: to this draft)."""

    def to_json(self) -> dict[str, Any]:
        """As the plan stage and `memory search --json` show it."""
        return self.model_dump(mode="json")


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 6) if known else None


def _utility(metrics: Mapping[str, Any]) -> float | None:
    from amapreduce.memory.labels import confidence

    value = metrics.get("utility")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return confidence(metrics) if metrics else None


def _stats(choice: Choice, outcomes: Sequence[Outcome]) -> ChoiceStats:
    def per_row(value: float | None, o: Outcome) -> float | None:
        return value / o.decision.rows if value is not None and o.decision.rows else None

    successes = sum(o.label for o in outcomes)
    return ChoiceStats(
        strategy=choice.strategy, batch_size=choice.batch_size, n=len(outcomes), successes=successes,
        success_rate=round(successes / len(outcomes), 6),
        mean_utility=_mean([_utility(o.metrics) for o in outcomes]),
        subagents_per_row=_mean([per_row(o.trace.batches, o) for o in outcomes]),
        tokens_per_row=_mean([per_row(o.trace.tokens, o) for o in outcomes]),
        mean_subagents=_mean([o.trace.batches for o in outcomes]),
        mean_tokens=_mean([o.trace.tokens for o in outcomes]),
        mean_wall_s=_mean([o.trace.delay_s for o in outcomes]),
        records=[o.record_id for o in outcomes],
    )


def _cost(stats: ChoiceStats, by_tokens: bool) -> tuple[float, float, int]:
    tokens = stats.tokens_per_row if by_tokens and stats.tokens_per_row is not None else 0.0
    subagents = stats.subagents_per_row if stats.subagents_per_row is not None else float("inf")
    return (tokens, subagents, -(stats.batch_size or 0))


def compute_advice(decision: Decision, outcomes: Sequence[Outcome], config: MemoryConfig,
                   hints: Sequence[tuple[str, HintAdvice]] = ()) -> Advice:
    """The typed advice for the draft `decision` from the retrieved records' `outcomes` (and the
    typed payloads of the prior's `hints`), by `PROPOSAL_RULE`."""
    shape, draft = Shape.of(decision), Choice.of(decision)
    similar = [o for o in outcomes
               if (o.decision.cols, len(o.decision.columns)) == (shape.matrix_cols, shape.cols)]
    groups: dict[Choice, list[Outcome]] = {}
    for o in similar:
        groups.setdefault(Choice.of(o.decision), []).append(o)
    choices = [_stats(c, groups[c]) for c in sorted(groups)]
    seen = {s.choice: s for s in choices}
    reliable = [s for s in choices if s.n >= config.min_advice_records and s.successes == s.n]
    by_tokens = bool(reliable) and all(s.tokens_per_row is not None for s in reliable)
    proposal = None
    if reliable:
        best = min(reliable, key=lambda s: _cost(s, by_tokens))
        mine = seen.get(draft)
        if best.choice != draft:
            why = None
            if mine is None:
                why = f"the draft's choice ({_label(draft)}) is unseen in {len(similar)} similar records"
            elif mine.successes < mine.n:
                why = f"the draft's choice ({_label(draft)}) failed in {mine.n - mine.successes} of {mine.n} similar records"
            else:
                theirs, ours = _cost(best, by_tokens), _cost(mine, by_tokens)
                unit = 0 if by_tokens else 1
                if ours[unit] > theirs[unit] * (1 + config.advice_margin):
                    what = "tokens" if by_tokens else "sub-agents"
                    why = (f"the draft's choice ({_label(draft)}) used {ours[unit]:.3g} {what} per row against "
                           f"{theirs[unit]:.3g}")
            if why is not None:
                proposal = Proposal(strategy=best.strategy, batch_size=best.batch_size, draft=mine, evidence=best,
                                    why=f"{_label(best.choice)} passed in all {best.n} similar records; {why}.")
    return Advice(shape=shape.to_json(), draft=draft.to_json(), similar_records=len(similar), choices=choices,
                  proposal=proposal,
                  rule=PROPOSAL_RULE.format(min_records=config.min_advice_records, margin=config.advice_margin),
                  hints=[{"id": hid, "advice": a.to_json(), "applies": a.applies_when.matches(shape)} for hid, a in hints])


def _label(choice: Choice) -> str:
    size = "whole groups" if choice.batch_size is None else f"{choice.batch_size} rows per batch"
    return f"{choice.strategy}, {size}"


def apply_choice(decision: Decision, strategy: str, batch_size: int | None) -> Decision:
    """`decision` with its batching replaced (strategy and size only; matrix, template and schema kept)."""
    from amapreduce.decision.model import Decision

    data = decision.model_dump(mode="json", exclude_none=True)
    current = decision.batch_strategy
    rationale = "applied the memory's advice"
    if strategy == "by_attr":
        spec: dict[str, Any] = (current.model_dump(mode="json", exclude_none=True) if isinstance(current, ByAttr)
                                else {"type": "by_attr", "attribute_index": 0})
        spec.pop("max_group_size", None)
        if batch_size:
            spec["max_group_size"] = batch_size
        data["batch_strategy"] = {**spec, "rationale": rationale}
        data.pop("batch_size", None)
    elif strategy == "open":
        spec = current.model_dump(mode="json", exclude_none=True) if isinstance(current, OpenStrategy) else {"type": "open"}
        data["batch_strategy"] = {**spec, "chunk_size": batch_size or 1, "rationale": rationale}
    else:
        data["batch_strategy"] = {"type": "per_atom", "rationale": rationale}
        data["batch_size"] = batch_size or 1
    return Decision.parse(data)


def worse_than_records(decision: DecisionSummary, trace: TraceSummary, advice: Mapping[str, Any] | None,
                       config: MemoryConfig) -> str | None:
    """Why a run that passed did worse than the family's records (`RELATIVE_RULE`), or None: not
    worse, or nothing to compare with. `advice` is the typed advice of the run's prior
    (`Advice.to_json()`): its `choices` are the similar records as the run's plan stage measured them."""
    if not advice or not decision.rows or advice.get("shape") != Shape.of(decision).to_json():
        return None
    try:
        choices = [ChoiceStats.model_validate(c) for c in advice.get("choices") or []]
    except ValidationError:
        return None  # a hand-edited prior: no comparison rather than a wrong one
    mine = Choice.of(decision)
    reliable = [s for s in choices if s.choice != mine and s.n >= config.min_advice_records and s.successes == s.n]
    by_tokens = trace.tokens is not None and bool(reliable) and all(s.tokens_per_row is not None for s in reliable)
    spent = trace.tokens if by_tokens else trace.batches
    if not reliable or spent is None:
        return None
    best = min(reliable, key=lambda s: _cost(s, by_tokens))
    theirs = _cost(best, by_tokens)[0 if by_tokens else 1]
    ours = spent / decision.rows
    if ours <= theirs * (1 + config.advice_margin):
        return None
    unit = "tokens" if by_tokens else "sub-agents"
    return (f"{ours:.3g} {unit} per row against {theirs:.3g} for {_label(best.choice)} in {best.n} similar records "
            "that all passed")
