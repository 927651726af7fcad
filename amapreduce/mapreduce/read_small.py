"""The read solver's small-model way: code grounds each value the model wrote, and a cell no line
states is chosen by the model from the spans of its column's best line.

Measured with SmolLM2-135M (llama-cpp-python's server, the sandbox atlas, 12 countries x 3
columns, `benchmarks/bench_real_model.py`): the read solver's batch call alone got about a fifth
of the cells right and marked a wrong one verified; the model's values were often right where its
quotes were not (it quoted the value itself, or the ISO code's line for the ISO3 code). In this way,
`ReadSolver(small=True)` (`auto` for windows under 4,096 tokens and ids naming a size under 3B):

1. One call per sub-question (each yields one row) with a short column-led excerpt, the reply
   held to the row schema with quotes first (`prompts/read_solver.yaml` `request_small`).
2. Each value is grounded by code (`mapreduce.grounding.ground`) in the pages read: a line that
   names the column and states the value becomes its quote; a value a few letters off such a line
   is snapped to it; a value no column line states keeps no quote.
3. A cell left without a grounded value gets one more call: the column's best line (`cell`), the
   reply held to an `enum` of that line's spans (`grounding.choices`), so the grammar lets the
   model answer only with words of the page. When a line offers one span the grammar leaves the
   model no choice: the value is then read from the page by code, and the run's trace counts such
   cells apart (`grounding.single`). A cell still ungrounded is left empty for the delta-patch
   round, which reads the next hit, so a value the page does not state never reaches the table.

So a verified cell's quote is always a line of a page read that names the column and states the
value. The trace's `grounding` counts each way (`stated`, `snapped`, `chosen`, `single`, `empty`).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smolagents.models import ChatMessage, MessageRole, Model

from amapreduce._modeljson import read_json
from amapreduce.decision.columns import normalize_key_name
from amapreduce.errors import AmapreduceError
from amapreduce.llm.messages import message_text
from amapreduce.llm.models import is_reasoning_model
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.grounding import ColumnLine, Grounded, choices, column_lines, ground
from amapreduce.mapreduce.replies import cell_text
from amapreduce.mapreduce.result import RUN_STOPPING_ERRORS
from amapreduce.prompts import render_prompt
from amapreduce.table.evidence import normalize_quote
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from amapreduce.decision.columns import ColumnSpec

__all__ = ["CELL_REPLY_TOKENS", "GroundedPage", "ground_row"]

CELL_REPLY_TOKENS = 64
"""`max_tokens` of a cell's choice: one span of a line, in a one-key JSON object."""


@dataclass(frozen=True)
class GroundedPage:
    """One page read for a sub-question (or, when no page could be read, one search result): where
    it was read, its title and its text."""

    url: str
    title: str
    text: str


def _value(row: Mapping[str, Any], column: str) -> str:
    folded = {normalize_key_name(str(k)): v for k, v in row.items()}
    return cell_text(folded.get(normalize_key_name(column))) or ""


def ground_row(model: Model, row: Mapping[str, Any], columns: Sequence[ColumnSpec], pages: Sequence[GroundedPage],
               entity: Sequence[str], *, check: Callable[[], None], errors: list[str]) -> tuple[dict[str, Any],
                                                                                              Usage, Counter[str]]:
    """The sub-question's one row with each column's value grounded in `pages` (see the module
    doc), the usage of the cell calls it made, and how many cells went each way. `check` raises
    once the attempt is given up; a cell call that fails is noted in `errors` and leaves its cell
    empty (errors that stop a run propagate)."""
    out: dict[str, Any] = {"task": 1}
    quotes: dict[str, dict[str, str]] = {}
    usage = Usage()
    ways: Counter[str] = Counter()
    for column in columns:
        lines = [_lines(page, column, entity) for page in pages]
        found, url = _grounded(_value(row, column.name), column, pages, lines, entity)
        how = found.how
        if how in ("ungrounded", "empty"):
            check()
            found, url, how, used = _choose(model, column, pages, lines, entity, errors)
            usage = usage + used
        ways[how] += 1
        out[column.name] = found.value if found.quote else ""
        if found.quote:
            quotes[column.name] = {"quote": found.quote, "url": url}
    out["quotes"] = quotes
    if pages:
        out["source"] = next(iter(q["url"] for q in quotes.values()), pages[0].url)
    return out, usage, ways


def _lines(page: GroundedPage, column: ColumnSpec, entity: Sequence[str]) -> list[ColumnLine]:
    """The column's lines of `page` that speak of `entity`: all of them on a page about it (its
    title or first heading names it), else those that name it (a row of a wide table). Measured: a
    patch round that read the next hit for Andorra got Spain's page, whose capital line is Madrid."""
    lines = column_lines(page.text, column)
    names = [normalize_quote(e) for e in entity if e.strip()]
    heading = next((line for line in page.text.splitlines() if line.strip()), "")
    if not names or any(n in normalize_quote(f"{page.title}\n{heading}") for n in names):
        return lines
    return [line for line in lines if any(n in normalize_quote(line.text) for n in names)]


def _grounded(value: str, column: ColumnSpec, pages: Sequence[GroundedPage], lines: Sequence[Sequence[ColumnLine]],
              entity: Sequence[str]) -> tuple[Grounded, str]:
    """`value` grounded in the first page with a column line that states it (or is near it);
    `lines`: each page's column lines (`_lines`)."""
    for page, own in zip(pages, lines, strict=True):
        found = ground(value, page.text, column, entity=entity, lines=own)
        if found.quote:
            return found, page.url
    return Grounded(value, "", "empty" if not value.strip() else "ungrounded"), ""


def _choose(model: Model, column: ColumnSpec, pages: Sequence[GroundedPage], lines: Sequence[Sequence[ColumnLine]],
            entity: Sequence[str], errors: list[str]) -> tuple[Grounded, str, str, Usage]:
    """The cell chosen by the model among the spans of the column's best line on the first page
    that has one: (grounded value, its page's URL, how, the call's usage)."""
    for page, own in zip(pages, lines, strict=True):
        options = choices(own[0], column, entity) if own else []
        if not options:
            continue
        if len(options) == 1:
            return ground(options[0], page.text, column, entity=entity, lines=own[:1]), page.url, "single", Usage()
        prompt = render_prompt("read_solver", "cell", title=page.title, line=own[0].text, column=column,
                               entity=", ".join(entity))
        schema = {"type": "object", "properties": {column.name: {"enum": options}}, "required": [column.name],
                  "additionalProperties": False}
        extra: dict[str, Any] = {} if is_reasoning_model(model.model_id or "") else {"max_tokens": CELL_REPLY_TOKENS}
        messages = [ChatMessage(role=MessageRole.SYSTEM, content=[{"type": "text", "text": _system_prompt()}]),
                    ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": prompt}])]
        response_format = {"type": "json_schema", "json_schema": {"name": "cell", "schema": schema, "strict": True}}
        try:
            reply = model.generate(messages, response_format=response_format, **extra)
        except RUN_STOPPING_ERRORS:
            raise
        except AmapreduceError as exc:  # this cell stays empty; the patch round asks again
            errors.append(f"cell {column.name!r}: {type(exc).__name__}: {redact_secrets(str(exc))}")
            return Grounded("", "", "empty"), "", "empty", Usage(requests=1)
        # a server without a grammar may write more around the object: the engine's lenient reader
        answer = read_json(message_text(reply), accept=lambda v: isinstance(v, dict))
        value = _value(answer, column.name) if isinstance(answer, dict) else ""
        found = ground(value, page.text, column, entity=entity, lines=own[:1]) if value in options else \
            Grounded("", "", "empty")
        return found, page.url if found.quote else "", "chosen" if found.quote else "empty", Usage.of_reply(reply)
    return Grounded("", "", "empty"), "", "empty", Usage()


@functools.cache
def _system_prompt() -> str:
    """The read solver's system prompt (`prompts/read_solver.yaml` `system`), shared with its row calls."""
    return render_prompt("read_solver", "system")
