"""The planner: `ask`'s manager for a model that cannot call tools.

The manager agent (`agents.manager`) scouts with `web_search`/`crawl_page` and writes its decision
as the arguments of a `mapreduce` tool call. A model that makes no tool call (a 135M model behind
llama-cpp-python, whose default chat format ignores `tools`) never gets past that agent's first
step. The planner does the agent's work with one model call:

1. **Scouting, in code**: the question is searched with the run's search backend (the web tools'
   `WebService`), the top `CRAWLED_PAGES` hits are read, and their text is cut to the passages that
   share the most words with the question, within a character budget the model's context window
   leaves (`excerpt_budget`: llama-cpp-python's default window of 2,048 tokens leaves ~2,500
   characters; an unknown window is taken as `DEFAULT_CONTEXT_WINDOW`).
2. **One structured call**: the model fills a small schema (`DRAFT_SCHEMA`: a template, the entity
   column, the other columns and the entities; no `anyOf`, short fields before the long list, so a
   small model's grammar can follow it and a reply cut short loses only its last entities). The
   request is OpenAI's `json_schema` form; the endpoint layer (`llm.dialect`) sends it in the
   server's dialect, or writes the schema into the prompt where the server holds replies to none.
3. **The decision, in code** (`draft_decision`): one task per entity, the entity in column 0 and
   the key, `per_atom` batches (grouped when the entities outnumber `max_batches`), validated by
   `Decision` and the batch cap. An unusable reply gets one retry with the exact problem in the
   prompt; a second one fails the run with `CANNOT_PLAN`, which names what to do instead.
4. **The same execution as the manager's**: the decision goes through the `mapreduce` tool (its
   plan stage with the memory's prior and advice, then execute) on the run's session, so the run's
   ledger, table, `result.json` and exit code are those of any `ask`.

The planner writes one row per entity: questions whose entities each yield several rows (the top
10 of every year) need a manager that can call tools, or a decision file (`mapreduce run`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smolagents.models import ChatMessage, MessageRole

from amapreduce._modeljson import read_json
from amapreduce._text import scrub
from amapreduce.decision.columns import normalize_key_name
from amapreduce.decision.model import Decision
from amapreduce.decision.template import PLACEHOLDER
from amapreduce.errors import AmapreduceError, DecisionError, ToolCallRefused
from amapreduce.llm.messages import message_text
from amapreduce.prompts import render_prompt
from amapreduce.table.keys import is_blank, normalize_value
from amapreduce.web.tools import RUN_STOPPING, CrawlPageTool, WebSearchTool

if TYPE_CHECKING:
    from smolagents import Model, Tool

    from amapreduce.agents.mapreduce_tool import ToolSession
    from amapreduce.llm.endpoint import EndpointCapabilities
    from amapreduce.mapreduce.batching import BatchPlan
    from amapreduce.trace import Trace
    from amapreduce.web.service import WebService

__all__ = [
    "CANNOT_PLAN",
    "DEFAULT_CONTEXT_WINDOW",
    "DRAFT_SCHEMA",
    "RESPONSE_FORMAT",
    "Drafted",
    "Planned",
    "Planner",
    "Scouted",
    "draft_decision",
    "excerpt_budget",
    "planner_reason",
    "relevant_passages",
]

DEFAULT_CONTEXT_WINDOW = 8192
"""Tokens of context assumed when the endpoint does not tell its window."""
CHARS_PER_TOKEN = 3
"""Characters per token the budget assumes: generous, as `llm.dialect.ReplyBudget` counts (small
models' tokenizers split text finely), so the excerpts never push the reply out of the window."""
MAX_REPLY_TOKENS = 1024
"""The most tokens the structured reply may take (a quarter of a small window at most)."""
MARGIN_TOKENS = 160
"""Tokens kept free beside the prompt and the reply: chat-template overhead and a retry's note."""
MAX_EXCERPT_CHARS = 16_000
"""The most characters of excerpts however large the window: the planner wants an entity list."""
MIN_EXCERPT_CHARS = 600
"""The least, even in a window too small for the rest (the server then says it overflowed)."""
SEARCH_RESULTS = 5
"""Hits asked of the search backend for the question."""
CRAWLED_PAGES = 2
"""Top hits whose pages are read."""
PASSAGE_CHARS = 600
"""The size a page's text is cut into before the passages are scored."""
SEARCH_QUERY_CHARS = 300
"""The question is searched cut to this many characters (a paragraph-long question is no query)."""
MAX_ENTITIES = 100
"""Entities kept of one reply (the reply's token cap bounds them too)."""
MAX_COLUMNS = 12
"""Columns kept besides the entity's."""
MAX_NAME_CHARS = 200
"""Longer entity names are dropped: a sentence is no entity."""

DRAFT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "template": {"type": "string"},
        "entity_column": {"type": "string"},
        "columns": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
                "required": ["name", "description"],
                "additionalProperties": False,
            },
        },
        "entities": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["template", "entity_column", "columns", "entities"],
    "additionalProperties": False,
}
"""What the model fills: flat, no `anyOf`, every field required (OpenAI's strict mode), the long
list last (a grammar writes the fields in this order; a reply cut at its token cap loses entities,
not the template)."""

RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "decision", "schema": DRAFT_SCHEMA, "strict": True},
}
"""The request's `response_format`, always OpenAI's form (the endpoint layer translates it)."""

CANNOT_PLAN = (
    "this model could not write a decision ({why}); write one yourself and run it with "
    "`amapreduce mapreduce run DECISION.json` (docs/guides/decisions.md), or fill a list you have with "
    "`amapreduce enrich LIST.csv --columns ...`"
)
"""Why a planned `ask` failed, and the two ways to go on without a model that plans."""

_STOPWORDS = frozenset(
    "the and for with from that this what which who whom whose when where how are was were all each every "
    "list give find name their there these those its into than then them they have has had not any per "
    "about also more most other some such only our your".split()
)
_WORD = re.compile(r"\w+")


def planner_reason(capabilities: EndpointCapabilities | None, tool_choice: str) -> str | None:
    """Why the manager must plan without tool calling (None: it can call tools): the settings turn
    tool calling off, or the endpoint's probe found no `tool_choice` that made the model call one."""
    if tool_choice == "off":
        return "tool calling is off (tool_choice=off)"
    if capabilities is not None and not capabilities.tool_calling:
        return (f"the endpoint {capabilities.base_url or '(unnamed)'} ({capabilities.server}) made model "
                f"{capabilities.model_id!r} call no tool with any tool_choice")
    return None


# -- scouting ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Scouted:
    """What scouting found for the model to read."""

    excerpts: str
    """The search results and the passages of the pages read, as the prompt shows them ("" for none)."""
    query: str | None = None
    """What was searched (None: the run has no search tool)."""
    results: tuple[str, ...] = ()
    """The hits' URLs, best first."""
    crawled: tuple[str, ...] = ()
    """The pages read."""
    notes: tuple[str, ...] = ()
    """A search or page that failed, and why (the run goes on without it)."""

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "results": list(self.results), "crawled": list(self.crawled),
                "excerpt_chars": len(self.excerpts), "notes": list(self.notes)}


def excerpt_budget(context_window: int | None, fixed_chars: int, reply_tokens: int) -> int:
    """Characters of excerpts a prompt may carry: what the window (`DEFAULT_CONTEXT_WINDOW` when
    unknown) leaves after the reply, the rest of the prompt (`fixed_chars`) and a margin, within
    [`MIN_EXCERPT_CHARS`, `MAX_EXCERPT_CHARS`]."""
    window = context_window or DEFAULT_CONTEXT_WINDOW
    left = window - reply_tokens - math.ceil(fixed_chars / CHARS_PER_TOKEN) - MARGIN_TOKENS
    return max(MIN_EXCERPT_CHARS, min(MAX_EXCERPT_CHARS, left * CHARS_PER_TOKEN))


def reply_tokens_for(context_window: int | None) -> int:
    """The reply's token cap: `MAX_REPLY_TOKENS`, at most a quarter of the window."""
    return min(MAX_REPLY_TOKENS, (context_window or DEFAULT_CONTEXT_WINDOW) // 4)


def _terms(text: str) -> set[str]:
    """The words of `text` that say what it is about, folded (casefold, first five letters: a crude
    stem, so "countries" meets "country")."""
    return {w[:5] for w in (m.casefold() for m in _WORD.findall(text)) if len(w) >= 3 and w not in _STOPWORDS}


def _chunks(text: str, size: int = PASSAGE_CHARS) -> list[str]:
    """`text` cut into passages of at most `size` characters: paragraphs, long ones at line breaks
    (a list stays together as far as it fits), a longer line at `size`."""
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        current = ""
        for line in (x.rstrip() for x in paragraph.strip().splitlines()):
            if not line:
                continue
            if current and len(current) + 1 + len(line) > size:
                out.append(current)
                current = ""
            current = f"{current}\n{line}" if current else line
        if current:
            out.append(current)
    return [chunk[i : i + size] for chunk in out for i in range(0, len(chunk), size)]


def relevant_passages(question: str, sources: Sequence[tuple[str, str]], budget: int) -> str:
    """The passages of `sources` (heading, text) that share the most words with `question`, within
    `budget` characters, each source's in its own order under its heading.

    A passage scores the question's words it holds, plus half its predecessor's (a list under a
    heading that names the question's subject is what the planner is after); ties go in document
    order. Passages that share no word are left out, unless none does (a question in a script
    without spaces has no words to share): then the text is taken in document order.
    """
    wanted = _terms(question)
    pool: list[tuple[float, int, int, str]] = []
    for s, (_, text) in enumerate(sources):
        before = 0
        for c, chunk in enumerate(_chunks(text, max(100, min(PASSAGE_CHARS, budget // 3)))):
            own = len(_terms(chunk) & wanted)
            pool.append((own + before / 2, s, c, chunk))
            before = own
    if any(p[0] > 0 for p in pool):
        pool = [p for p in pool if p[0] > 0]
    chosen: dict[int, list[tuple[int, str]]] = {}
    used = 0
    for _, s, c, chunk in sorted(pool, key=lambda p: (-p[0], p[1], p[2])):
        cost = len(chunk) + 2 + (len(sources[s][0]) + 1 if s not in chosen else 0)
        if used + cost > budget:
            continue
        chosen.setdefault(s, []).append((c, chunk))
        used += cost
    blocks = []
    for s in sorted(chosen):
        passages = sorted(chosen[s])
        parts = [passages[0][1]]
        for (prev, _), (c, chunk) in zip(passages, passages[1:], strict=False):
            parts.append(("…\n" if c != prev + 1 else "") + chunk)
        blocks.append(sources[s][0] + "\n" + "\n".join(parts))
    return "\n\n".join(blocks)


# -- the decision -----------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A string field of a draft, its white space collapsed ("" for anything else)."""
    return " ".join(value.split()) if isinstance(value, str) else ""


def _items(draft: Mapping[str, Any], key: str) -> list[Any]:
    """A list field of a draft ([] when it is missing or not a list)."""
    value = draft.get(key)
    return value if isinstance(value, list) else []


def draft_decision(draft: Any, *, max_entities: int = MAX_ENTITIES, max_batches: int) -> dict[str, Any]:
    """The decision (as `Decision.parse` reads it) a draft of `DRAFT_SCHEMA` describes.

    Forgiving where the intent is plain: names trimmed, blank and repeated entities and columns
    dropped (and entities that hold a placeholder or are longer than `MAX_NAME_CHARS`), entities
    beyond `max_entities` dropped, a template without `__0__` gets one in front
    ("For the country __0__: ..."), entities that outnumber `max_batches` are batched several to
    a sub-agent. Strict where nothing can be guessed.

    Raises:
        DecisionError: not an object, no entity, no template, or no entity column.
    """
    if not isinstance(draft, Mapping):
        raise DecisionError(f"the reply must be one JSON object with {', '.join(DRAFT_SCHEMA['required'])}")
    entity = _text(draft.get("entity_column"))
    template = _text(draft.get("template"))
    if not entity:
        raise DecisionError('"entity_column" is empty: name the column that holds the entity (e.g. "country")')
    if not template:
        raise DecisionError('"template" is empty: write the question for one entity, with __0__ for its name')
    entities: list[str] = []
    seen: set[str] = set()
    for item in _items(draft, "entities"):
        number = isinstance(item, int | float) and not isinstance(item, bool)
        name = _text(item) if isinstance(item, str) else str(item) if number else ""
        if is_blank(name) or len(name) > MAX_NAME_CHARS or PLACEHOLDER.search(name):
            continue
        if normalize_value(name) not in seen:
            seen.add(normalize_value(name))
            entities.append(name)
    if not entities:
        raise DecisionError('"entities" is empty: list the entities the excerpts name, one string each')
    entities = entities[:max_entities]
    properties: dict[str, Any] = {entity: {"type": "string", "description": f"the {entity}, as in the task"}}
    names = {normalize_key_name(entity)}
    for column in _items(draft, "columns"):
        name = _text(column.get("name")) if isinstance(column, Mapping) else _text(column)
        if not name or normalize_key_name(name) in names or len(properties) > MAX_COLUMNS:
            continue
        names.add(normalize_key_name(name))
        description = _text(column.get("description")) if isinstance(column, Mapping) else ""
        properties[name] = {"type": "string", **({"description": description} if description else {})}
    if not PLACEHOLDER.search(template):
        template = f"For the {entity} __0__: {template}"
    per_batch = math.ceil(len(entities) / max_batches)
    return {
        "task_matrix": [[e] for e in entities],
        "template": template,
        "json_schema": {"type": "object", "properties": properties},
        "batch_strategy": {"type": "per_atom", "rationale": "one independent look-up per entity (planner)"},
        "batch_size": per_batch if per_batch > 1 else None,
        "key_columns": [entity],
    }


@dataclass(frozen=True, kw_only=True)
class Drafted:
    """What the structured call(s) gave: a valid decision, or why none."""

    decision: Decision | None
    arguments: dict[str, Any] = field(default_factory=dict)
    """The decision as the `mapreduce` tool's arguments (empty without one)."""
    error: str | None = None
    """Why the last reply could not be used (None: `decision` is set)."""
    calls: int = 0
    """Structured calls made: 1, or 2 after a retry."""


@dataclass(frozen=True, kw_only=True)
class Planned:
    """How a planned `ask` went: the manager's one-line answer, or why it could not plan."""

    answer: str | None = None
    failure: str | None = None
    """`CANNOT_PLAN` with the reason; the run ends `failed` with it."""


# -- the planner ------------------------------------------------------------------------------


class Planner:
    """Scouts in code, has the model write the decision in one structured call, and runs it through
    the `mapreduce` tool on the run's session (see the module doc).

    Args:
        model: the manager's model (a `ManagedModel`: metered, traced, budgeted; its `capabilities`,
            when it has them, give the context window; the endpoint layer handles the dialect).
        web_tools: the run's web tools; the `WebSearchTool` and `CrawlPageTool` among them give the
            run's `WebService` (none: no scouting, the model reads the question alone).
        max_batches: the manager's batch cap (`Settings.max_batches`).
        trace: where the scouting and each reply's verdict are recorded.
        crawl_chars: the character budget of one page read (the crawl tool's own, when there is one).
        max_entities: entities kept of a reply.
    """

    def __init__(self, model: Model, *, web_tools: Sequence[Tool], max_batches: int, trace: Trace,
                 crawl_chars: int = 20_000, max_entities: int = MAX_ENTITIES) -> None:
        self.model = model
        self.trace = trace
        self.max_batches = max_batches
        self.max_entities = max_entities
        capabilities: EndpointCapabilities | None = getattr(model, "capabilities", None)
        self.context_window = capabilities.context_window if capabilities is not None else None
        self.search: WebService | None = next((t.service for t in web_tools if isinstance(t, WebSearchTool)), None)
        crawler = next((t for t in web_tools if isinstance(t, CrawlPageTool)), None)
        self.crawl: WebService | None = crawler.service if crawler is not None else self.search
        self.crawl_chars = crawler.max_chars if crawler is not None else crawl_chars

    # -- the whole of it

    def run(self, question: str, session: ToolSession) -> Planned:
        """Plan `question` and execute the decision on `session` (a `session.Session`).

        Raises:
            RunCancelled, BudgetExceeded, ProviderUnavailable: the run stops (as the manager's would);
                a model call that failed for good raises the model layer's `ModelCallError`.
        """
        scouted = self.scout(question)
        drafted = self.write(question, scouted, plan_of=session.plan_of)
        if drafted.decision is None:
            return Planned(failure=CANNOT_PLAN.format(why=drafted.error))
        refused = self._execute(drafted.arguments, session)
        if refused is not None:
            return Planned(failure=CANNOT_PLAN.format(why=f"the mapreduce tool refused its decision: {refused}"))
        n = len(drafted.decision.task_matrix)
        return Planned(answer=f"Planned without tool calling: {n} entit{'y' if n == 1 else 'ies'} from "
                              f"{len(scouted.crawled)} page{'' if len(scouted.crawled) == 1 else 's'} read.")

    # -- 1. scouting

    def scout(self, question: str, budget: int | None = None) -> Scouted:
        """Search `question`, read the top pages and cut them to the passages that match it, within
        `budget` characters (default: what the window leaves, `excerpt_budget`).

        A failed search or page is noted and skipped; an error that stops the run (`web.tools.RUN_STOPPING`:
        the search backend down, the budget spent) is raised."""
        budget = budget if budget is not None else self.excerpt_budget(question)
        if self.search is None:
            scouted = Scouted(excerpts="", notes=("the run has no web search tool",))
            self.trace.write("planner_scout", budget_chars=budget, **scouted.to_json())
            return scouted
        query = " ".join(question.split())[:SEARCH_QUERY_CHARS]
        notes: list[str] = []
        try:
            hits = self.search.search(query, SEARCH_RESULTS)
        except RUN_STOPPING:
            raise
        except AmapreduceError as exc:
            hits = []
            notes.append(f"search failed: {exc}")
        listing = "\n".join(f"- {h.title} ({h.url}): {h.snippet}".rstrip(": ") for h in hits)
        sources: list[tuple[str, str]] = [("Search results:", listing)] if listing else []
        crawled: list[str] = []
        for hit in hits[:CRAWLED_PAGES]:
            if self.crawl is None:
                break
            try:
                page = self.crawl.crawl(hit.url, self.crawl_chars)
            except RUN_STOPPING:
                raise
            except AmapreduceError as exc:
                notes.append(f"{hit.url}: {exc}")
                continue
            crawled.append(page.final_url)
            sources.append((f"Page: {page.title or hit.title} ({page.final_url})", page.text))
        scouted = Scouted(excerpts=scrub(relevant_passages(question, sources, budget)), query=query,
                          results=tuple(h.url for h in hits), crawled=tuple(crawled), notes=tuple(notes))
        self.trace.write("planner_scout", budget_chars=budget, **scouted.to_json())
        return scouted

    def excerpt_budget(self, question: str) -> int:
        """The excerpts' budget for `question`: the window less the reply, the rest of the prompt
        (the schema counted too, for servers that get it in the prompt) and a margin."""
        fixed = sum(len(message_text(m)) for m in self._messages(question, "", None))
        fixed += len(json.dumps(DRAFT_SCHEMA, separators=(",", ":")))
        return excerpt_budget(self.context_window, fixed, reply_tokens_for(self.context_window))

    # -- 2. the structured call

    def write(self, question: str, scouted: Scouted, *,
              plan_of: Callable[[Decision], BatchPlan] | None = None) -> Drafted:
        """Have the model write the decision: one structured call, and one more with the problem in
        the prompt when its reply cannot be made into a valid decision (`plan_of`: the session's
        batch-cap check, run on the decision too)."""
        error: str | None = None
        for call in (1, 2):
            reply = self.model.generate(self._messages(question, scouted.excerpts, error),
                                        response_format=RESPONSE_FORMAT, max_tokens=reply_tokens_for(self.context_window))
            text = message_text(reply)
            draft = read_json(text, accept=lambda v: isinstance(v, dict))
            try:
                arguments = draft_decision(draft, max_entities=self.max_entities, max_batches=self.max_batches)
                decision = Decision.parse(arguments)
                if plan_of is not None:
                    plan_of(decision)
            except DecisionError as exc:
                error = str(exc) if draft is not None else "the reply held no JSON object"
                self.trace.write("planner_reply", call=call, valid=False, error=error, reply=text[:2000])
                continue
            grounded = self._grounded(decision, question, scouted)
            self.trace.write("planner_reply", call=call, valid=True, entities=len(decision.task_matrix),
                             grounded=grounded, columns=list(decision.columns), template=decision.template)
            arguments = {k: v for k, v in arguments.items() if v is not None}
            return Drafted(decision=decision, arguments=arguments, calls=call)
        return Drafted(decision=None, error=error, calls=2)

    def _messages(self, question: str, excerpts: str, error: str | None) -> list[ChatMessage]:
        """The instructions first (the same for every question: a cached prefix), then the excerpts
        and the question, then, on a retry, what was wrong with the last reply."""
        shown = excerpts or render_prompt("planner", "no_excerpts", why="nothing was found for the question")
        user = render_prompt("planner", "user", excerpts=shown, question=question)
        if error is not None:
            user += render_prompt("planner", "retry", error=error)
        return [
            ChatMessage(role=MessageRole.SYSTEM, content=[{
                "type": "text", "text": render_prompt("planner", "system", max_entities=self.max_entities)}]),
            ChatMessage(role=MessageRole.USER, content=[{"type": "text", "text": user}]),
        ]

    @staticmethod
    def _grounded(decision: Decision, question: str, scouted: Scouted) -> int:
        """How many of the decision's entities are written in the excerpts or the question (traced:
        a small model may name entities it read nowhere)."""
        seen = normalize_value(f"{question}\n{scouted.excerpts}")
        return sum(normalize_value(row[0]) in seen for row in decision.task_matrix)

    # -- 3. execution, as the manager's

    def _execute(self, arguments: dict[str, Any], session: ToolSession) -> str | None:
        """Call the `mapreduce` tool with `arguments` as the manager would: its plan stage (the
        memory's prior, advice applied at execute when set to), then the same call executes. Returns
        the tool's refusal, None when it executed."""
        from amapreduce.agents.mapreduce_tool import MapReduceTool
        from amapreduce.agents.tool_calls import record_tool_calls

        tool = record_tool_calls(MapReduceTool(session))
        for _ in range(2):  # a resumed run has no plan stage: its first call executes
            try:
                output = tool.forward(**arguments)
            except ToolCallRefused as exc:
                return str(exc)
            if _stage(output) != "plan":
                return None
        return None


def _stage(output: str) -> str | None:
    """The `call_stage` of a `mapreduce` tool's output (its first line is a JSON object)."""
    head = read_json(output.split("\n", 1)[0], accept=lambda v: isinstance(v, dict))
    return head.get("call_stage") if isinstance(head, dict) else None
