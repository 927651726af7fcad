"""`ReadSolver`: code searches and reads, the model fills a batch's rows in one structured call.

Why a second solver: a tool-calling agent loop needs a model that calls tools reliably. A small
local model (SmolLM2-135M behind llama-cpp-python's server) filled 0 of 30 cells as a
`SmolagentsSolver` sub-agent, yet given the page text in its prompt and a reply held to a schema it
extracted 12 of 15 cells right. So here the code does what the agent's tools would: for each
sub-question it searches with the sub-question's text, reads the best hits, cuts each page to the
passages that mention the entity, and asks the model once per attempt, with OpenAI's `json_schema`
response format (the endpoint layer, `llm.dialect`, turns it into the server's own dialect, or into
a schema written into the prompt). Any model gets fewer calls this way, too.

One attempt:

1. Search, read, record. Each sub-question's hits are taken in rank order; a hit this solver has
   already read for the same sub-question in an earlier attempt is skipped, so a retry or a
   delta-patch round reads the next hit (when nothing new is left, it reads from the top again).
   A page whose crawl fails is skipped; errors that stop a run (`RUN_STOPPING_ERRORS`: a spent
   budget, a search backend that stays down) propagate. Every result and page is recorded with
   `table.evidence.record_fetched` exactly as the web tools record them, so the engine verifies
   each quote against what was really read.
2. Excerpts. A page is split into lines (long lines into sentences); each is scored by the
   sub-question's words it holds (the entity's capitalised words weigh most, column names next,
   rarer words on the page more than common ones); the best are kept up to a character budget,
   with the heading and the table header they belong under, in page order. The budget is what the
   model's context window (`EndpointCapabilities.context_window`, else 8,192 tokens) leaves after
   the fixed prompt and the reply, at 3 characters a token, shared by the batch's sub-questions
   and capped per sub-question.
3. One call: system = `prompts/read_solver.yaml` `system`, user = columns and context (shared by
   every call of a decision: first, for the servers' prefix caches), then the sub-questions and
   their excerpts. Its `max_tokens` is sized to the rows asked (not sent to reasoning models, whose
   APIs refuse it and whose thinking would spend it). A prompt the server finds too long for its
   context halves the excerpts and is asked again, twice at most; the smaller share is kept for
   the solver's later attempts.
4. The reply is read with the engine's own reader of rows (`mapreduce.replies.parse_reply`, on
   `_modeljson`): a reply cut short keeps only its closed rows; one with no JSON rows is a
   `SolverError`, which the engine retries. Rows are returned as the model wrote them: a value
   without a quote, or with a source that was not read, is left for the engine's verification to
   mark, never repaired here.

Which solver a run uses (`session.parts.build_parts`, `Settings.solver`, `--solver`): `agent` the
`SmolagentsSolver`, `read` this one, and `auto` this one when the sub-agent model's endpoint
capabilities exist and show no reliable agent loop (`EndpointCapabilities.tool_calling`: neither
`tool_choice` `required` nor `auto` made the model call a tool; `--tool-choice off` says so too), or when its model
id names a size under 3B parameters (`looks_small`: `smollm2-135m`, `qwen2.5-0.5b`), else the agent.
The read solver needs the run's web service (`Reader`); with web tools that expose none, `auto`
keeps the agent and `read` is a `ConfigError`. The run's trace says which solver it used and why
(a `solver` line).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from smolagents.models import ChatMessage, MessageRole, Model

from amapreduce.errors import AmapreduceError, BatchTimeout, SolverError
from amapreduce.llm.dialect import schema_instruction
from amapreduce.llm.messages import message_text
from amapreduce.llm.models import ManagedModel, is_reasoning_model
from amapreduce.llm.retry import context_overflow
from amapreduce.llm.usage import Usage
from amapreduce.mapreduce.excerpts import excerpt, query_terms
from amapreduce.mapreduce.read_small import GroundedPage, ground_row
from amapreduce.mapreduce.replies import parse_reply
from amapreduce.mapreduce.result import RUN_STOPPING_ERRORS
from amapreduce.mapreduce.solver import BatchRequest, SolverReply, reply_tokens
from amapreduce.prompts import render_prompt
from amapreduce.settings import default_setting
from amapreduce.table.evidence import record_fetched
from amapreduce.trace import redact_secrets

if TYPE_CHECKING:
    from amapreduce.decision.columns import ColumnSpec
    from amapreduce.llm.endpoint import EndpointCapabilities

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "ReadPage",
    "ReadSolver",
    "Reader",
    "SearchHit",
    "asked_columns",
    "looks_small",
    "rows_per_task",
    "rows_schema",
    "search_query",
]

DEFAULT_CONTEXT_WINDOW = 8192
"""Tokens of context assumed when neither the endpoint nor the caller says (a small, safe guess:
the SmolLM2 server's own default is 2,048)."""
CHARS_PER_TOKEN = 3
"""Characters per token when sizing excerpts: below English prose's ~4, since tables, numbers
and small models' tokenizers spend more tokens per character."""
MARGIN_SHARE = 1 / 3
"""The share of the window kept free beyond the estimate: a tokenizer may count more tokens than
`CHARS_PER_TOKEN` says (numbers, tables, other languages), and chat templates add their own. With
a 2,048-token window a sub-question gets about 2,500 to 3,000 characters of excerpts."""
MIN_TASK_CHARS = 900
"""The least excerpt a sub-question should get in one call; a batch whose window leaves less is
asked in groups of sub-questions (`ReadSolver._in_groups`)."""
MIN_EXCERPT_CHARS = 200
"""The least a sub-question's excerpts get, however full the window (an overflow then halves on)."""
OVERFLOW_RETRIES = 2
"""How many times a prompt too long for the context is cut in half and asked again."""
SMALL_MODEL_PARAMS = 3e9
"""Below this many parameters (read from the model id) `auto` picks the read solver."""
SMALL_CONTEXT = 4096
"""Under this many tokens of context the read solver takes the small-model way (`read_small`)."""
SMALL_TASK_CHARS = 600
"""The most excerpt a sub-question gets in the small-model way (measured with SmolLM2-135M: about
500 characters of the column's lines beat 2,500 of the page)."""


class SearchHit(Protocol):
    """One search result as the read solver uses it (`web.models.SearchResult` is one)."""

    @property
    def title(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def snippet(self) -> str: ...


class ReadPage(Protocol):
    """One crawled page as the read solver uses it (`web.models.Page` is one)."""

    @property
    def final_url(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def text(self) -> str: ...


class Reader(Protocol):
    """What the read solver searches and reads with: the run's `web.service.WebService`, so its
    URL policy, caches, rate limits and usage counts are the agents' ones. (Taken as a protocol:
    `mapreduce` does not import its layer's peer `web`.)"""

    def search(self, query: str, n: int = 5) -> Sequence[SearchHit]: ...
    def crawl(self, url: str, max_chars: int) -> ReadPage: ...


# -- choosing the solver -------------------------------------------------------------------------

_SIZE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([mb])(?![a-z0-9])", re.IGNORECASE)


def looks_small(model_id: str | None) -> bool:
    """Whether `model_id` names a size under 3B parameters (`smollm2-135m`, `qwen2.5-0.5b`,
    `gemma-3-270m`, `Qwen2.5-1.5B-Instruct`). The largest size it names counts, so a `-1m`
    context tag beside `7b` does not make a model small; an id naming no size is not small."""
    sizes = [float(n) * (1e6 if unit.lower() == "m" else 1e9) for n, unit in _SIZE.findall(model_id or "")]
    return bool(sizes) and max(sizes) < SMALL_MODEL_PARAMS


# -- the reply's schema and size -------------------------------------------------------------------

def rows_schema(columns: Sequence[ColumnSpec], rows: int | None = None, *, task: bool = True,
                source: bool = True) -> dict[str, Any]:
    """The reply's JSON schema: `{"rows": [ROW]}`, ROW with `task`, `quotes` (one string per column),
    one string per column and `source`. Every property is required, so a grammar forces them ("" for
    unknown); nothing else (no `anyOf`): small models' grammars choke. A typed column's value is its
    type's fragment (`ColumnType.schema`: still a string, "" allowed, held by an anchored pattern or
    an enum, e.g. an integer's digits); text columns and the quotes stay plain strings.

    Measured with SmolLM2-135M on the atlas (llama-cpp-python's grammar): the quotes come first, as
    the model copies better than it answers and then writes values after its own copy (cells right
    rose from about a third to more than half); with `rows` known the list holds exactly that many
    (a schema that allowed an empty list got `{"rows": []}` to pages holding every value); `task`
    (one sub-question) and `source` (one page shown per sub-question) are left out when code knows
    them, as every key the model writes is a chance to go astray."""
    kinds = {c.name: c.kind for c in reversed(columns)}  # the first spec of a repeated name wins
    names = list(dict.fromkeys(c.name for c in columns))
    strings = {name: {"type": "string"} for name in names}
    values = {name: kinds[name].schema for name in names}
    quotes = {"type": "object", "properties": strings, "required": names, "additionalProperties": False}
    properties: dict[str, Any] = {**({"task": {"type": "integer"}} if task else {}), "quotes": quotes, **values,
                                  **({"source": {"type": "string"}} if source else {})}
    row = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    listed: dict[str, Any] = {"type": "array", "items": row}
    if rows:
        listed.update(minItems=rows, maxItems=rows)
    return {"type": "object", "properties": {"rows": listed}, "required": ["rows"], "additionalProperties": False}


def asked_columns(request: BatchRequest) -> tuple[ColumnSpec, ...]:
    """The columns the model is asked to fill: those the task matrix does not fix for every
    sub-question (`BatchRequest.forced`; the engine keeps those cells whatever a reply says)."""
    fixed = set.intersection(*(set(f) for f in request.forced)) if request.forced else set()
    return tuple(c for c in request.column_specs if c.name not in fixed) or tuple(request.column_specs)


def search_query(text: str, forced: Mapping[str, str], columns: Sequence[ColumnSpec], words: int = 32) -> str:
    """What a sub-question is searched by: the entity it is about (its matrix cells) and the columns
    asked, when the matrix names it; else its text. (Measured on a 244-page atlas: the template's
    words, shared by every page, outranked the entity, and "For the country Germany, find its
    capital ..." ranked the Netherlands' page first.)"""
    entity = " ".join(v for v in forced.values() if v and v.strip())
    if not entity:
        return " ".join(text.split()[:words])
    asked = " ".join(c.name.replace("_", " ") for c in columns)
    return " ".join(f"{entity} {asked}".split()[:words])


def rows_per_task(request: BatchRequest) -> int | None:
    """Rows each sub-question yields (`BatchRequest.expected_rows` shared by its sub-questions), None
    when a sub-question may yield any number."""
    if not request.expected_rows:
        return None
    return max(1, request.expected_rows // max(1, len(request.tasks)))


# -- the solver ------------------------------------------------------------------------------------

@dataclass
class _Task:
    """One sub-question of the attempt: what is searched, what locates its passages, what was read."""

    number: int
    text: str
    query: str
    key: str
    terms: dict[str, float]
    hits: list[SearchHit] = field(default_factory=list)
    pages: list[GroundedPage] = field(default_factory=list)


@functools.cache
def _patch_marker() -> tuple[str, str]:
    """The fixed words a delta-patch sub-question adds to its original (`prompts/mapreduce.yaml`
    `patch_template`: `__0__` the original, `__1__` what is still needed), as (between, after)."""
    template = render_prompt("mapreduce", "patch_template")
    between, _, after = template.partition("__0__")[2].partition("__1__")
    return between, after


def _split_patch(text: str) -> tuple[str, str]:
    """A sub-question as (the original sub-question, what a patch round still needs or "")."""
    between, after = _patch_marker()
    if between and between in text:
        original, _, needed = text.partition(between)
        return original.strip(), needed.removesuffix(after).strip()
    return text.strip(), ""


def _entity_names(forced: Mapping[str, str]) -> list[str]:
    """The names a sub-question is about: the cells the task matrix fixes for it."""
    return [v for v in forced.values() if v and v.strip()]


def _entity(request: BatchRequest, task: _Task) -> str:
    """What a sub-question is about, as the small-model prompt names it: its matrix cells, else its text."""
    forced = request.forced[task.number - 1] if len(request.forced) >= task.number else {}
    return ", ".join(_entity_names(forced)) or _split_patch(task.text)[0]


def _is_context_overflow(exc: BaseException) -> bool:
    """Whether a failed call says its prompt exceeded the context window: OpenAI's code
    `context_length_exceeded` (llama-cpp-python sends it too), LiteLLM's
    `ContextWindowExceededError`, or the words of servers that send no code."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if context_overflow(seen) or getattr(seen, "fields", {}).get("kind") == "context_overflow":
            return True
        seen = seen.__cause__ or seen.__context__
    return bool(_OVERFLOW_WORDS.search(str(exc)))


_OVERFLOW_WORDS = re.compile(
    r"context_length_exceeded|exceed(?:s|ed)? (?:the )?context window|maximum context length|context window of"
    r"|prompt is too long",
    re.IGNORECASE,
)


class ReadSolver:
    """A `BatchSolver` whose code searches and reads, and whose model makes one structured call
    per attempt (see the module doc). Thread-safe: one solver serves every attempt of a run.

    Args:
        model: the sub-agent model (its `capabilities`, when a `ManagedModel` of an `--api-base`
            endpoint, give the context window and the structured-output dialect).
        reader: the run's web service (`web.service.WebService`).
        crawl_max_chars: characters a page is read to (`Settings.crawl_max_chars`).
        search_results: hits asked per sub-question.
        pages_per_task: pages read per sub-question and attempt; None: 1 to 3, as many as its
            share of the excerpt budget fits at about 3,000 characters a page.
        context_window: tokens of context, overriding the endpoint's (None: the endpoint's, else
            `DEFAULT_CONTEXT_WINDOW`).
        max_chars_per_task: the most excerpt characters a sub-question gets, however large the window.
        small: the small-model way (`mapreduce.read_small`); None: when the window is under
            `SMALL_CONTEXT` tokens or the model id names a size under 3B parameters.
    """

    def __init__(
        self,
        *,
        model: Model,
        reader: Reader,
        crawl_max_chars: int = default_setting("crawl_max_chars"),
        search_results: int = 5,
        pages_per_task: int | None = None,
        context_window: int | None = None,
        max_chars_per_task: int = 8000,
        small: bool | None = None,
    ) -> None:
        if pages_per_task is not None and pages_per_task < 1:
            raise ValueError(f"`pages_per_task` must be >= 1, got {pages_per_task}")
        if search_results < 1:
            raise ValueError(f"`search_results` must be >= 1, got {search_results}")
        self.model = model
        self.reader = reader
        self.crawl_max_chars = crawl_max_chars
        self.search_results = search_results
        self.pages_per_task = pages_per_task
        self.max_chars_per_task = max_chars_per_task
        capabilities: EndpointCapabilities | None = getattr(model, "capabilities", None)
        self.context_window = context_window or (capabilities.context_window if capabilities else None) \
            or DEFAULT_CONTEXT_WINDOW
        self.structured = capabilities.structured if capabilities is not None else "json_schema"
        self.small = small if small is not None else (self.context_window < SMALL_CONTEXT
                                                      or looks_small(model.model_id))
        if self.small:
            self.max_chars_per_task = min(max_chars_per_task, SMALL_TASK_CHARS)
        self.system_prompt = render_prompt("read_solver", "system")
        """The system prompt, the same for every call (the start of every prompt: prefix-cached)."""
        self._lock = threading.Lock()
        self._read: dict[str, set[str]] = {}
        """Sub-question (its original text, folded) → URLs read for it (or tried) by earlier attempts."""
        self._scale = 1.0
        """The share of the computed excerpt budget used: halved by each context overflow, kept."""
        if isinstance(model, ManagedModel):  # the first wave of calls must not all load the price map
            model.meter.prices.preload()

    # -- one attempt --------------------------------------------------------------------------

    def solve(self, request: BatchRequest) -> SolverReply:
        """Search and read for each sub-question, then fill the rows in one model call (in a
        window too small for the whole batch's excerpts, one call per group of sub-questions that fits:
        `_in_groups`)."""
        columns = asked_columns(request)
        per_task = rows_per_task(request)
        max_tokens = min(reply_tokens(request), self.context_window // 3)
        schema = rows_schema(columns, request.expected_rows or None)
        forced = request.forced if len(request.forced) == len(request.tasks) else ({},) * len(request.tasks)
        tasks = [self._task(k, text, columns, forced[k - 1]) for k, text in enumerate(request.tasks, 1)]
        note = self._rows_note(per_task)
        budget = self._excerpt_budget(request, tasks, note, schema, max_tokens)
        grounded = self.small and per_task == 1
        if (budget < MIN_TASK_CHARS or grounded) and len(tasks) > 1:
            return self._in_groups(request, 0 if grounded else budget)
        pages = self.pages_per_task or max(1, min(3, budget // 3000))
        errors: list[str] = []
        for task in tasks:
            self._gather(request, task, pages, errors)
        if not any(t.pages or t.hits for t in tasks):
            if errors:
                raise SolverError(
                    f"read solver for {request.batch_id} attempt {request.attempt} could not search: {errors[0]}",
                    batch_id=request.batch_id, attempt=request.attempt,
                )
            return SolverReply(output="[]", steps=0, trace={"state": "nothing_found", "reads": [],
                                                           "searches": [t.query for t in tasks]})
        one_task, one_page = len(tasks) == 1, all(len(t.pages) <= 1 for t in tasks)
        schema = rows_schema(columns, request.expected_rows or None, task=not one_task, source=not one_page)
        reply, calls, used_budget = self._ask(request, tasks, note, schema, max_tokens, budget)
        text = message_text(reply)
        parsed = parse_reply(text)
        rows = [dict(row) for row in parsed.rows]
        usage = Usage.of_reply(reply, calls)
        ways: Counter[str] = Counter()
        if grounded and tasks[0].pages:
            row, more, ways = ground_row(self.model, rows[0] if rows else {}, columns,
                                         tasks[0].pages,
                                         _entity_names(forced[0]), check=lambda: self._check(request), errors=errors)
            rows, usage = [row], usage + more
        for row in rows:  # what the schema left out, code knows
            if one_task:
                row.setdefault("task", 1)
            number = row.get("task")
            if one_page and isinstance(number, int) and 1 <= number <= len(tasks) and tasks[number - 1].pages:
                row.setdefault("source", tasks[number - 1].pages[0].url)
        if parsed.error is not None and not rows:
            raise SolverError(
                f"read solver for {request.batch_id} attempt {request.attempt}: the model's reply holds no JSON "
                f"rows ({parsed.error}): {redact_secrets(text[:200])!r}",
                batch_id=request.batch_id, attempt=request.attempt,
            )
        trace = {
            "state": "success", "reads": [p.url for t in tasks for p in t.pages], "searches": [t.query for t in tasks],
            "excerpt_chars_per_task": used_budget, "calls": usage.requests, "truncated": parsed.truncated,
            **({"grounding": dict(ways)} if ways else {}),
            **({"errors": errors} if errors else {}),
        }
        return SolverReply(output=json.dumps(rows, ensure_ascii=False), usage=usage, steps=1, trace=trace)

    def _in_groups(self, request: BatchRequest, budget: int) -> SolverReply:
        """`request` solved by groups of its sub-questions small enough that each gets
        `MIN_TASK_CHARS` of excerpts, one call a group; their rows numbered as in the whole batch.
        (Measured: an enrichment batch of 4 rows gave SmolLM2's 2,048-token window 223 characters of
        excerpt a row, and not one cell came right.)"""
        size = max(1, len(request.tasks) * budget // MIN_TASK_CHARS)
        per_task = rows_per_task(request)
        output: list[dict[str, Any]] = []
        usage, steps, reads, searches = Usage(), 0, [], []
        ways: Counter[str] = Counter()
        for start in range(0, len(request.tasks), size):
            part = slice(start, start + size)
            tasks = request.tasks[part]
            sub = dataclasses.replace(request, tasks=tasks, forced=request.forced[part] if request.forced else (),
                                      expected_rows=per_task * len(tasks) if per_task is not None else 0)
            reply = self.solve(sub)
            for row in json.loads(reply.output) if isinstance(reply.output, str) else reply.output:
                if isinstance(row, dict) and isinstance(row.get("task"), int):
                    row = {**row, "task": row["task"] + start}
                output.append(row)
            usage, steps = usage + reply.usage, steps + reply.steps
            reads += reply.trace.get("reads", [])
            searches += reply.trace.get("searches", [])
            ways.update(reply.trace.get("grounding", {}))
        trace = {"state": "success", "reads": reads, "searches": searches, "groups": -(-len(request.tasks) // size),
                 **({"grounding": dict(ways)} if ways else {})}
        return SolverReply(output=json.dumps(output, ensure_ascii=False), usage=usage, steps=steps, trace=trace)

    def _task(self, number: int, text: str, columns: Sequence[ColumnSpec], forced: Mapping[str, str]) -> _Task:
        original, needed = _split_patch(text)
        return _Task(number=number, text=text, query=search_query(original, forced, columns),
                     key=" ".join(original.casefold().split()), terms=query_terms(f"{original} {needed}", columns))

    def _check(self, request: BatchRequest) -> None:
        """Stop between steps once the engine gave the attempt up (deadline or cancellation)."""
        if request.expired():
            raise BatchTimeout(
                f"read solver for {request.batch_id} attempt {request.attempt} was stopped at its deadline",
                batch_id=request.batch_id, attempt=request.attempt,
            )

    # -- searching and reading ----------------------------------------------------------------

    def _gather(self, request: BatchRequest, task: _Task, pages: int, errors: list[str]) -> None:
        """Search for `task` and read up to `pages` of its hits (new ones first); record what was read."""
        self._check(request)
        try:
            hits = list(self.reader.search(task.query, self.search_results))
        except RUN_STOPPING_ERRORS:
            raise
        except AmapreduceError as exc:  # this sub-question's search failed; the others go on
            errors.append(f"search {task.query!r}: {type(exc).__name__}: {redact_secrets(str(exc))}")
            return
        for result in hits:
            record_fetched(f"{result.title}\n{result.snippet or ''}", result.url)
        task.hits = hits
        tried: set[str] = set()
        for fresh in (True, False):  # new hits first; with none of them read, any hit again
            while len(task.pages) < pages:
                hit = self._claim(task, tried, fresh=fresh)
                if hit is None:
                    break
                self._read_page(request, task, hit, errors)
            if task.pages:
                break

    def _claim(self, task: _Task, tried: set[str], *, fresh: bool) -> SearchHit | None:
        """The best hit not tried in this attempt (and, when `fresh`, not read by an earlier one),
        marked as read at once, so a backup attempt running alongside reads another."""
        with self._lock:
            seen = self._read.setdefault(task.key, set())
            for hit in task.hits:
                if hit.url not in tried and (not fresh or hit.url not in seen):
                    tried.add(hit.url)
                    seen.add(hit.url)
                    return hit
        return None

    def _read_page(self, request: BatchRequest, task: _Task, hit: SearchHit, errors: list[str]) -> None:
        self._check(request)
        try:
            page = self.reader.crawl(hit.url, self.crawl_max_chars)
        except RUN_STOPPING_ERRORS:
            raise
        except AmapreduceError as exc:  # this page failed (refused, missing, host down): the next hit
            errors.append(f"crawl {hit.url}: {type(exc).__name__}: {redact_secrets(str(exc))}")
            return
        title = page.title or ""
        record_fetched(f"{title}\n{page.text}", hit.url, page.final_url)
        task.pages.append(GroundedPage(url=page.final_url or hit.url, title=title, text=page.text))

    # -- the prompt ----------------------------------------------------------------------------

    @staticmethod
    def _rows_note(per_task: int | None) -> str:
        if per_task is None:
            return render_prompt("read_solver", "rows_many")
        if per_task == 1:
            return render_prompt("read_solver", "rows_one")
        return render_prompt("read_solver", "rows_fixed", rows=per_task)

    def _user_prompt(self, request: BatchRequest, tasks: Sequence[_Task], note: str,
                     groups: Sequence[Mapping[str, Any]]) -> str:
        if self.small and len(tasks) == 1 and rows_per_task(request) == 1:
            return render_prompt("read_solver", "request_small", columns=asked_columns(request),
                                 shared_context=dict(request.shared_context), groups=groups,
                                 entity=_entity(request, tasks[0]))
        return render_prompt(
            "read_solver", "request", columns=asked_columns(request), shared_context=dict(request.shared_context),
            rows_note=note, tasks=[t.text for t in tasks], groups=groups, grouped=len(tasks) > 1,
        )

    def _excerpt_budget(self, request: BatchRequest, tasks: Sequence[_Task], note: str, schema: Mapping[str, Any],
                        max_tokens: int) -> int:
        """Excerpt characters per sub-question: what the window leaves after the fixed prompt (the
        system prompt, the request without excerpts, the schema when it goes into the prompt), the
        reply and a margin, at `CHARS_PER_TOKEN`, shared by the sub-questions, times `_scale`."""
        empty = [{"task": t.number, "excerpts": []} for t in tasks]
        fixed = len(self.system_prompt) + len(self._user_prompt(request, tasks, note, empty))
        if self.structured in ("none", "json_object"):  # `llm.dialect` writes the schema into the prompt
            fixed += len(schema_instruction(schema))
        margin = max(64, int(self.context_window * MARGIN_SHARE))
        room = (self.context_window - max_tokens - margin) * CHARS_PER_TOKEN - fixed
        with self._lock:
            scale = self._scale
        share = int(max(0, room) * scale) // max(1, len(tasks))
        return max(MIN_EXCERPT_CHARS, min(self.max_chars_per_task, share))

    def _groups(self, tasks: Sequence[_Task], budget: int) -> list[dict[str, Any]]:
        """Each sub-question's excerpts, numbered through the prompt, within `budget` characters each."""
        groups: list[dict[str, Any]] = []
        number = 0
        for task in tasks:
            sources = task.pages or [GroundedPage(url=h.url, title=h.title, text=h.snippet or "") for h in task.hits[:3]]
            left = budget
            excerpts: list[dict[str, Any]] = []
            for k, source in enumerate(sources):
                number += 1
                share = left // (len(sources) - k)
                head = len(f"[{number}] {source.url}\n") + (len(source.title) + 1 if source.title else 0) + 1
                body = excerpt(source.text, task.terms, share - head)
                if source.title and source.title not in body.split("\n", 1)[0]:  # the title as recorded
                    body = f"{source.title}\n{body}" if body else source.title
                left -= head + len(body)
                excerpts.append({"number": number, "url": source.url, "text": body})
            groups.append({"task": task.number, "excerpts": excerpts})
        return groups

    def _messages(self, request: BatchRequest, tasks: Sequence[_Task], note: str, budget: int) -> list[ChatMessage]:
        user = self._user_prompt(request, tasks, note, self._groups(tasks, budget))
        return [
            ChatMessage(role=MessageRole.SYSTEM, content=[{"type": "text", "text": self.system_prompt}]),
            ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": user}]),
        ]

    # -- the call ------------------------------------------------------------------------------

    def _ask(self, request: BatchRequest, tasks: Sequence[_Task], note: str, schema: Mapping[str, Any],
             max_tokens: int, budget: int) -> tuple[ChatMessage, int, int]:
        """The model's reply, the calls it took and the excerpt budget that fitted: a prompt too
        long for the context is asked again with half the excerpts, `OVERFLOW_RETRIES` times."""
        response_format = {"type": "json_schema", "json_schema": {"name": "rows", "schema": schema, "strict": True}}
        extra: dict[str, Any] = {} if is_reasoning_model(self.model.model_id or "") else {"max_tokens": max_tokens}
        calls = 0
        while True:
            self._check(request)
            calls += 1
            try:
                reply = self.model.generate(self._messages(request, tasks, note, budget),
                                            response_format=response_format, **extra)
            except RUN_STOPPING_ERRORS:
                raise
            except Exception as exc:  # a managed model's `ModelCallError`; a bare client's own error
                if calls > OVERFLOW_RETRIES or not _is_context_overflow(exc) or budget <= MIN_EXCERPT_CHARS:
                    raise
                budget = max(MIN_EXCERPT_CHARS, budget // 2)
                with self._lock:  # later attempts start from the smaller share
                    self._scale = max(1 / 8, self._scale / 2)
                continue
            return reply, calls, budget
