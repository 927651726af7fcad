"""The simulated memory model's writing style for batching hints, and their typed payloads.

The offline benchmark shows the experiential memory learning a batching rule per *shape* of
question. The simulated memory model (deterministic code, not an LLM) writes each hint as one
sentence and, as the memory prompts ask of any model, its typed advice after it:

    When each row of a one-column task matrix asks for 3 attributes, put up to 4 rows in one
    sub-agent batch (per_atom, batch_size 4): batches of 4 rows came back complete; batches of
    6 rows lost rows. ADVICE: {"strategy": "per_atom", "batch_size": 4, "applies_when": {"cols": [4, 4], "matrix_cols": [1, 1]}}

Only the typed payload (`advice_of`, `memory.advice.HintAdvice`) travels to the manager: the plan
stage computes from it which hints apply to the draft, and the simulated manager reads that, as an
LLM would. The sentence is the memory model's own style: `parse_hint` reads it back only inside
the simulated memory model (for hints of its own that lost their payload, and for the evidence of
a lossy size it keeps in the prose). No other simulated component parses it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from amapreduce.decision.model import Decision
from amapreduce.memory.advice import AppliesWhen, HintAdvice, render_hint, split_advice

__all__ = [
    "BatchingHint",
    "RowShape",
    "advice_of",
    "format_hint",
    "hint_applies",
    "hint_of_advice",
    "parse_hint",
    "read_hint",
    "write_hint",
]

_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_HINT = re.compile(
    r"when each row of an? (?P<width>\w+)-column task matrix asks for (?P<attrs>\d+) attributes?, "
    r"put up to (?P<rows>\d+) rows? in one sub-agent batch \((?P<strategy>per_atom|by_attr)\b[^)]*\)"
    r"(?P<evidence>.*)",
    re.IGNORECASE | re.DOTALL,
)
_LOSSY = re.compile(r"batches of (?P<n>\d+) rows? lost rows", re.IGNORECASE)

Strategy = Literal["per_atom", "by_attr"]


def _number_word(n: int) -> str:
    return _WORDS[n] if 0 <= n < len(_WORDS) else str(n)


def _word_number(word: str) -> int | None:
    low = word.lower()
    if low.isdigit():
        return int(low)
    return _WORDS.index(low) if low in _WORDS else None


@dataclass(frozen=True, kw_only=True)
class RowShape:
    """The structure a hint is keyed on: what one row of the task matrix asks a sub-agent for."""

    matrix_columns: int
    """Output columns the task matrix fills (the row's identifying values)."""
    attributes: int
    """Output columns the sub-agent must look up (all output columns minus the matrix's)."""

    @property
    def cells(self) -> int:
        """Output cells one row of an answer holds (keys included)."""
        return self.matrix_columns + self.attributes

    @classmethod
    def of(cls, decision: Decision | Mapping[str, Any] | RowShape) -> RowShape:
        """The row shape of a decision (validated, or the `mapreduce` arguments as a dict)."""
        if isinstance(decision, RowShape):
            return decision
        if isinstance(decision, Decision):
            filled = sum(1 for c in decision.resolved_matrix_columns if c is not None)
            return cls(matrix_columns=filled, attributes=len(decision.columns) - filled)
        matrix = decision.get("task_matrix") or [[]]
        first = matrix[0] if isinstance(matrix[0], Sequence) and not isinstance(matrix[0], str) else [matrix[0]]
        schema = decision.get("json_schema") or {}
        columns = schema.get("properties", schema) if isinstance(schema, Mapping) else schema
        declared = decision.get("matrix_columns")
        filled = sum(1 for c in declared if c is not None) if declared else len(first)
        return cls(matrix_columns=filled, attributes=max(0, len(columns) - filled))


@dataclass(frozen=True, kw_only=True)
class BatchingHint:
    """A batching rule for one row shape: how many rows one sub-agent batch should hold."""

    attributes: int
    """Attributes each row asks for (see `RowShape.attributes`)."""
    rows: int
    """Rows per sub-agent batch (per_atom `batch_size`, by_attr `max_group_size`)."""
    matrix_columns: int = 1
    """Columns of the task matrix (see `RowShape.matrix_columns`)."""
    strategy: Strategy = "per_atom"
    """`per_atom` chunks in matrix order; `by_attr` groups rows sharing the first matrix column."""
    lossy_rows: int | None = None
    """The smallest batch seen losing rows for this shape (evidence; None: none seen)."""

    @property
    def shape(self) -> RowShape:
        """The row shape this hint is about."""
        return RowShape(matrix_columns=self.matrix_columns, attributes=self.attributes)


def format_hint(hint: BatchingHint) -> str:
    """The hint as one sentence (the inverse of `parse_hint`)."""
    noun = "attribute" if hint.attributes == 1 else "attributes"
    rows = "row" if hint.rows == 1 else "rows"
    how = (f"per_atom, batch_size {hint.rows}" if hint.strategy == "per_atom"
           else f"by_attr on matrix column 0, max_group_size {hint.rows}")
    seen = f"batches of {hint.rows} {rows} came back complete"
    lost = (f"batches of {hint.lossy_rows} rows lost rows" if hint.lossy_rows is not None
            else "no larger batch has been seen losing rows")
    return (f"When each row of a {_number_word(hint.matrix_columns)}-column task matrix asks for {hint.attributes} "
            f"{noun}, put up to {hint.rows} {rows} in one sub-agent batch ({how}): {seen}; {lost}.")


def parse_hint(text: str) -> BatchingHint | None:
    """Read a hint sentence (a leading list marker is ignored); None when `text` is not one."""
    found = _HINT.search(text)
    if found is None:
        return None
    width = _word_number(found.group("width"))
    rows = int(found.group("rows"))
    if width is None or width < 1 or rows < 1:
        return None
    lossy = [int(m.group("n")) for m in _LOSSY.finditer(found.group("evidence"))]
    strategy: Strategy = "by_attr" if found.group("strategy").lower() == "by_attr" else "per_atom"
    return BatchingHint(attributes=int(found.group("attrs")), rows=rows, matrix_columns=width, strategy=strategy,
                        lossy_rows=min(lossy) if lossy else None)


def hint_applies(hint: BatchingHint, decision: Decision | Mapping[str, Any] | RowShape) -> bool:
    """Whether `hint` is about rows shaped like `decision`'s (by structure only, never by content)."""
    return hint.shape == RowShape.of(decision)


def advice_of(hint: BatchingHint) -> HintAdvice:
    """The typed payload of a hint: its choice, for exactly its row shape."""
    cells = hint.matrix_columns + hint.attributes
    return HintAdvice(strategy=hint.strategy, batch_size=hint.rows,
                      applies_when=AppliesWhen(cols=(cells, cells), matrix_cols=(hint.matrix_columns, hint.matrix_columns)))


def hint_of_advice(advice: HintAdvice, lossy_rows: int | None = None) -> BatchingHint | None:
    """The hint a payload stands for, when it is about one row shape and names a size (else None)."""
    when = advice.applies_when
    if when.cols is None or when.matrix_cols is None or when.cols[0] != when.cols[1] \
            or when.matrix_cols[0] != when.matrix_cols[1] or advice.batch_size is None or advice.strategy == "open":
        return None
    width = when.matrix_cols[0]
    return BatchingHint(attributes=max(0, when.cols[0] - width), rows=advice.batch_size, matrix_columns=width,
                        strategy=advice.strategy, lossy_rows=lossy_rows)


def write_hint(hint: BatchingHint) -> str:
    """The hint as the simulated memory model writes it: the sentence and its typed payload."""
    return render_hint(format_hint(hint), advice_of(hint))


def read_hint(line: str) -> BatchingHint | None:
    """A listed hint as the simulated memory model reads it back: the typed payload when there is
    one (its prose only for the lossy size), else its own sentence; None: neither."""
    text, advice, _problem = split_advice(line)
    prose = parse_hint(text)
    if advice is not None:
        return hint_of_advice(advice, prose.lossy_rows if prose is not None else None)
    return prose
