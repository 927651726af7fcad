"""What the simulated model understands: sandbox questions, sub-questions, and how to answer them.

This is the simulated model's "reasoning", written as code. It is not an LLM: it recognises the
sandbox's kinds of question (every country of a continent, the members of the euro list, the
top-k countries per continent, the top-k cities per country) and nothing else. It decides
*what* to look up; the tools decide what is found, the engine and reducer build the table.

How it batches (the decision the experiential memory learns to improve):

* **Default** (`default_batching`): one row per sub-agent, for every kind of question, with
  `batch_size` only as large as the plan cap its instructions state ("Keep the plan under N
  batches") requires. Always complete, and the most sub-agents.
* **Exploration** (`explore_batching`): a sample `k >= 1` stands for another sample of an LLM at
  temperature > 0. It picks one batching of a small fixed grid (per_atom with 2, 3, 4, 6, 8 or 12
  rows, and for two-column matrices by_attr on column 0) by a seeded hash of (question, sample),
  so trials differ from one another and every run of the same trial is the same.
* **Experience** (`advised_batching`): the plan stage's typed advice (`memory_advice` in its
  output, computed by `amapreduce.memory.advice`) replaces either: its proposal Θ′ when it has
  one (accepted with `use_advice: true`, within the plan cap), else the first typed hint payload
  that applies to the draft. It reads nothing of the prose prior.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from amapreduce.decision.columns import normalize_key_name
from amapreduce.demo.atlas_reader import Observations, clean_cell, infobox, list_entries, plain_number
from amapreduce.testing.scripted import ToolCall, tool_call

__all__ = [
    "EXPLORATION_SIZES",
    "Batching",
    "Column",
    "Intent",
    "PageNeed",
    "Question",
    "column_fact",
    "column_specs",
    "default_batching",
    "explore_batching",
    "advised_batching",
    "parse_intent",
    "parse_question",
    "plan_cap",
    "query_columns",
    "read_column",
    "resolve",
    "with_batching",
]

NO_SEPARATORS = "digits only, no thousands separators"
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_NUMERIC = re.compile(r"(?<![a-z])(?:population|area|rank|count|number)(?![a-z])", re.IGNORECASE)
"""Numeric column names, matched as whole words (`Area (km2)`, `population_2020`): `Country`
holds the letters of `count` but is a name, and a numeric note would mislead the sub-agents."""
_DESCRIPTIONS = {
    "country": "the country or territory's name as the atlas writes it",
    "city": "the city's name as the atlas writes it",
    "continent": "continent name",
    "currencycode": "ISO 4217 currency code, e.g. EUR",
    "iso3code": "three-letter ISO code, e.g. FRA",
    "callingcode": "international calling code as in the atlas, e.g. +33",
    "timezone": "IANA time zone, e.g. Europe/Paris",
    "capital": "capital city",
    "topleveldomain": "country-code top-level domain as in the atlas, e.g. .fr",
}
_PLAN_CAP = re.compile(r"Keep the plan under (?P<n>\d+) batches")
EXPLORATION_SIZES = (2, 3, 4, 6, 8)
"""Rows per sub-agent batch that exploration (sample >= 1) chooses among, with by_attr on the
first column for two-column matrices."""


@dataclass(frozen=True, kw_only=True)
class Column:
    """An output column and its format note."""

    name: str
    description: str

    @property
    def numeric(self) -> bool:
        """Whether values are plain integers (thousands separators removed)."""
        return NO_SEPARATORS in self.description


def column_specs(names: Sequence[str]) -> list[Column]:
    """Columns with descriptions that tell sub-agents the expected format."""
    out = []
    for name in names:
        if _NUMERIC.search(name):
            out.append(Column(name=name, description=f"integer, {NO_SEPARATORS}"))
        else:
            out.append(Column(name=name, description=_DESCRIPTIONS.get(normalize_key_name(name), name)))
    return out


@dataclass(frozen=True, kw_only=True)
class PageNeed:
    """A page an agent must read, found by the title of its search result."""

    title: str
    """The result title without the atlas suffix, e.g. `Countries of Africa` or `Tokyo, Japan`."""
    queries: tuple[tuple[str, int], ...]
    """Searches to try in order, (query, n); after the last one the page counts as not found."""


def _need(title: str, query: str) -> PageNeed:
    return PageNeed(title=title, queries=((query, 5), (f"{title} Sandbox Atlas", 10)))


def resolve(obs: Observations, need: PageNeed) -> ToolCall | str | None:
    """The next tool call for `need`, the page text once it was read, or None (not found)."""
    url = obs.results.get(need.title)
    if url is not None:
        return obs.pages[url] if url in obs.pages else tool_call("crawl_page", url=url)
    for query, n in need.queries:
        if query not in obs.searched:
            return tool_call("web_search", query=query, n=n)
    return None


@dataclass(frozen=True, kw_only=True)
class Question:
    """One atomic look-up: an entity's facts, or the entity at a population rank."""

    kind: Literal["country", "city", "ranked"]
    name: str = ""
    """The country (kind `country`) or city (kind `city`)."""
    country: str = ""
    """The city's country (kind `city`)."""
    continent: str = ""
    rank: int = 0

    def page(self) -> PageNeed:
        """The page that answers it (for `ranked`: the continent's list page)."""
        if self.kind == "city":
            return _need(f"{self.name}, {self.country}", f"{self.name} {self.country}")
        if self.kind == "ranked":
            return _need(f"Countries of {self.continent}", f"countries of {self.continent} list")
        return _need(self.name, self.name)

    def step(self, obs: Observations) -> list[ToolCall] | dict[str, str] | None:
        """Tool calls still needed, the facts found (infobox plus `_url`, `_name`), or None (not found)."""
        got = resolve(obs, self.page())
        if got is None or isinstance(got, ToolCall):
            return [got] if got is not None else None
        if self.kind != "ranked":
            url = obs.results[self.page().title]
            return {**infobox(got), "_url": url, "_name": self.name}
        members = list_entries(got)
        todo = [tool_call("crawl_page", url=e.url) for e in members if e.url not in obs.pages]
        if todo:
            return todo
        ranked = sorted(
            ((int(plain_number(infobox(obs.pages[e.url]).get("Population", "0")) or 0), e) for e in members),
            key=lambda pair: (-pair[0], pair[1].name),
        )
        if not 1 <= self.rank <= len(ranked):
            return None
        entry = ranked[self.rank - 1][1]
        facts = infobox(obs.pages[entry.url])
        return {**facts, "_url": entry.url, "_name": entry.name, "Rank": str(self.rank), "Continent": self.continent}


_CODE = re.compile(r"\(([A-Z]{2,4})\)")


def column_fact(column: Column, facts: dict[str, str]) -> str | None:
    """The fact `column` is read from (`_name`: the page's entity name), or None when the page
    does not say."""
    key = normalize_key_name(column.name)
    if key in ("country", "name") and "Official name" in facts:
        return "Official name"
    if key == "city":
        return "_name" if "_name" in facts else None
    for attr in facts:
        if normalize_key_name(attr) == key:
            return attr
    if key.endswith("code"):  # `Currency Code` ← the code in `Currency: Peso (ARS)`
        for attr, raw in facts.items():
            if normalize_key_name(attr) == key[:-4] and _CODE.search(raw):
                return attr
    return None


def read_column(column: Column, facts: dict[str, str]) -> str:
    """The value of `column` on an entity page's facts ("" when the page does not say)."""
    attr = column_fact(column, facts)
    value = facts[attr] if attr is not None else ""
    code = _CODE.search(value)
    if attr is not None and code and normalize_key_name(attr) == normalize_key_name(column.name)[:-4]:
        value = code.group(1)
    value = clean_cell(value)
    return plain_number(value) if column.numeric else value


_RANKED_Q = re.compile(r"which country or territory of (?P<continent>.+?) ranks (?P<rank>\d+) by population", re.I)
_CITY_Q = re.compile(r'the city "(?P<name>[^"]+)" in (?P<country>[^.?\n]+)')
_QUOTED = re.compile(r'"(?P<name>[^"]+)"')


def parse_question(text: str) -> Question | None:
    """Read a sub-question written by the simulated manager (templates below)."""
    if found := _RANKED_Q.search(text):
        return Question(kind="ranked", continent=found.group("continent").strip(), rank=int(found.group("rank")))
    if found := _CITY_Q.search(text):
        return Question(kind="city", name=found.group("name"), country=found.group("country").strip())
    if found := _QUOTED.search(text):
        return Question(kind="country", name=found.group("name"))
    return None


@dataclass(frozen=True, kw_only=True)
class Batching:
    """How the manager groups the rows of its task matrix into sub-agent batches."""

    strategy: Literal["per_atom", "by_attr"] = "per_atom"
    rows: int | None = 1
    """Rows per batch: per_atom's `batch_size`, by_attr's `max_group_size` (None: whole groups)."""
    rationale: str = ""


def plan_cap(texts: Sequence[str]) -> int | None:
    """The batch cap the manager's instructions state ("Keep the plan under N batches"), or None."""
    for text in texts:
        if found := _PLAN_CAP.search(text):
            return int(found.group("n"))
    return None


def _batches(matrix: Sequence[Sequence[str]], batching: Batching) -> int:
    """How many batches `batching` makes of `matrix` (as `mapreduce.batching` plans them)."""
    if batching.strategy == "per_atom":
        return -(-len(matrix) // max(1, batching.rows or 1))
    groups: dict[str, int] = {}
    for row in matrix:
        groups[row[0]] = groups.get(row[0], 0) + 1
    return sum(-(-n // batching.rows) if batching.rows else 1 for n in groups.values())


def _under_cap(matrix: Sequence[Sequence[str]], batching: Batching, cap: int | None) -> Batching:
    """`batching` with rows per batch raised just enough for the plan to stay within `cap`."""
    if cap is None or _batches(matrix, batching) <= cap:
        return batching
    if batching.strategy == "by_attr" and len({row[0] for row in matrix}) > cap:
        # more groups than the cap allows batches: no group size helps, so chunk in matrix order
        batching = Batching(rows=batching.rows or 1, rationale=batching.rationale)
    rows = max(1, batching.rows or 1)
    while _batches(matrix, Batching(strategy=batching.strategy, rows=rows)) > cap:
        rows += 1
    return Batching(strategy=batching.strategy, rows=rows,
                    rationale=f"{batching.rationale}; {rows} rows per batch keep the plan under {cap} batches")


def default_batching(matrix: Sequence[Sequence[str]], cap: int | None) -> Batching:
    """The fixed default: one row per sub-agent (only as many more as the plan cap requires)."""
    one = Batching(rationale="independent look-ups, one atlas page per entity: one row per sub-agent")
    return _under_cap(matrix, one, cap)


def explore_batching(query: str, sample: int, matrix: Sequence[Sequence[str]], cap: int | None) -> Batching:
    """Exploration for sample >= 1: one batching of the fixed grid, by a seeded hash of (query, sample).

    It stands for another sample of an LLM at temperature > 0: another trial of the same
    question tries another batching, and the same trial always tries the same one.
    """
    options = [Batching(rows=k, rationale=f"exploring {k} rows per sub-agent batch") for k in EXPLORATION_SIZES]
    if matrix and len(matrix[0]) >= 2:
        options.append(Batching(strategy="by_attr", rows=None,
                                rationale="exploring one sub-agent per value of the first matrix column"))
    digest = hashlib.sha256(f"{query}|{sample}".encode()).digest()
    return _under_cap(matrix, options[int.from_bytes(digest[:8], "big") % len(options)], cap)


def advised_batching(advice: Mapping[str, Any] | None, draft: dict[str, Any],
                     cap: int | None) -> tuple[Batching | None, bool]:
    """What the plan stage's typed advice says for `draft`: (batching, accept). `accept` is True when
    its proposal Θ′ should be applied as proposed (`use_advice: true`; within `cap`); otherwise the
    batching of the first hint payload that applies to the draft, or (None, False)."""
    if not advice:
        return None, False
    matrix = draft["task_matrix"]
    proposal = advice.get("proposal")
    if isinstance(proposal, Mapping) and proposal.get("strategy") in ("per_atom", "by_attr"):
        proposed = Batching(strategy=proposal["strategy"], rows=proposal.get("batch_size"))
        if cap is None or _batches(matrix, proposed) <= cap:
            return None, True
    for hint in advice.get("hints") or []:
        payload = hint.get("advice") or {}
        if hint.get("applies") and payload.get("strategy") in ("per_atom", "by_attr"):
            grouped = payload["strategy"] == "by_attr" and len(matrix[0]) >= 2
            chosen = Batching(strategy="by_attr" if grouped else "per_atom", rows=payload.get("batch_size") or 1,
                              rationale=f"following the typed advice of hint {hint.get('id')}")
            return _under_cap(matrix, chosen, cap), False
    return None, False


def with_batching(draft: dict[str, Any], batching: Batching) -> dict[str, Any]:
    """The `mapreduce` arguments: the draft (matrix, template, schema) with `batching` applied."""
    out = {k: v for k, v in draft.items() if k not in ("batch_strategy", "batch_size")}
    if batching.strategy == "by_attr":
        strategy: dict[str, Any] = {"type": "by_attr", "attribute_index": 0, "rationale": batching.rationale}
        if batching.rows:
            strategy["max_group_size"] = batching.rows
        return {**out, "batch_strategy": strategy}
    return {**out, "batch_strategy": {"type": "per_atom", "rationale": batching.rationale},
            "batch_size": batching.rows or 1}


@dataclass(frozen=True, kw_only=True)
class Intent:
    """A recognised sandbox question."""

    kind: Literal["members", "ranked", "top_cities"]
    columns: tuple[str, ...]
    scopes: tuple[str, ...]
    """Continents (`members`, `ranked`) or countries (`top_cities`)."""
    k: int = 0
    euro: bool = False
    """`members` of the euro list, restricted to the continent in `scopes`."""

    def list_needs(self) -> list[PageNeed]:
        """The list pages that name the entities."""
        if self.euro:
            title = "Countries and territories using the euro"
            return [_need(title, title.lower())]
        if self.kind == "top_cities":
            return [_need(f"Large cities of {c}", f"large cities of {c}") for c in self.scopes]
        return [_need(f"Countries of {c}", f"countries of {c} list") for c in self.scopes]

    def describe(self, names: Sequence[str]) -> str:
        """`capital, population and area (km2)` for a template."""
        low = [n.lower() for n in names]
        return low[0] if len(low) == 1 else ", ".join(low[:-1]) + " and " + low[-1]

    def draft(self, pages: Sequence[str], obs: Observations) -> dict[str, Any] | list[ToolCall]:
        """Matrix, template and schema of the decision (no batching yet), or the crawls still needed."""
        cols = list(self.columns)
        schema = {"type": "object", "properties": {c.name: {"type": "string", "description": c.description} for c in column_specs(cols)}}
        if self.kind == "ranked":
            matrix = [[c, str(r)] for c in self.scopes for r in range(1, self.k + 1)]
            template = "In the Sandbox Atlas, which country or territory of __0__ ranks __1__ by population (1 = most populous)? Give its " + self.describe(cols[2:]) + "."
            return {"task_matrix": matrix, "template": template, "json_schema": schema}
        entries = [e for page in pages for e in list_entries(page)]
        if self.kind == "top_cities":
            todo = [tool_call("crawl_page", url=e.url) for e in entries if e.url not in obs.pages]
            if todo:
                return todo
            matrix = []
            for country, page in zip(self.scopes, pages, strict=True):
                sized = [(int(plain_number(infobox(obs.pages[e.url]).get("Population", "0"))), e.name) for e in list_entries(page)]
                matrix += [[country, name] for _pop, name in sorted(sized, key=lambda p: (-p[0], p[1]))[: self.k]]
            template = 'In the Sandbox Atlas, find the ' + self.describe(cols[2:]) + ' of the city "__1__" in __0__.'
            return {"task_matrix": matrix, "template": template, "json_schema": schema}
        if self.euro:
            entries = [e for e in entries if e.cells and e.cells[0] == self.scopes[0]]
        matrix = [[e.name] for e in entries]
        template = 'In the Sandbox Atlas, find the ' + self.describe(cols[1:]) + ' of the country or territory "__0__".'
        return {"task_matrix": matrix, "template": template, "json_schema": schema}

    def questions(self, decision: dict[str, Any]) -> list[Question]:
        """The atomic look-ups of a decision, for an agent that does them itself (the baseline)."""
        out = []
        for row in decision["task_matrix"]:
            q = parse_question(decision["template"].replace("__0__", row[0]).replace("__1__", row[-1]))
            if q is not None:
                out.append(q)
        return out


def query_columns(query: str) -> tuple[str, ...] | None:
    """The columns a WideSearch-style query asks for (its "with the following columns:" line), or
    None when it names none."""
    cols_line = re.search(r"with the following columns:\s*\n(?P<cols>[^\n]+)", query)
    if cols_line is None:
        return None
    return tuple(c.strip() for c in cols_line.group("cols").split(",") if c.strip())


def parse_intent(query: str) -> Intent | None:
    """Recognise a sandbox question (None: the simulated model cannot plan it)."""
    columns = query_columns(query)
    if columns is None:
        return None
    if found := re.search(r"every country and territory of (?P<c>[A-Z][\w ]+?) in the Sandbox Atlas", query):
        return Intent(kind="members", columns=columns, scopes=(found.group("c"),))
    if found := re.search(r"in (?P<c>[A-Z][\w ]+?) use the euro", query):
        return Intent(kind="members", columns=columns, scopes=(found.group("c"),), euro=True)
    if found := re.search(r"For each continent \((?P<list>[^)]+)\), find the (?P<k>\w+) most populous", query):
        scopes = tuple(s.strip() for s in found.group("list").split(","))
        return Intent(kind="ranked", columns=columns, scopes=scopes, k=_NUMBERS.get(found.group("k").lower(), 0))
    if found := re.search(r"For each of these countries: (?P<list>.+?), find the (?P<k>\w+) most populous cities", query):
        scopes = tuple(s.strip() for s in found.group("list").split(","))
        return Intent(kind="top_cities", columns=columns, scopes=scopes, k=_NUMBERS.get(found.group("k").lower(), 0))
    return None

