"""The simulated memory model: code that answers the experiential memory's prompts. It is **not an LLM**.

The offline benchmark must show the memory's whole learning loop (records → FINCH clusters →
distillation → retrieval by s = w + v → projection into the manager's prior) without a model
provider. `SimulatedMemoryModel` is a `FunctionModel` that answers the prompts of
`prompts/memory.yaml` as a real memory model would, reading **only what the prompt shows**:

* **projection** (`project_*`): the listed hints whose typed payload (` ADVICE: {...}`, or for a hint
  of its own without one, its own sentence) applies to the row shape of the draft decision shown (a
  payload about a range of shapes, as an imported rule may be, by its `applies_when` ranges),
  as a numbered list of at most `max_bullets` items each citing its hint's number (`[2]`), as the
  prompt asks; or one line saying that no stored hint applies to rows of that many attributes.
* **refinement** (`compare_*`, `success_*`): it reads the decision patterns shown (the records'
  `DecisionSummary.describe()` sentences, e.g. "58x1 task matrix; 4 output columns (...); batching
  per_atom with up to 4 rows per batch (15 batches); template: ..."). For every row shape with a
  successful case, the evidence is the largest rows-per-batch that succeeded, and the smallest
  larger one that did worse. It then ADDs a hint for a shape no listed rule covers, EDITs a rule
  whose size the evidence contradicts (raised to a larger successful size, or lowered below a
  weaker case's size), AGREEs with a rule the evidence confirms, within `max_ops` operations. A
  rule that would only restate the one-row-per-sub-agent default is never added: it teaches nothing.
* **merge** (`merge_*`): one hint per row shape, the one with the most rows per batch that no
  listed hint's evidence contradicts, as a numbered list within the limit.

Every hint it writes carries its typed payload after the sentence, as the prompts ask any model
(`amapreduce.demo.hints.write_hint`). The simulated manager never reads these sentences: it reads
the typed advice the plan stage computes (`memory.advice`), as an LLM manager gets it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_core import from_json
from smolagents.models import ChatMessage, MessageRole

from amapreduce.demo.hints import BatchingHint, RowShape, hint_applies, read_hint, write_hint
from amapreduce.llm.messages import message_text
from amapreduce.memory.advice import Shape, split_advice
from amapreduce.testing.scripted import FunctionModel, ModelInfo, Reply

__all__ = ["MEMORY_MODEL_ID", "CaseEvidence", "SimulatedMemoryModel", "read_patterns"]

MEMORY_MODEL_ID = "simulated/memory"

_PATTERN = re.compile(
    r"(?P<rows>\d+)x(?P<width>\d+) task matrix; (?P<n>\d+) output columns \(.*?\); "
    r"batching (?P<strategy>per_atom|by_attr|open)(?: with up to (?P<k>\d+) rows per batch)?"
    r"(?: \((?P<batches>\d+) batches\))?"
)
_NUMBERED = re.compile(r"^\s*(?P<n>\d+)\.\s+(?P<text>.+?)\s*$", re.MULTILINE)
_MAX_BULLETS = re.compile(r"(?:no\s+more\s+than|at\s+most)\s+(?P<n>\d+)\s+(?:numbered\s+)?insights", re.IGNORECASE)
_MAX_OPS = re.compile(r"at\s+most\s+(?P<n>\d+)\s+operations", re.IGNORECASE)
_LIMIT = re.compile(r"no\s+more\s+than\s+(?P<n>\d+)\s+refined\s+hints", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class CaseEvidence:
    """One decision pattern read from a prompt: its row shape, batching and outcome."""

    shape: RowShape
    rows_per_batch: int
    strategy: str
    """`per_atom` or `by_attr` (an `open` decision is read as chunks in matrix order)."""
    success: bool


def read_patterns(text: str, *, success: bool) -> list[CaseEvidence]:
    """Every `DecisionSummary` pattern sentence in `text` whose rows per batch can be told."""
    out = []
    for m in _PATTERN.finditer(text):
        rows, width, n = int(m.group("rows")), int(m.group("width")), int(m.group("n"))
        strategy = m.group("strategy")
        if m.group("k"):
            k = int(m.group("k"))
        elif strategy == "per_atom":
            k = 1  # per_atom without a batch size: one row per sub-agent
        elif m.group("batches") and int(m.group("batches")) > 0:
            k = -(-rows // int(m.group("batches")))  # the mean batch, rounded up
        else:
            continue  # a by_attr/open batching of unknown size says nothing about rows per batch
        out.append(CaseEvidence(shape=RowShape(matrix_columns=width, attributes=max(0, n - width)),
                                rows_per_batch=k, strategy="by_attr" if strategy == "by_attr" and width >= 2 else "per_atom",
                                success=success))
    return out


def _section(text: str, start: str, end: str | None) -> str:
    """The text between the heading `start` and the next heading `end` ("" when `start` is absent)."""
    head = text.find(start)
    if head < 0:
        return ""
    body = text[head + len(start):]
    if end is not None and (stop := body.find(end)) >= 0:
        body = body[:stop]
    return body


def _numbered(text: str) -> list[str]:
    return [m.group("text") for m in _NUMBERED.finditer(text)]


def _number(pattern: re.Pattern[str], text: str, default: int) -> int:
    found = pattern.search(text)
    return int(found.group("n")) if found else default


@dataclass
class _Shape:
    """The evidence about one row shape, gathered from the cases of one prompt."""

    shape: RowShape
    wins: list[CaseEvidence] = field(default_factory=list)
    losses: list[int] = field(default_factory=list)

    def target(self) -> BatchingHint | None:
        """The hint the evidence supports (None: no successful case)."""
        if not self.wins:
            return None
        best = max(self.wins, key=lambda c: (c.rows_per_batch, c.strategy == "per_atom"))
        worse = [k for k in self.losses if k > best.rows_per_batch]
        return BatchingHint(attributes=self.shape.attributes, matrix_columns=self.shape.matrix_columns,
                            rows=best.rows_per_batch, strategy="by_attr" if best.strategy == "by_attr" else "per_atom",
                            lossy_rows=min(worse) if worse else None)


def _evidence(cases: Iterable[CaseEvidence]) -> list[_Shape]:
    shapes: dict[RowShape, _Shape] = {}
    for case in cases:
        entry = shapes.setdefault(case.shape, _Shape(shape=case.shape))
        if case.success:
            entry.wins.append(case)
        else:
            entry.losses.append(case.rows_per_batch)
    return list(shapes.values())


def _operations(cases: list[CaseEvidence], rules: list[str], max_ops: int) -> list[str]:
    """ADD / EDIT / AGREE lines for the evidence of `cases` against the numbered `rules`."""
    parsed = [(k, text, hint) for k, text in enumerate(rules, 1) if (hint := read_hint(text)) is not None]
    ops: list[str] = []
    for entry in _evidence(cases):
        mine = [(k, text, hint) for k, text, hint in parsed if hint_applies(hint, entry.shape)]
        target = entry.target()
        if target is None:  # only weaker cases: lower a rule that asks for a batch that lost rows
            lost = min(entry.losses)
            for k, _text, hint in mine[:1]:
                if hint.rows >= lost > 2:
                    ops.append(f"EDIT {k}: {write_hint(replace(hint, rows=lost - 1, lossy_rows=lost))}")
            continue
        if not mine:
            if target.rows > 1:  # "one row per sub-agent" is the manager's default: nothing to teach
                ops.append(f"ADD: {write_hint(target)}")
            continue
        k, text, hint = mine[0]
        if (hint.rows, hint.strategy) == (target.rows, target.strategy):
            known = hint.lossy_rows
            if target.lossy_rows is not None and (known is None or target.lossy_rows < known):
                ops.append(f"EDIT {k}: {write_hint(target)}")  # same advice, new evidence of a lossy size
            else:
                ops.append(f"AGREE {k}: {text}")
        elif hint.rows < target.rows:
            ops.append(f"EDIT {k}: {write_hint(target)}")  # a larger batch succeeded: raise it
        elif any(target.rows < lost <= hint.rows for lost in entry.losses):
            ops.append(f"EDIT {k}: {write_hint(target)}")  # a weaker case lost rows at the rule's size: lower it
    return ops[:max_ops]


def _merge(hints: list[str], limit: int) -> list[str]:
    """One hint per row shape (the largest batch no listed evidence contradicts), then the rest."""
    groups: dict[RowShape, list[BatchingHint]] = {}
    order: list[RowShape | str] = []
    for text in hints:
        hint = read_hint(text)
        if hint is None:
            order.append(text)  # not a batching hint: kept as written, after nothing is invented
            continue
        if hint.shape not in groups:
            order.append(hint.shape)
        groups.setdefault(hint.shape, []).append(hint)
    merged: list[str] = []
    for item in order:
        if isinstance(item, str):
            merged.append(item)
            continue
        group = groups[item]
        lossy = [h.lossy_rows for h in group if h.lossy_rows is not None]
        floor = min(lossy) if lossy else None
        safe = [h for h in group if floor is None or h.rows < floor] or [min(group, key=lambda h: h.rows)]
        best = max(safe, key=lambda h: h.rows)  # first listed wins a tie (max keeps the first)
        merged.append(write_hint(replace(best, lossy_rows=floor if floor is not None and floor > best.rows else None)))
    return merged[:limit]


_MORE_ROWS = re.compile(r"^\.\.\. \((?P<n>\d+) more rows\)$")


def _projects(line: str, decision: dict[str, Any], shape: RowShape) -> bool:
    """Whether the listed hint `line` applies to the draft `decision` (its row shape `shape`): a hint
    about one row shape by that shape (`read_hint`), any other typed payload by its `applies_when`
    ranges (rows counted from the matrix shown, cut to a few rows and `... (N more rows)`)."""
    hint = read_hint(line)
    if hint is not None:
        return hint_applies(hint, shape)
    advice = split_advice(line)[1]
    if advice is None:
        return False
    matrix = decision["task_matrix"]
    rows = sum(1 for row in matrix if isinstance(row, list))
    rows += sum(int(m.group("n")) for row in matrix if isinstance(row, str) and (m := _MORE_ROWS.match(row)))
    return advice.applies_when.matches(Shape(rows=rows, matrix_cols=shape.matrix_columns, cols=shape.cells))


class SimulatedMemoryModel(FunctionModel):
    """Deterministic code playing the experiential memory's model (see the module docstring)."""

    def __init__(self, *, model_id: str = MEMORY_MODEL_ID) -> None:
        super().__init__(self._reply, model_id=model_id)

    def _reply(self, messages: list[ChatMessage], info: ModelInfo) -> Reply:
        system = "\n".join(message_text(m) for m in messages if m.role in (MessageRole.SYSTEM, "system"))
        user = "\n".join(message_text(m) for m in messages if m.role in (MessageRole.USER, "user"))
        if "### Historical hints" in user:
            return self._project(system, user)
        if "## WEAKER decision" in user:
            cases = (read_patterns(_section(user, "## SUCCESSFUL decision", "## WEAKER decision"), success=True)
                     + read_patterns(_section(user, "## WEAKER decision", "## EXISTING RULES"), success=False))
            return self._refine(cases, user)
        if "## SUCCESSFUL decisions" in user:
            return self._refine(read_patterns(_section(user, "## SUCCESSFUL decisions", "## EXISTING RULES"),
                                              success=True), user)
        if "## Current batching hints" in user:
            hints = _numbered(_section(user, "## Current batching hints", "Consolidate"))
            merged = _merge(hints, _number(_LIMIT, user, len(hints)))
            return "\n".join(f"{k}. {t}" for k, t in enumerate(merged, 1))
        return "The simulated memory model only answers the memory prompts of prompts/memory.yaml."

    @staticmethod
    def _project(system: str, user: str) -> str:
        limit = _number(_MAX_BULLETS, system + "\n" + user, 3)
        shown = _section(user, "### Current MapReduce inputs", "### Agent's role").strip()
        hints = _numbered(_section(user, "### Historical hints", "### Your output"))
        try:
            decision = from_json(shown, allow_partial=True) if shown.startswith("{") else None
        except ValueError:
            decision = None
        if not isinstance(decision, dict) or not decision.get("task_matrix"):
            return "1. No stored hint can be matched: the draft decision is not shown."
        shape = RowShape.of(decision)
        chosen = [(n, t) for n, t in enumerate(hints, 1) if _projects(t, decision, shape)]
        if not chosen:
            noun = "attribute" if shape.attributes == 1 else "attributes"
            return f"1. No stored hint applies to rows of {shape.attributes} {noun}."
        # each insight is the hint's sentence (its payload left out: the plan stage hands payloads over
        # typed), citing the hint's number as the projection prompt asks
        return "\n".join(f"{k}. {split_advice(t)[0]} [{n}]" for k, (n, t) in enumerate(chosen[:limit], 1))

    @staticmethod
    def _refine(cases: list[CaseEvidence], user: str) -> str:
        rules = _numbered(_section(user, "## EXISTING RULES", "\n\n"))
        ops = _operations(cases, rules, _number(_MAX_OPS, user, 4))
        return "\n".join(ops) if ops else "No operation: the decisions shown give no batching evidence."
